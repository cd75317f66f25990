"""Locust load test: each user is one agent program at a time, closed loop.

    locust -f loadtest/locustfile.py --headless -u 64 -r 8 -t 2m --host http://127.0.0.1:30000 \
        [--profile openhands] [--time-scale 20] [--max-tokens-cap 256] [--workload-seed 0]

A user takes the next program of ``--profile`` (locust's own free-text ``--profile`` option is
read as the workload name; default ``mini-swe-agent``) from ``thunder_sgl.benchmark.workloads.profile``,
sends its growing conversation with ``program_id`` in the body and the ``X-Program-Id`` /
``X-SMG-Routing-Key`` headers (so it works against the thunder router and a stock
``sglang_router``), sleeps each step's tool time divided by ``--time-scale``, then releases the
program (a 404/405 from a stock router counts as success). A failed LLM call is retried (3
times, backoff) and then the program is abandoned and released. Programs running when the test
stops are released too.

Statistics besides the HTTP rows (``llm first``: a program's first call; ``llm next``: the
others; ``release``):
- ``AGENT step``: one per completed step (LLM call + tool), counted when its tool wait ends;
  its response time is the step's wall time, its RPS × 60 the wall steps/min.
- ``AGENT program``: one per completed program, response time = its wall duration.
- ``TOOL <name>``: each tool wait (wall ms).
- ``KV hit%``: one per LLM call, "response time" = 100 · cached / prompt tokens of that call.
- A report — steps/min in *simulated* minutes (wall × time scale) and the token-weighted KV hit
  rate Σcached/Σprompt — logged every ``--report-interval`` seconds and at test stop, and written
  to ``<csv prefix>_thunder.csv`` when ``--csv`` is given. It works headless. In distributed
  mode each worker reports its own share (no aggregation on the master).
"""

from __future__ import annotations

import csv
import logging
import sys
import time

import gevent
from locust import FastHttpUser, constant, events, task
from locust.contrib.fasthttp import FastHttpSession

from thunder_sgl.benchmark.measures.stats import ProgramRecord, StepRecord, WorkloadResult
from thunder_sgl.benchmark.workloads.conversation import (
    Conversation,
    parse_response,
    release_path,
    release_unsupported,
    system_prompt,
)
from thunder_sgl.benchmark.workloads.profile import (
    ProgramSource,
    ProgramSpec,
    WorkloadProfile,
    load_profile,
)
from thunder_sgl.errors import ConfigError

DEFAULT_PROFILE = "mini-swe-agent"
MAX_RETRIES = 3
log = logging.getLogger("thunder_sgl.loadtest")


@events.init_command_line_parser.add_listener
def _add_options(parser) -> None:
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="Backend clock speed vs real time: tool waits are divided by it, steps/min multiplied.",
    )
    parser.add_argument(
        "--max-tokens-cap",
        type=int,
        default=0,
        help="Cap on max_tokens per call (0: the profile's output tokens).",
    )
    parser.add_argument(
        "--workload-seed", type=int, default=0, help="Seed of the program sequence."
    )
    parser.add_argument(
        "--model",
        type=str,
        default=None,
        help="Model name sent in requests (default: the first of GET /v1/models, else 'default').",
    )
    parser.add_argument(
        "--report-interval",
        type=float,
        default=30.0,
        help="Seconds between steps/min and KV hit-rate reports (0: only at stop).",
    )


class AgentRun:
    """State of one locust process: the program source, the records and the report."""

    def __init__(self, environment, profile: WorkloadProfile) -> None:
        opts = environment.parsed_options
        self.environment = environment
        self.profile = profile
        self.time_scale = float(getattr(opts, "time_scale", 1.0))
        self.max_tokens_cap = getattr(opts, "max_tokens_cap", 0) or None
        self.model: str = getattr(opts, "model", None) or ""
        worker = getattr(environment.runner, "worker_index", 0) or 0
        # Workers of a distributed run get disjoint program sequences (and ids).
        self.source = ProgramSource(
            self.profile, getattr(opts, "workload_seed", 0) + 1_000_003 * worker
        )
        self.system_text = system_prompt(self.profile.name, self.profile.system_prompt_tokens)
        self.result = WorkloadResult(
            self.profile.name, getattr(opts, "num_users", 0) or 0, self.time_scale, 0.0
        )
        self.live: dict[str, ProgramRecord] = {}
        self.t0 = time.monotonic()
        self.reporter: gevent.Greenlet | None = None

    def now(self) -> float:
        return time.monotonic() - self.t0

    def detect_model(self, client) -> str:
        with client.get("/v1/models", name="models", catch_response=True) as resp:
            resp.success()  # informative only: a router without the route is not a failure
            try:
                return str(resp.json()["data"][0]["id"])
            except (ValueError, KeyError, IndexError, TypeError):
                return "default"

    def summary(self) -> dict:
        self.result.wall_s = self.now()
        return self.result.summary()

    def report(self, final: bool = False) -> None:
        s = self.summary()
        log.info(
            "thunder %s: %s steps/min (simulated, time scale %g) | KV hit rate %.1f%% | steps %d | programs completed %d failed %d",
            "final" if final else "report",
            f"{s['steps_per_min']:.1f}",
            self.time_scale,
            100 * s["kv_hit_rate"],
            s["steps_completed"],
            s["programs_completed"],
            s["programs_failed"],
        )

    def report_forever(self, interval: float) -> None:
        while True:
            gevent.sleep(interval)
            self.report()

    def release(self, client, rec: ProgramRecord) -> None:
        """Best-effort release; a router without program routes is remembered and skipped. A
        release cut short by the stop leaves the program in ``live`` for the stop handler."""
        if not self.result.release_supported:
            self.live.pop(rec.program_id, None)
            return
        with client.post(release_path(rec.program_id), name="release", catch_response=True) as resp:
            if release_unsupported(resp.status_code, resp.content or b""):
                self.result.release_supported = False
                resp.success()
            elif resp.status_code < 300 or resp.status_code == 404:
                rec.released = resp.status_code < 300
                resp.success()
            else:
                resp.failure(f"release answered {resp.status_code}")
        self.live.pop(rec.program_id, None)


def fire(environment, kind: str, name: str, ms: float, length: int = 0) -> None:
    environment.events.request.fire(
        request_type=kind,
        name=name,
        response_time=ms,
        response_length=length,
        exception=None,
        context={},
    )


@events.init.add_listener
def _on_init(environment, **_kw) -> None:
    name = getattr(environment.parsed_options, "profile", None) or DEFAULT_PROFILE
    try:
        environment.agent_profile = load_profile(name)
    except ConfigError as e:
        logging.error("--profile: %s", e)
        sys.exit(1)


@events.test_start.add_listener
def _on_test_start(environment, **_kw) -> None:
    run = AgentRun(environment, environment.agent_profile)
    environment.agent_run = run
    interval = (
        getattr(environment.parsed_options, "report_interval", 0)
        if environment.parsed_options
        else 0
    )
    if interval and interval > 0:
        run.reporter = gevent.spawn(run.report_forever, interval)


@events.test_stop.add_listener
def _on_test_stop(environment, **_kw) -> None:
    run: AgentRun | None = getattr(environment, "agent_run", None)
    if run is None:
        return
    if run.reporter is not None:
        run.reporter.kill(block=False)
    if run.live and environment.host:
        client = FastHttpSession(environment.host, environment.events.request, user=None)
        for rec in list(run.live.values()):
            run.release(client, rec)
    run.report(final=True)
    prefix = getattr(environment.parsed_options, "csv_prefix", None)
    if prefix:
        s = run.summary()
        with open(f"{prefix}_thunder.csv", "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["metric", "value"])
            for key, value in s.items():
                w.writerow([key, value])


class AgentProgramUser(FastHttpUser):
    """One agent program at a time: LLM call, tool wait, repeat; then release; then the next."""

    wait_time = constant(0)
    network_timeout = 1800.0
    """A paused program's request is held by the thunder router: allow long waits."""

    def on_start(self) -> None:
        self.agent: AgentRun = self.environment.agent_run
        self.current: ProgramRecord | None = None
        if not self.agent.model:
            self.agent.model = self.agent.detect_model(self.client)

    def on_stop(self) -> None:
        if self.current is not None and self.current.outcome == "running":
            self.current.outcome = "cancelled"
            self.current.end_s = self.agent.now()
            self.agent.release(self.client, self.current)
        self.current = None

    @task
    def program(self) -> None:
        run = self.agent
        spec = run.source.next()
        assert spec is not None  # the source has no limit
        rec = ProgramRecord(spec.program_id, spec.index, len(spec.steps), run.now())
        run.result.programs.append(rec)
        run.live[spec.program_id] = rec
        self.current = rec
        conv = Conversation(
            spec, run.system_text, model=run.model, max_tokens_cap=run.max_tokens_cap
        )
        for i, step in enumerate(spec.steps):
            t_step = time.perf_counter()
            call = self._call(conv, spec, i)
            if call is None:
                rec.outcome = "failed"
                break
            conv.add_reply(i, call[1])
            t_tool = time.perf_counter()
            gevent.sleep(step.tool_seconds / run.time_scale)
            now = time.perf_counter()
            call[0].tool_end_s = run.now()
            rec.steps_done += 1
            fire(self.environment, "TOOL", step.tool, 1000 * (now - t_tool))
            fire(self.environment, "AGENT", "step", 1000 * (now - t_step))
        else:
            rec.outcome = "completed"
        rec.end_s = run.now()
        if rec.outcome == "completed":
            fire(self.environment, "AGENT", "program", 1000 * (rec.end_s - rec.start_s))
        run.release(self.client, rec)
        self.current = None
        if rec.outcome == "failed":
            gevent.sleep(1.0)  # a backend that rejects every program must not see a hot loop

    def _call(self, conv: Conversation, spec: ProgramSpec, i: int) -> tuple[StepRecord, str] | None:
        run = self.agent
        name = "llm first" if i == 0 else "llm next"
        for attempt in range(MAX_RETRIES + 1):
            srec = StepRecord(spec.program_id, i, attempt, run.now(), 0.0, tool=spec.steps[i].tool)
            reply = None
            with self.client.post(
                conv.path, json=conv.body(i), headers=conv.headers(), name=name, catch_response=True
            ) as resp:
                srec.status = resp.status_code
                if resp.status_code == 200:
                    try:
                        reply, usage = parse_response(resp.json(), conv.api)
                        srec.prompt_tokens, srec.completion_tokens = (
                            usage.prompt_tokens,
                            usage.completion_tokens,
                        )
                        srec.cached_tokens = usage.cached_tokens
                    except ValueError as e:
                        srec.error = "bad_response"
                        resp.failure(str(e))
                else:
                    srec.error = f"http_{resp.status_code}" if resp.status_code else "connection"
                    resp.failure(srec.error)
            srec.end_s = run.now()
            run.result.steps.append(srec)
            if reply is not None:
                if srec.prompt_tokens:
                    fire(
                        self.environment,
                        "KV",
                        "hit%",
                        100.0 * srec.cached_tokens / srec.prompt_tokens,
                        srec.cached_tokens,
                    )
                return srec, reply
            run.result.errors[srec.error or "unknown"] += 1
            if 400 <= srec.status < 500 and srec.status not in (408, 429):
                return None
            if attempt < MAX_RETRIES:
                gevent.sleep(min(0.5 * 2**attempt, 30.0))
        return None
