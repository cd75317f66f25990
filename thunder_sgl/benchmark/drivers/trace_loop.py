"""Open-loop trace replay over HTTP (``workloads.trace``): the HTTP and real modes of ``bench --trace``.

Each conversation (``workloads.trace.conversations``) is a task: turn j is sent at its arrival
(trace seconds / ``time_scale`` after the start) or, when turn j−1 has not been answered by
then, at its answer (counted as a late turn). A request is ``/v1/completions`` with the turn's
text prompt (``BlockTokens.text``: the hash-id blocks as text, so shared ids are a shared text
prefix: exact token counts on the simulator, close ones under a real engine's tokenizer with
``text_style`` "words"), ``max_tokens`` = ``output_length`` with ``ignore_eos``, streamed (the first content
chunk times TTFT) with usage. With ``send_program_ids`` the conversation id goes in the body,
``X-Program-Id`` and ``X-SMG-Routing-Key``, and the program is released after its last turn;
without, the router sees bare prompts (thunder does not infer programs of ``/v1/completions``,
docs/deploy.md "Program ids", so ``thunder-inferred`` routes these statelessly).

Arrivals stop at warm-up + duration; the run waits up to ``drain_s`` more for the window's
requests. The ``WorkloadResult``'s window (``wall_s``) is warm-up + duration, so steps/min
is requests answered in the window per minute (a step being one request);
``TraceWorkload.trace`` holds what ``des.trace`` reports (TTFT and latency percentiles, SLO
attainment, offered and answered, late turns, and the tokens of the window's arrivals, from
which ``http_mode`` sets the KV hit rate as ``des.trace`` does).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from thunder_sgl.benchmark.drivers.closed_loop import (
    MAX_BACKOFF_S,
    RETRY_STATUSES,
    retry_after_seconds,
)
from thunder_sgl.benchmark.measures.stats import (
    ProgramRecord,
    StepRecord,
    WorkloadResult,
    percentile,
)
from thunder_sgl.benchmark.workloads.conversation import (
    StreamAccumulator,
    program_headers,
    release_path,
)
from thunder_sgl.benchmark.workloads.trace import BlockTokens, Conversation, TraceRequest

MAX_RETRIES = 3


@dataclass
class TraceWorkload(WorkloadResult):
    trace: dict[str, Any] = field(default_factory=dict)
    turns: list[tuple[float, float, float | None, float, int, int, int]] = field(default_factory=list)
    """(arrival, sent, first token, answer, prompt, cached, completion tokens) of answered
    requests, wall seconds from the start."""


class _Replay:
    def __init__(self, target: str | list[str], requests: list[TraceRequest], convs: list[Conversation],
                 warmup_s: float, duration_s: float, drain_s: float, time_scale: float, seed: int,
                 send_program_ids: bool, ttft_slo_s: float, name: str, text_style: str) -> None:
        self.style = text_style
        self.targets = [target] if isinstance(target, str) else list(target)
        self.requests, self.convs = requests, convs
        self.scale = time_scale
        self.end = (warmup_s + duration_s) / time_scale
        self.drain = drain_s / time_scale
        self.send_ids = send_program_ids
        self.slo = ttft_slo_s
        self.blocks = BlockTokens(seed)
        self.result = TraceWorkload(name, len(convs), time_scale, self.end, warmup_s / time_scale)
        self.late = 0
        self.t0 = 0.0
        self.model = "default"

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def run(self) -> TraceWorkload:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as http:
            self.http = http
            self.model = await self._model()
            self.t0 = time.monotonic()
            tasks = [asyncio.create_task(self._conversation(c, self.targets[i % len(self.targets)]))
                     for i, c in enumerate(self.convs) if c.requests[0].arrival_s / self.scale <= self.end]
            try:
                if tasks:
                    await asyncio.wait(tasks, timeout=self.end + self.drain)
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        self._measure()
        return self.result

    async def _model(self) -> str:
        try:
            async with self.http.get(f"{self.targets[0]}/v1/models", timeout=aiohttp.ClientTimeout(total=10)) as r:
                if r.status == 200:
                    data = (await r.json(content_type=None)).get("data") or []
                    if data and data[0].get("id"):
                        return str(data[0]["id"])
        except (TimeoutError, aiohttp.ClientError, ValueError, AttributeError):
            pass
        return "default"

    async def _conversation(self, conv: Conversation, target: str) -> None:
        rec = ProgramRecord(conv.cid, len(self.result.programs), len(conv.requests), self.now())
        rec.endpoint = target
        self.result.programs.append(rec)
        try:
            for j, r in enumerate(conv.requests):
                due = r.arrival_s / self.scale
                if due > self.end:
                    break
                wait = due - self.now()
                if wait > 0:
                    await asyncio.sleep(wait)
                elif j and wait < 0:
                    self.late += 1
                srec = await self._call(conv, j, r, target, due)
                if srec is None:
                    rec.outcome = "failed"
                    break
                rec.steps_done += 1
            else:
                rec.outcome = "completed"
        except asyncio.CancelledError:
            rec.outcome = "cancelled"
            raise
        finally:
            rec.end_s = self.now()
        if rec.outcome == "completed" and self.send_ids:
            try:
                async with self.http.post(target + release_path(conv.cid),
                                          timeout=aiohttp.ClientTimeout(total=10)) as resp:
                    await resp.read()
                    rec.released = resp.status < 300
            except (TimeoutError, aiohttp.ClientError):
                pass

    async def _call(self, conv: Conversation, j: int, r: TraceRequest, target: str, due: float) -> StepRecord | None:
        body: dict[str, Any] = {"model": self.model, "prompt": self.blocks.text(r, self.style),
                                "max_tokens": r.output_length,
                                "ignore_eos": True, "temperature": 0, "stream": True,
                                "stream_options": {"include_usage": True}}
        headers = program_headers(conv.cid) if self.send_ids else {}
        if self.send_ids:
            body["program_id"] = conv.cid
        for attempt in range(MAX_RETRIES + 1):
            srec = StepRecord(conv.cid, j, attempt, self.now(), 0.0)
            first: float | None = None
            retry_after = 0.5 * 2**attempt
            try:
                async with self.http.post(target + "/v1/completions", json=body, headers=headers) as resp:
                    srec.status = resp.status
                    if resp.status == 200:
                        acc = StreamAccumulator("completions")
                        async for line in resp.content:
                            acc.feed(line)
                            if first is None and acc.parts:
                                first = self.now()
                        if acc.usage is None:
                            raise ValueError("stream ended without a usage chunk")
                        srec.prompt_tokens = acc.usage.prompt_tokens
                        srec.completion_tokens = acc.usage.completion_tokens
                        srec.cached_tokens = acc.usage.cached_tokens
                    else:
                        srec.error = f"http_{resp.status}"
                        told = retry_after_seconds(resp.headers.get("Retry-After"))
                        if told is not None:
                            retry_after = told
                        await resp.read()
            except TimeoutError:
                srec.error = "timeout"
            except aiohttp.ClientError:
                srec.error = "connection"
            except ValueError:
                srec.error = "bad_response"
            srec.end_s = self.now()
            self.result.steps.append(srec)
            if srec.ok:
                srec.tool_end_s = srec.end_s  # a step is one request: it counts when answered
                self.result.turns.append((due, srec.start_s, first, srec.end_s, srec.prompt_tokens,
                                          srec.cached_tokens, srec.completion_tokens))
                return srec
            self.result.errors[srec.error or "unknown"] += 1
            if not (srec.status == 0 or srec.status in RETRY_STATUSES) or attempt == MAX_RETRIES:
                return None
            await asyncio.sleep(min(retry_after, MAX_BACKOFF_S))
        return None

    def _measure(self) -> None:
        s, w0, w1 = self.scale, self.result.warmup_s, self.end
        offered = [q for q in self.requests if w0 <= q.arrival_s / s <= w1]
        ans = [t for t in self.result.turns if w0 <= t[0] <= w1]
        ttft = [(t[2] - t[1]) * s for t in ans if t[2] is not None]
        lat = [(t[3] - t[0]) * s for t in ans]
        slo = sum(1 for t in ans if t[2] is not None and (t[2] - t[0]) * s <= self.slo)
        prompt, cached = sum(t[4] for t in ans), sum(t[5] for t in ans)
        self.result.trace = {
            "prompt_tokens": prompt, "cached_tokens": cached, "completion_tokens": sum(t[6] for t in ans),
            "requests_offered": len(offered), "requests_answered": len(ans),
            "offered_per_min": 60.0 * len(offered) / max(1e-9, (w1 - w0) * s),
            "ttft_p50_s": percentile(ttft, 50, empty=0.0), "ttft_p99_s": percentile(ttft, 99, empty=0.0),
            "latency_from_arrival_p50_s": percentile(lat, 50, empty=0.0),
            "latency_from_arrival_p99_s": percentile(lat, 99, empty=0.0),
            "ttft_slo_s": self.slo, "slo_attainment": slo / len(offered) if offered else 0.0,
            "late_turns": self.late,
        }


async def run_trace(target: str | list[str], requests: list[TraceRequest], convs: list[Conversation], *,
                    warmup_s: float, duration_s: float, drain_s: float, time_scale: float, seed: int,
                    send_program_ids: bool = True, ttft_slo_s: float = 5.0, name: str = "trace",
                    text_style: str = "sim") -> TraceWorkload:
    """Replay ``convs`` (of ``requests``) against ``target`` (a router URL, or engine URLs: each
    conversation straight to ``target[i % n]``). Times in trace seconds; wall = trace / ``time_scale``."""
    return await _Replay(target, requests, convs, warmup_s, duration_s, drain_s, time_scale, seed,
                         send_program_ids, ttft_slo_s, name, text_style).run()
