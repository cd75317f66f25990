"""A request trace replayed in the DES (``workloads.trace``): open-loop arrivals, token prompts
built from the trace's block hash ids, one program per inferred conversation.

``TraceRun`` is a ``DesRun`` whose programs are the trace's conversations instead of a closed
loop. A conversation starts at its first request's arrival; each answered turn counts as a step
at its answer (there is no tool: the next turn is sent at its own arrival, or at the answer when
that comes later); after its last turn the program is released (explicit ids: the client knows
the conversation is over). Every request asks for exactly ``output_length`` tokens (ignore_eos).
thunder's tickets carry block 0 (512 tokens, in every request of the Mooncake traces) as the
shared prefix.

The trace's arrivals end at warm-up + duration; the run goes on ``drain_s`` more (or until every
conversation is over) so that the window's requests are answered. Measures (``RunResult``, the
window [warm-up, warm-up + duration] of trace seconds):
``steps_per_min`` is requests answered in the window per minute (a step is one request here),
``step_latency_*`` request sent (held time included) → answer; ``kv_hit_rate`` and the token
counts are over the requests that arrived in the window, wherever their answer fell (the
drain's too), so a run that falls behind is not judged on a subset.
``trace`` adds: requests offered (arrived in the window) and answered, TTFT percentiles (sent →
first token), latency percentiles from the trace arrival (so a turn that waited for its
predecessor counts that wait), turns sent late because the previous turn was still running,
and SLO attainment (share of the window's arrivals answered with TTFT ≤ ``ttft_slo_s``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from thunder_sgl.benchmark.des.route import ThunderRouter
from thunder_sgl.benchmark.des.run import RETRY, Agent, DesRun
from thunder_sgl.benchmark.measures.stats import percentile
from thunder_sgl.benchmark.reports.results import RunResult
from thunder_sgl.benchmark.workloads.profile import ProgramSpec, StepSpec
from thunder_sgl.benchmark.workloads.trace import (
    BLOCK_TOKENS,
    BlockTokens,
    Conversation,
    TraceRequest,
    conversations,
    load_trace,
    summary,
    trace_name,
)
from thunder_sgl.sim import Completion

START = 4
TTFT_SLO_S = 5.0
"""Default TTFT objective of the SLO attainment."""


class TraceTokens:
    """The prompts of one conversation (the ``ProgramTokens`` interface the DES uses)."""

    __slots__ = ("conv", "blocks", "step", "prompt")

    def __init__(self, conv: Conversation, blocks: BlockTokens) -> None:
        self.conv = conv
        self.blocks = blocks
        self.step = 0
        self.prompt = blocks.prompt(conv.requests[0])

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt) >> 2

    def add_reply(self, output_ids: Any, fresh: bool = False) -> None:
        self.step += 1
        if self.step < len(self.conv.requests):
            self.prompt = self.blocks.prompt(self.conv.requests[self.step])


def program_spec(conv: Conversation, index: int) -> ProgramSpec:
    first = conv.requests[0]
    steps = tuple(StepSpec(observation_tokens=0, output_tokens=r.output_length, tool_seconds=0.0)
                  for r in conv.requests)
    return ProgramSpec(conv.cid, index, min(first.block, first.input_length),
                       max(0, first.input_length - first.block), steps)


class TraceRun(DesRun):
    def __init__(self, cluster: Any, nodes: int, router: str, trace: str | Path, duration_s: float,
                 warmup_s: float = 0.0, seed: int = 0, speed: float = 1.0, limit: int | None = None,
                 drain_s: float = 600.0, profile: str = "mini-swe-agent", ttft_slo_s: float = TTFT_SLO_S,
                 token_scale: int = 1, **kw: Any) -> None:
        requests = load_trace(trace, speed, limit, until_s=warmup_s + duration_s, token_scale=token_scale)
        convs = conversations(requests)
        super().__init__(cluster, nodes, router, profile, max(1, len(convs)), duration_s, warmup_s, seed, **kw)
        self.window_end = self.rec.end_s
        self.rec.end_s += drain_s  # the run goes on; the rates are the window's (``result``)
        self.trace_name = trace_name(trace)
        self.speed, self.ttft_slo_s = speed, ttft_slo_s
        self.requests, self.convs = requests, convs
        self.trace_summary = summary(requests, convs)
        self.blocks = BlockTokens(seed)
        if isinstance(self.router, ThunderRouter):  # the trace's shared prefix: block 0
            block = requests[0].block if requests else BLOCK_TOKENS
            self.router = ThunderRouter(self.workers, self.read, self.router.cfg, router, block,
                                        f"{self.trace_name}:block0")
        self.late = 0
        self.turn_sent: list[tuple[float, float, float, float, int, int, int]] = []
        """(arrival in the trace, sent, first token, answer, prompt, cached, completion tokens) of
        answered requests."""

    # ---- arrivals -------------------------------------------------------------------------
    def _begin(self, now: float) -> None:
        for c in self.convs:
            self._push(c.requests[0].arrival_s, START, c)

    def _start_program(self, now: float) -> None:
        pass  # no closed loop: conversations start at their arrivals

    def _event(self, kind: int, a: Any, now: float) -> None:
        if kind == START:
            conv: Conversation = a
            spec = program_spec(conv, self.counts["started"])
            agent = Agent(spec, TraceTokens(conv, self.blocks), now)
            self.agents[agent.pid] = agent
            self.counts["started"] += 1
            self._issue(agent, now)
        else:
            super()._event(kind, a, now)

    def _request(self, a: Agent) -> TraceRequest:
        return a.tokens.conv.requests[a.step]  # type: ignore[attr-defined,no-any-return]

    def _completed(self, c: Completion, now: float) -> None:
        a = self.by_rid.get(c.rid)
        if a is not None and c.error is None and c.finish_reason != "abort":
            r = self._request(a)
            first = c.first_token_time if c.first_token_time is not None else c.time
            self.turn_sent.append((r.arrival_s, a.sent, first, c.time, c.prompt_tokens, c.cached_tokens,
                                   c.completion_tokens))
        super()._completed(c, now)

    def _tool_end(self, a: Agent, now: float) -> None:
        self.rec.tool_ends.append(now)
        if now >= self.rec.warmup_s:
            self.window_steps += 1
        if a.step < len(a.spec.steps):
            due = self._request(a).arrival_s
            if due > now:
                self._push(due, RETRY, a)
            else:
                if due < now:
                    self.late += 1
                self._issue(a, now)
        else:
            self._end_program(a, now, "completed")

    def _end_program(self, a: Agent, now: float, outcome: str) -> None:
        super()._end_program(a, now, outcome)
        if self.counts["completed"] + self.counts["failed"] >= len(self.convs):
            self.finished = True  # every conversation is over: nothing more can happen

    # ---- measures -------------------------------------------------------------------------
    def result(self) -> RunResult:
        end, self.rec.end_s = self.rec.end_s, self.window_end
        try:
            r = super().result()
        finally:
            self.rec.end_s = end
        w0, w1 = self.rec.warmup_s, self.window_end
        offered = [q for q in self.requests if w0 <= q.arrival_s <= w1]
        ans = [t for t in self.turn_sent if w0 <= t[0] <= w1]
        ttft = [t[2] - t[1] for t in ans]
        from_arrival = [t[3] - t[0] for t in ans]
        slo = sum(1 for t in ans if t[2] - t[0] <= self.ttft_slo_s)
        # tokens and hit rate: the window's arrivals, answered in the window or the drain
        r.prompt_tokens, r.cached_tokens = sum(t[4] for t in ans), sum(t[5] for t in ans)
        r.completion_tokens = sum(t[6] for t in ans)
        r.kv_hit_rate = r.cached_tokens / r.prompt_tokens if r.prompt_tokens else 0.0
        r.profile = self.trace_name
        r.programs = len(self.convs)
        r.ideal_steps_per_min = 0.0
        r.window_check = {}
        r.trace = {
            "speed": self.speed, "requests_offered": len(offered), "requests_answered": len(ans),
            "offered_per_min": 60.0 * len(offered) / max(1e-9, w1 - w0),
            "ttft_p50_s": percentile(ttft, 50, empty=0.0), "ttft_p99_s": percentile(ttft, 99, empty=0.0),
            "latency_from_arrival_p50_s": percentile(from_arrival, 50, empty=0.0),
            "latency_from_arrival_p99_s": percentile(from_arrival, 99, empty=0.0),
            "ttft_slo_s": self.ttft_slo_s,
            "slo_attainment": slo / len(offered) if offered else 0.0,
            "late_turns": self.late, **{f"trace_{k}": v for k, v in self.trace_summary.items()},
        }
        return r


def run_trace_des(cluster: Any, nodes: int, router: str, trace: str | Path, duration_s: float,
                  warmup_s: float = 0.0, seed: int = 0, speed: float = 1.0, limit: int | None = None,
                  **kw: Any) -> RunResult:
    """Replay ``trace`` (``workloads.trace``) at ``speed`` through ``router`` on ``nodes`` workers
    of ``cluster`` for ``warmup_s + duration_s`` trace seconds."""
    return TraceRun(cluster, nodes, router, trace, duration_s, warmup_s, seed, speed, limit, **kw).run()
