"""Discrete-event (DES) benchmark: agent programs, a router and simulated workers in one virtual time.

``run_des`` runs ``programs`` agent programs at once in a closed loop, as the HTTP driver does,
but in process: each program sends its growing conversation as token ids (``tokens``),
waits for the answer, waits its tool time, and repeats; a finished program is released and
replaced by the next program of ``(profile, seed)``. Everything shares one virtual clock: a
heap of agent events, the workers' own event times (``SimWorker.next_event_time``, a heap with
lazy invalidation as in ``bench/sim_cost.py``), and the router's timers — thunder's ticks and
monitor polls (``route.ThunderRouter``), smg's load polls and the stock trees' eviction
(``route.StockRouter``). At one instant, worker events go first, then router timers, then
agents.

The thunder policies run through ``controller.Controller``, the request path of the product:
the DES measures the policy the gateway runs. Routing adds no latency (the gateway's own
overhead is measured by the overhead benchmark, not here); held requests wait in virtual time.
A request the engine cannot take (prompt + output beyond the context or the KV pool) ends its
program, as an agent stops on context overflow (``errors["context_overflow"]``). A program the
profile cuts at the model's context (``ProgramSpec.overflow_output``) sends that call as a real
agent does, after its last step's tool: through the router, which admits it like any request,
to the engine, which refuses it; the router sees the refusal (for ``thunder-inferred``, the
end hint the gateway reads in SGLang's 400, ``conversations`` rule 7) and the program ends. A
kept step that the DES's own token counts push past the window or the pool ends its program
before it is sent, as before. A held request
that times out is retried after ``Retry-After``, as the HTTP driver does, up to three times.

Measures: ``measure`` (the HTTP driver's definitions). ``DesRun`` exposes the final state
(agents, router, workers, counters) for conservation checks; ``run_des`` returns the
``RunResult``.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from typing import Any

from thunder_sgl.benchmark.des.baselines import BASELINES, make_baseline
from thunder_sgl.benchmark.des.measure import Recorder
from thunder_sgl.benchmark.des.route import Dispatch, Refused, StockRouter, ThunderRouter
from thunder_sgl.benchmark.des.tokens import ProgramTokens, TokenLayout
from thunder_sgl.benchmark.measures.derived import window_check
from thunder_sgl.benchmark.measures.ideal import ideal_steps_per_min
from thunder_sgl.benchmark.reports.results import ALL_ROUTERS, THUNDER_INFERRED, RunResult
from thunder_sgl.benchmark.workloads.profile import (
    ProgramSource,
    ProgramSpec,
    WorkloadProfile,
    load_profile,
)
from thunder_sgl.config import RouterConfig
from thunder_sgl.scheduler.goodput import summarize as summarize_admission
from thunder_sgl.sim import (
    Completion,
    SimConfig,
    SimRequest,
    SimRequestError,
    SimWorker,
    load_sim_config,
)

MAX_RETRIES = 3
"""Retries of a refused or failed request before the program is abandoned (driver default)."""
PROGRESS_EVERY_S = 5.0
"""Simulated seconds between ``progress`` calls."""
TOOL_END, RETRY = 0, 1


class Agent:
    """One running program."""

    __slots__ = ("pid", "spec", "tokens", "start", "ticket", "worker", "sent", "computed", "attempt", "rid")

    def __init__(self, spec: ProgramSpec, tokens: ProgramTokens, now: float) -> None:
        self.pid = spec.program_id
        self.spec = spec
        self.tokens = tokens
        self.start = now
        self.ticket: Any = None
        """The router's handle of the request in flight or held (None between requests)."""
        self.worker: int | None = None
        """Worker running the request now (None: not submitted)."""
        self.sent = 0.0
        self.computed = 0
        """Tokens of this program computed by earlier requests (recompute accounting)."""
        self.attempt = 0
        self.rid: str | None = None

    @property
    def step(self) -> int:
        return self.tokens.step


class DesRun:
    """One run; ``run()`` returns the RunResult, the object keeps the final state."""

    def __init__(self, cluster: str | SimConfig, nodes: int, router: str, profile: str | WorkloadProfile,
                 programs: int, duration_s: float, warmup_s: float = 0.0, seed: int = 0,
                 router_config: RouterConfig | None = None, sample_every_s: float = 5.0,
                 progress: Callable[[float, dict[str, Any]], None] | None = None,
                 warm_start: bool = False) -> None:
        if router not in ALL_ROUTERS:
            raise ValueError(f"unknown router {router!r}; valid: {', '.join(ALL_ROUTERS)}")
        if nodes < 1 or programs < 1 or duration_s <= 0 or warmup_s < 0 or sample_every_s <= 0:
            raise ValueError("need nodes >= 1, programs >= 1, duration_s > 0, warmup_s >= 0, sample_every_s > 0")
        self.cfg = load_sim_config(cluster) if isinstance(cluster, str) else cluster
        self.profile = load_profile(profile) if isinstance(profile, str) else profile
        self.router_name, self.nodes, self.programs, self.seed = router, nodes, programs, seed
        self.sample_every_s, self.progress = sample_every_s, progress
        self.rec = Recorder(warmup_s, warmup_s + duration_s)
        self.workers = [SimWorker(self.cfg, i) for i in range(nodes)]
        self.layout = TokenLayout(self.profile, seed, self.cfg.model.text_tokens_per_nominal,
                                  self.cfg.model.reply_tokens_per_output)
        self.source = ProgramSource(self.profile, seed, warm=programs if warm_start else 0)
        self.warm_start = warm_start
        self.agents: dict[str, Agent] = {}
        self.by_rid: dict[str, Agent] = {}
        self.events: list[tuple[float, int, int, Agent | None]] = []
        self._seq = 0
        self._wheap: list[tuple[float, int]] = []
        self._queued: list[float | None] = [None] * nodes
        self.now = 0.0
        self.counts = {"started": 0, "completed": 0, "failed": 0, "requests": 0, "answered": 0, "refused": 0,
                       "overflow": 0}
        self.window_steps = 0
        self.finished = False
        """Set by a driver whose workload is done (``rollout.des``): the run stops there."""
        self.prompt_total = self.cached_total = 0
        self._warm: dict[str, float] | None = None
        """Engine counters summed over workers when the window opened."""
        if router in BASELINES:
            self.router: ThunderRouter | StockRouter = StockRouter(self.workers, self.read, make_baseline(router, nodes))
        else:
            inferred = router == THUNDER_INFERRED
            self.router = ThunderRouter(self.workers, self.read, router_config or RouterConfig(),
                                        "thunder" if inferred else router, self.profile.system_prompt_tokens,
                                        f"{self.profile.name}:system", inferred=inferred)

    # ---- workers ------------------------------------------------------------------------
    def _requeue(self, i: int) -> None:
        nxt = self.workers[i].next_event_time()
        if nxt is not None and nxt != self._queued[i]:
            heapq.heappush(self._wheap, (nxt, i))
        self._queued[i] = nxt

    def read(self, i: int, now: float) -> SimWorker:
        """Worker i with its reports brought up to ``now`` (its events up to now are done)."""
        w = self.workers[i]
        for c in w.advance(now):  # pragma: no cover - events due by now were processed first
            self._completed(c, now)
        self._requeue(i)
        return w

    def _submit(self, d: Dispatch, now: float) -> None:
        a: Agent = d.agent
        out = a.spec.output_tokens_at(a.step)
        if a.step == len(a.spec.steps):  # the call the model's window cannot hold: the engine refuses it
            out = max(out, self.cfg.model.context_length - a.tokens.prompt_tokens + 1)
        a.rid = f"{a.pid}:{a.step}:{a.attempt}"
        try:
            self.workers[d.worker].submit(SimRequest(a.rid, a.tokens.prompt, out, dp_rank=d.dp_rank,
                                                     routing_key=a.pid, session_id=d.session_id), now)
        except SimRequestError:
            self.router.complete(a, None, now, overflow=True)
            self.counts["overflow"] += 1
            self.rec.errors["context_overflow"] += 1
            self._end_program(a, now, "completed")
            return
        a.worker = d.worker
        self.by_rid[a.rid] = a
        self._requeue(d.worker)
        if a.ticket is not None and getattr(a.ticket, "dispatched_at", None) is not None:
            held = a.ticket.dispatched_at - a.ticket.created
            if held > 0:
                self.rec.held.append((now, held))

    # ---- agents -------------------------------------------------------------------------
    def _push(self, t: float, kind: int, a: Agent | None) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, self._seq, kind, a))

    def _start_program(self, now: float) -> None:
        spec = self.source.next()
        if spec is None:  # pragma: no cover - the source is unbounded
            return
        a = Agent(spec, self.layout.program(spec), now)
        self.agents[a.pid] = a
        self.counts["started"] += 1
        if spec.start_wait_s > 0:
            self._push(now + spec.start_wait_s, RETRY, a)  # a warm start: mid-tool (RETRY issues)
        else:
            self._issue(a, now)

    def _issue(self, a: Agent, now: float) -> None:
        n = a.tokens.prompt_tokens
        if a.step < len(a.spec.steps) and (n + a.spec.steps[a.step].output_tokens > self.cfg.model.context_length
                                           or n >= self.cfg.server.max_total_num_tokens):
            self.rec.errors["context_overflow"] += 1
            self._end_program(a, now, "completed")
            return
        a.sent = now
        self.counts["requests"] += 1
        try:
            out = self.router.send(a, n, now)
        except Refused as e:
            self._refused(a, e.kind, now, e.retry_after)
            return
        self._dispatch(out, now)

    def _dispatch(self, out: list[Dispatch], now: float) -> None:
        for d in out:
            self._submit(d, now)

    def _refused(self, a: Agent, kind: str, now: float, retry_after: float) -> None:
        self.counts["refused"] += 1
        self.rec.errors[kind] += 1
        if a.attempt >= MAX_RETRIES:
            self._end_program(a, now, "failed")
            return
        a.attempt += 1
        self._push(now + retry_after, RETRY, a)

    def _completed(self, c: Completion, now: float) -> None:
        a = self.by_rid.pop(c.rid)
        a.worker = None
        self._dispatch(self.router.complete(a, c, now), now)
        if c.error is not None or c.finish_reason == "abort":
            self._refused(a, "request_failed", now, 0.5 * 2**a.attempt)
            return
        self.counts["answered"] += 1
        recompute = max(0, min(a.computed, c.prompt_tokens) - c.cached_tokens)
        self.rec.calls.append((c.time, a.sent, c.prompt_tokens, c.cached_tokens, c.completion_tokens, recompute))
        self.prompt_total += c.prompt_tokens
        self.cached_total += c.cached_tokens
        a.computed = c.prompt_tokens + max(0, c.completion_tokens - 1)
        tool = a.spec.steps[a.step].tool_seconds
        a.attempt = 0
        a.tokens.add_reply(c.output_ids)
        self._push(c.time + tool, TOOL_END, a)

    def _tool_end(self, a: Agent, now: float) -> None:
        self.rec.tool_ends.append(now)
        if now >= self.rec.warmup_s:
            self.window_steps += 1
        if a.step < len(a.spec.steps) or a.spec.overflow_output:  # the last: a call the engine refuses
            self._issue(a, now)
        else:
            self._end_program(a, now, "completed")

    def _end_program(self, a: Agent, now: float, outcome: str) -> None:
        self.rec.programs.append((a.start, now, outcome))
        self.counts[outcome] += 1
        del self.agents[a.pid]
        self.router.release(a, now)
        self._start_program(now)

    # ---- the loop -----------------------------------------------------------------------
    def _begin(self, now: float) -> None:
        """The start of the run: ``programs`` programs at once (closed loop)."""
        for _ in range(self.programs):
            self._start_program(now)

    def _event(self, kind: int, a: Any, now: float) -> None:
        """An event of the agents' heap (drivers add kinds of their own)."""
        if kind == TOOL_END:
            self._tool_end(a, now)
        elif a.pid in self.agents:
            self._issue(a, now)

    def run(self) -> RunResult:
        wall0 = time.perf_counter()
        end = self.rec.end_s
        self._begin(0.0)
        next_sample, next_progress = 0.0, 0.0
        router, wheap, events = self.router, self._wheap, self.events
        while True:
            tw = wheap[0][0] if wheap else math.inf
            te = events[0][0] if events else math.inf
            tr = max(router.next_time(), self.now)  # a tick due in the past runs now
            t = min(tw, te, tr, next_sample, next_progress)
            if t > end or self.finished:
                break
            self.now = t
            while wheap and wheap[0][0] <= t:
                tq, i = heapq.heappop(wheap)
                if self._queued[i] != tq:
                    continue
                self._queued[i] = None
                for c in self.workers[i].advance(t):
                    self._completed(c, t)
                self._requeue(i)
            if tr <= t:
                expired: list[Agent] = []
                self._dispatch(router.run_timers(t, expired), t)
                for a in expired:
                    self._refused(a, "held_timeout", t, router_retry_after(router))
            while events and events[0][0] <= t:
                _, _, kind, ev = heapq.heappop(events)
                self._event(kind, ev, t)
            router.after(t)
            if self._warm is None and t >= self.rec.warmup_s:
                self._warm = self._engine_totals(t)
            if next_sample <= t:
                self._sample(t)
                next_sample = t + self.sample_every_s
            if next_progress <= t:
                if self.progress is not None:
                    self.progress(t, self.snapshot())
                next_progress = t + PROGRESS_EVERY_S
        self.now = min(end, self.now) if self.finished else end
        self.wall_s = time.perf_counter() - wall0
        result = self.result()
        self.final_ledger = self.ledger()
        self.drain()
        return result

    def _engine_totals(self, t: float) -> dict[str, float]:
        tot = {"t": t, "busy": 0.0, "retractions": 0.0, "prefill": 0.0, "evicted": 0.0, "load_back": 0.0,
               "decode_steps": 0.0, "generated": 0.0, "prefill_busy": 0.0, "cached_device": 0.0,
               "cached_host": 0.0, "cached_storage": 0.0, "loaded_tokens": 0.0}
        for i in range(self.nodes):
            w = self.read(i, t)
            c = w.counters
            tot["cached_device"] += c.cached_device
            tot["cached_host"] += c.cached_host
            tot["cached_storage"] += c.cached_storage
            tot["loaded_tokens"] += sum(e.cache.counters.loaded_from_host + e.cache.counters.loaded_from_storage
                                        for e in w.engines)
            tot["busy"] += c.busy_seconds
            tot["prefill_busy"] += c.prefill_busy_seconds
            tot["load_back"] += c.load_back_seconds
            tot["decode_steps"] += c.decode_steps
            tot["generated"] += c.generation_tokens
            tot["retractions"] += c.retractions
            tot["prefill"] += c.prefill_tokens
            tot["evicted"] += w.evicted_tokens
        return tot

    def where_time_goes(self) -> dict[str, float]:
        """Engine-side account of the window: GPU busy fraction, retractions, tokens prefilled
        and evicted from HBM per step, HiCache load-back seconds per step, and the mean decode
        batch (tokens generated per decode iteration) (call before ``drain``)."""
        if self._warm is None:
            return {}
        end = self._engine_totals(self.now)
        w = self._warm
        ranks = self.nodes * self.cfg.server.dp_size
        span = max(1e-9, end["t"] - w["t"])
        steps = max(1, self.window_steps)
        return {
            "gpu_busy": (end["busy"] - w["busy"]) / (ranks * span),
            "prefill_busy": (end["prefill_busy"] - w["prefill_busy"]) / (ranks * span),
            "retractions": end["retractions"] - w["retractions"],
            "prefill_per_step": (end["prefill"] - w["prefill"]) / steps,
            "evicted_per_step": (end["evicted"] - w["evicted"]) / steps,
            "load_back_s_per_step": (end["load_back"] - w["load_back"]) / steps,
            "decode_batch": (end["generated"] - w["generated"]) / max(1.0, end["decode_steps"] - w["decode_steps"]),
        }

    def _tier_delta(self) -> dict[str, int]:
        """With HiCache, the split of the window's cache hits by tier and the tokens loaded back,
        from the engines' counters (as HTTP and real mode read them from ``/metrics``)."""
        if self._warm is None or not self.cfg.hicache.enabled:
            return {}
        end, w = self._engine_totals(self.now), self._warm
        return {"cached_device_tokens": int(end["cached_device"] - w["cached_device"]),
                "cached_host_tokens": int(end["cached_host"] - w["cached_host"]),
                "cached_storage_tokens": int(end["cached_storage"] - w["cached_storage"]),
                "load_back_tokens": int(end["loaded_tokens"] - w["loaded_tokens"])}

    def _sample(self, t: float) -> None:
        used, usage = [], []
        for i in range(self.nodes):
            st = self.read(i, t).stats()
            cap = sum(s.max_total_num_tokens for s in st)
            used.append(sum(s.device_used_tokens for s in st) / cap)
            usage.append(sum(s.num_used_tokens for s in st) / cap)
        self.rec.memory.append((t, used))
        self.rec.usage.append((t, usage))

    def drain(self) -> None:
        """End of run: abort what runs, release every program (thunder: no ticket left held)."""
        for a in self.agents.values():
            if a.worker is not None and a.rid is not None:
                self.workers[a.worker].abort(a.rid, self.now)
                self.by_rid.pop(a.rid, None)
                a.worker = None
        self.router.drain(list(self.agents.values()), self.now)

    # ---- reports ------------------------------------------------------------------------
    def ledger(self) -> dict[str, int]:
        """Where every program and every request is (before ``drain``): ``programs`` started =
        ended + running; ``requests`` issued = answered + refused + overflowed + in flight + held."""
        held = self.router.held_count
        return {
            "programs": self.counts["started"],
            "programs_accounted": self.counts["completed"] + self.counts["failed"] + len(self.agents),
            "requests": self.counts["requests"],
            "requests_accounted": self.counts["answered"] + self.counts["refused"] + self.counts["overflow"]
            + len(self.by_rid) + held,
        }

    def snapshot(self) -> dict[str, Any]:
        """Live numbers for progress bars: counts since the start (``window_steps``: since the
        warm-up ended), token totals of every answered call, programs and requests now."""
        rec = self.rec
        t = self.now
        steps = self.window_steps
        mem = rec.memory[-1][1] if rec.memory else [0.0] * self.nodes
        return {
            "time": t, "phase": "warmup" if t < rec.warmup_s else "measure", "end": rec.end_s,
            "steps": len(rec.tool_ends), "window_steps": steps,
            "steps_per_min": 60.0 * steps / (t - rec.warmup_s) if t > rec.warmup_s else 0.0,
            "programs_started": self.counts["started"], "programs_completed": self.counts["completed"],
            "running": len(self.agents), "in_flight": len(self.by_rid), "held": self.router.held_count,
            "prompt_tokens": self.prompt_total, "cached_tokens": self.cached_total,
            "errors": sum(rec.errors.values()), "node_used": mem,
        }

    def result(self) -> RunResult:
        s = self.rec.summary()
        prof = self.profile
        notes = (f"kv_imbalance_mean={s['kv_imbalance_mean']:.3f} held_requests={s['held_requests']} "
                 f"started={self.counts['started']} ")
        where = self.where_time_goes()
        notes += " ".join(f"{k}={v:.3g}" for k, v in where.items())
        policy = getattr(self.router, "policy", None)
        if policy is not None and hasattr(policy, "decisions"):
            notes += " " + " ".join(f"{k}={v}" for k, v in policy.decisions.items())
        ctl = getattr(self.router, "ctl", None)
        if ctl is not None:
            adm = summarize_admission([b.admission.view() for b in ctl.backend_list() if b.admission is not None])
            if adm:
                notes += f" admission={adm}"
            if ctl.stats.dormant:
                notes += f" dormant={ctl.stats.dormant}"
        ended = sum(1 for _, e, o in self.rec.programs if o == "completed" and e < self.rec.warmup_s)
        before = sum(1 for t in self.rec.tool_ends if t < self.rec.warmup_s)
        check = window_check(int(s["steps_completed"]), self.programs, ended, warm_start=self.warm_start,
                             steps_before=before)
        tiers = self._tier_delta()
        return RunResult(
            **tiers,
            engine_busy=where.get("gpu_busy", 0.0),
            router=self.router_name, mode="des", programs=self.programs, nodes=self.nodes, cluster=self.cfg.name,
            profile=prof.name, seed=self.seed, window_s=self.rec.duration,
            steps_per_min=s["steps_per_min"], kv_hit_rate=s["kv_hit_rate"], prompt_tokens=int(s["prompt_tokens"]),
            cached_tokens=int(s["cached_tokens"]), completion_tokens=int(s["completion_tokens"]),
            recompute_tokens=int(s["recompute_tokens"]), node_imbalance_mean=s["node_imbalance_mean"],
            node_imbalance_max=s["node_imbalance_max"], program_completion_p50_s=s["program_completion_p50_s"],
            program_completion_p99_s=s["program_completion_p99_s"], step_latency_p50_s=s["step_latency_p50_s"],
            step_latency_p99_s=s["step_latency_p99_s"], held_wait_p50_s=s["held_wait_p50_s"],
            held_wait_p99_s=s["held_wait_p99_s"], held_wait_max_s=s["held_wait_max_s"],
            programs_completed=int(s["programs_completed"]), programs_failed=int(s["programs_failed"]),
            steps_completed=int(s["steps_completed"]),
            ideal_steps_per_min=ideal_steps_per_min(self.cfg, self.nodes, prof, self.programs),
            wall_s=self.wall_s, errors=dict(self.rec.errors), memory=list(self.rec.memory), notes=notes,
            window_check=check,
        )


def router_retry_after(router: ThunderRouter | StockRouter) -> float:
    cfg = getattr(router, "cfg", None)
    return cfg.gateway.retry_after_seconds if cfg is not None else 5.0


def run_des(
    cluster: str | SimConfig,
    nodes: int,
    router: str,
    profile: str | WorkloadProfile,
    programs: int,
    duration_s: float,
    warmup_s: float = 0.0,
    seed: int = 0,
    router_config: RouterConfig | None = None,
    sample_every_s: float = 5.0,
    progress: Callable[[float, dict[str, Any]], None] | None = None,
    warm_start: bool = False,
) -> RunResult:
    """Run ``programs`` concurrent programs of ``profile`` through ``router`` on ``nodes``
    simulated workers of ``cluster`` (a ``configs/sim`` name, or a SimConfig) for
    ``warmup_s + duration_s`` simulated seconds; measures cover the last ``duration_s``.
    ``router`` is one of ``reports.results.ALL_ROUTERS``. ``progress(sim_time, snapshot)`` is called every
    5 simulated seconds. ``warm_start``: the first programs start mid-life
    (``workloads.profile.warm_start``)."""
    return DesRun(cluster, nodes, router, profile, programs, duration_s, warmup_s, seed, router_config,
                  sample_every_s, progress, warm_start).run()
