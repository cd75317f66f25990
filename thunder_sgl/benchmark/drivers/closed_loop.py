"""Closed-loop async workload driver: N agent programs at once against any OpenAI endpoint.

Each of ``concurrency`` slots runs one program at a time: it sends the program's growing
conversation (``conversation.Conversation``), waits the step's tool time, repeats, releases the
program (``POST /programs/{id}/release``), and takes the next program from the shared
``ProgramSource``. Tool waits are ``tool_seconds / time_scale`` real seconds, so against a
simulator whose clock runs ``time_scale`` times faster than real time the programs keep the
profile's timing in simulated time.

Against a stock router the release route answers 404/405: the driver notes that once and stops
releasing. A failed LLM call (5xx, 429, connection error, timeout) is retried with exponential
backoff (``Retry-After`` honoured, capped) up to ``max_retries`` times; then the program is
abandoned (recorded as failed, released) and the slot moves on. Other 4xx are not retried.
At ``duration_s`` in-flight work is cancelled and every started program is released.

aiohttp sets TCP_NODELAY on every connection it opens; one session with a pool of
``concurrency`` connections serves the whole run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from thunder_sgl.benchmark.measures.stats import ProgramRecord, StepRecord, WorkloadResult
from thunder_sgl.benchmark.workloads.conversation import (
    Conversation,
    StreamAccumulator,
    parse_response,
    release_path,
    release_unsupported,
    system_prompt,
)
from thunder_sgl.benchmark.workloads.profile import (
    ProgramSource,
    ProgramSpec,
    StepSpec,
    WorkloadProfile,
    load_profile,
)

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
MAX_BACKOFF_S = 30.0


@dataclass(frozen=True)
class DriverOptions:
    """How to run a workload. Times given here are wall seconds, except that tool times come
    from the profile in workload seconds; the result's measures are in simulated seconds."""

    duration_s: float | None = None
    """Stop after this many wall seconds (in-flight work cancelled, programs released)."""
    total_programs: int | None = None
    """Stop once this many programs have ended. At least one of the two limits is required."""
    seed: int = 0
    """Names the program sequence (same seed, same programs as a DES would see)."""
    time_scale: float = 1.0
    """Speed of the backend's clock vs real time: tool waits are divided by it, measures
    multiplied by it (1 for a real cluster)."""
    warmup_s: float = 0.0
    """Wall seconds at the start excluded from the measures."""
    warm_start: bool = False
    """Start each slot's first program mid-life (``workloads.profile.warm_start``): the loop
    begins near its steady state instead of with every program at step 0."""
    api: str = "chat"
    """``chat`` (/v1/chat/completions) or ``completions`` (/v1/completions, a text transcript)."""
    stream: bool = False
    """Stream responses (usage taken from the final chunk via ``stream_options``)."""
    release: bool = True
    """Call ``POST /programs/{id}/release`` after each program."""
    send_program_ids: bool = True
    """False: requests carry no program id (neither body field nor headers) and programs are not
    released, as an unmodified agent sends them: the router infers the programs
    (``control.conversations``) and releases them by their idle timeout."""
    model: str | None = None
    """Model name to send; None: the first of ``GET /v1/models``, else ``default``."""
    headers: tuple[tuple[str, str], ...] = ()
    """Extra headers on every request."""
    api_key: str | None = None
    """Sent as ``Authorization: Bearer``."""
    max_tokens_cap: int | None = None
    """Upper bound on each call's ``max_tokens``."""
    ignore_eos: bool = True
    """Ask for exactly ``max_tokens`` output tokens (SGLang ``ignore_eos``)."""
    max_retries: int = 3
    """Retries of a failed LLM call before the program is abandoned."""
    retry_backoff_s: float = 0.5
    """First retry delay; doubles per retry (``Retry-After`` wins), capped at 30 s."""
    request_timeout_s: float = 1800.0
    """Limit of one LLM call (a paused program's request may be held long)."""
    on_event: Callable[[DriverEvent], None] | None = None
    """Called synchronously with progress events; must not raise."""
    tools: ToolRunner | None = None
    """Runs the tool calls (e.g. an exec in the program's sandbox); None: a sleep of the
    step's tool time. ``start`` is awaited before a program's first step."""

    def __post_init__(self) -> None:
        if self.duration_s is None and self.total_programs is None:
            raise ValueError("give duration_s or total_programs")
        if self.time_scale <= 0 or self.max_retries < 0 or self.warmup_s < 0:
            raise ValueError("need time_scale > 0, max_retries >= 0, warmup_s >= 0")


class ToolRunner(Protocol):
    """How a driven agent runs its tools. Failures are the runner's to count: a tool that
    fails must still return (the agent goes on, as agents do with a failing command)."""

    async def start(self, program_id: str) -> None: ...

    async def run(self, program_id: str, step: StepSpec, real_seconds: float) -> None: ...


@dataclass(frozen=True)
class DriverEvent:
    """A progress notice: ``program_start``, ``step`` (an LLM call ended, ok or not),
    ``tool_end`` (a step counted), ``program_end``."""

    kind: str
    program_id: str
    time_s: float
    """Wall seconds since the run started."""
    step: StepRecord | None = None
    program: ProgramRecord | None = None


class _Driver:
    def __init__(
        self, endpoint: str | list[str], profile: WorkloadProfile, concurrency: int, o: DriverOptions
    ) -> None:
        endpoints = [endpoint] if isinstance(endpoint, str) else list(endpoint)
        if not endpoints:
            raise ValueError("need at least one endpoint")
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.endpoint = self.endpoints[0]
        self.concurrency = concurrency
        self.o = o
        self.system_text = system_prompt(profile.name, profile.system_prompt_tokens)
        self.source = ProgramSource(profile, o.seed, o.total_programs, concurrency if o.warm_start else 0)
        self.result = WorkloadResult(profile.name, concurrency, o.time_scale, 0.0, o.warmup_s)
        self.live: dict[str, ProgramRecord] = {}
        """Programs started and not yet released."""
        self.model = o.model or ""
        self.headers = dict(o.headers)
        if o.api_key:
            self.headers["Authorization"] = f"Bearer {o.api_key}"
        self.t0 = 0.0

    def now(self) -> float:
        return asyncio.get_running_loop().time() - self.t0

    def emit(
        self,
        kind: str,
        pid: str,
        step: StepRecord | None = None,
        program: ProgramRecord | None = None,
    ) -> None:
        if self.o.on_event is not None:
            self.o.on_event(DriverEvent(kind, pid, self.now(), step, program))

    async def run(self) -> WorkloadResult:
        connector = aiohttp.TCPConnector(
            limit=self.concurrency + 8, limit_per_host=self.concurrency + 8
        )
        timeout = aiohttp.ClientTimeout(total=self.o.request_timeout_s, sock_connect=10)
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, headers=self.headers
        ) as self.http:
            if not self.model:
                self.model = await self._detect_model()
            self.t0 = asyncio.get_running_loop().time()
            slots = [
                asyncio.create_task(self._slot(self.endpoints[i % len(self.endpoints)]), name=f"slot-{i}")
                for i in range(self.concurrency)
            ]
            try:
                await asyncio.wait(
                    slots, timeout=self.o.duration_s, return_when=asyncio.FIRST_EXCEPTION
                )
            finally:
                for t in slots:
                    t.cancel()
                outcomes = await asyncio.gather(*slots, return_exceptions=True)
                self.result.wall_s = self.now()
                await asyncio.gather(*(self._release(rec) for rec in list(self.live.values())))
            for r in outcomes:
                if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError):
                    raise r
        return self.result

    async def _detect_model(self) -> str:
        try:
            async with self.http.get(
                f"{self.endpoint}/v1/models", timeout=aiohttp.ClientTimeout(total=10)
            ) as r:
                if r.status == 200:
                    data = (await r.json(content_type=None)).get("data") or []
                    if data and data[0].get("id"):
                        return str(data[0]["id"])
        except (TimeoutError, aiohttp.ClientError, ValueError, AttributeError):
            pass
        return "default"

    async def _slot(self, endpoint: str) -> None:
        failures = 0
        while (spec := self.source.next()) is not None:
            if await self._run_program(spec, endpoint) == "failed":
                # A backend that rejects every program must not turn the loop into a hot spin.
                failures += 1
                await asyncio.sleep(min(self.o.retry_backoff_s * 2**failures, MAX_BACKOFF_S))
            else:
                failures = 0

    async def _run_program(self, spec: ProgramSpec, endpoint: str) -> str:
        rec = ProgramRecord(spec.program_id, spec.index, len(spec.steps) - spec.start_step, self.now())
        rec.endpoint = endpoint
        self.result.programs.append(rec)
        self.live[spec.program_id] = rec
        self.emit("program_start", spec.program_id, program=rec)
        conv = Conversation(
            spec,
            self.system_text,
            model=self.model,
            api=self.o.api,
            stream=self.o.stream,
            max_tokens_cap=self.o.max_tokens_cap,
            ignore_eos=self.o.ignore_eos,
            send_id=self.o.send_program_ids,
        )
        try:
            if self.o.tools is not None:
                await self.o.tools.start(spec.program_id)
            if spec.start_wait_s > 0:
                await asyncio.sleep(spec.start_wait_s / self.o.time_scale)
            for i in range(spec.start_step, len(spec.steps)):
                step = spec.steps[i]
                call = await self._call(conv, i, endpoint)
                if call is None:
                    rec.outcome = "failed"
                    break
                srec, reply = call
                conv.add_reply(i, reply)
                if self.o.tools is not None:
                    await self.o.tools.run(spec.program_id, step, step.tool_seconds / self.o.time_scale)
                else:
                    await asyncio.sleep(step.tool_seconds / self.o.time_scale)
                srec.tool_end_s = self.now()
                rec.steps_done += 1
                self.emit("tool_end", spec.program_id, step=srec)
            else:
                rec.outcome = "completed"
        except asyncio.CancelledError:
            rec.outcome = "cancelled"
            raise
        finally:
            rec.end_s = self.now()
            self.emit("program_end", spec.program_id, program=rec)
        await self._release(rec)
        return rec.outcome

    async def _call(self, conv: Conversation, i: int, endpoint: str) -> tuple[StepRecord, str] | None:
        """One LLM call with retries: (record, reply), or None when the program is abandoned."""
        body = conv.body(i)
        url = endpoint + conv.path
        for attempt in range(self.o.max_retries + 1):
            srec = StepRecord(
                conv.program_id, i, attempt, self.now(), 0.0, tool=conv.spec.steps[i].tool
            )
            retry_after: float | None = None
            reply = ""
            try:
                async with self.http.post(url, json=body, headers=conv.headers()) as resp:
                    srec.status = resp.status
                    if resp.status == 200:
                        reply, usage = await self._read(resp, conv.api)
                        srec.prompt_tokens = usage.prompt_tokens
                        srec.completion_tokens = usage.completion_tokens
                        srec.cached_tokens = usage.cached_tokens
                    else:
                        srec.error = f"http_{resp.status}"
                        retry_after = retry_after_seconds(resp.headers.get("Retry-After"))
                        await resp.read()
            except TimeoutError:
                srec.error = "timeout"
            except aiohttp.ClientError:
                srec.error = "connection"
            except ValueError:
                srec.error = "bad_response"
            srec.end_s = self.now()
            self.result.steps.append(srec)
            self.emit("step", conv.program_id, step=srec)
            if srec.ok:
                return srec, reply
            self.result.errors[srec.error or "unknown"] += 1
            retryable = (
                srec.status == 0 or srec.status in RETRY_STATUSES or srec.error == "bad_response"
            )
            if not retryable or attempt == self.o.max_retries:
                log.warning("program %s abandoned at step %d: %s", conv.program_id, i, srec.error)
                return None
            delay = retry_after if retry_after is not None else self.o.retry_backoff_s * 2**attempt
            await asyncio.sleep(min(delay, MAX_BACKOFF_S))
        return None

    async def _read(self, resp: aiohttp.ClientResponse, api: str) -> tuple[str, Any]:
        if not self.o.stream:
            return parse_response(await resp.json(content_type=None), api)
        acc = StreamAccumulator(api)
        async for line in resp.content:
            acc.feed(line)
        if acc.usage is None:
            raise ValueError("stream ended without a usage chunk")
        return acc.text, acc.usage

    async def _release(self, rec: ProgramRecord) -> None:
        """Best-effort release. A program whose release is cancelled stays in ``live``, so the
        end of the run releases it."""
        if self.o.release and self.o.send_program_ids and self.result.release_supported:
            try:
                async with self.http.post(
                    (rec.endpoint or self.endpoint) + release_path(rec.program_id),
                    timeout=aiohttp.ClientTimeout(total=10),
                ) as resp:
                    body = await resp.read()
                    if release_unsupported(resp.status, body):
                        log.info(
                            "release answered %d: no program routes at %s",
                            resp.status,
                            self.endpoint,
                        )
                        self.result.release_supported = False
                    rec.released = resp.status < 300
            except (TimeoutError, aiohttp.ClientError) as e:
                log.warning("release of %s failed: %r", rec.program_id, e)
        self.live.pop(rec.program_id, None)


def retry_after_seconds(value: str | None) -> float | None:
    """A ``Retry-After`` header's seconds (None when absent or not a number of seconds)."""
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None


async def run_workload(
    endpoint: str | list[str],
    profile: WorkloadProfile | str | Path,
    concurrency: int,
    options: DriverOptions | None = None,
    **overrides: Any,
) -> WorkloadResult:
    """Run ``concurrency`` programs of ``profile`` (a profile, or its name or path) in a closed
    loop against ``endpoint`` (``http://host:port``, no path) until ``duration_s`` wall seconds
    have passed or ``total_programs`` programs have ended, whichever comes first.

    ``endpoint`` may be a list: slot i then always talks to ``endpoint[i % n]`` (clients
    straight to n engines, each with its share of the programs: the request-level baseline).

    ``overrides`` are ``DriverOptions`` fields:
    ``await run_workload(url, "mini-swe-agent", 64, duration_s=600, time_scale=20)``.
    """
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    if isinstance(overrides.get("headers"), dict):
        overrides["headers"] = tuple(overrides["headers"].items())
    opts = replace(options, **overrides) if options else DriverOptions(**overrides)
    if not isinstance(profile, WorkloadProfile):
        profile = load_profile(profile)
    return await _Driver(endpoint, profile, concurrency, opts).run()
