"""Pure measures of an HTTP benchmark run that the driver's summary does not give.

- ``recompute_tokens``: prompt tokens prefilled again that the program had computed before.
- ``imbalance``: max − min of per-node HBM used/capacity, mean and max over time.
- ``parse_histogram`` / ``Histogram``: a Prometheus histogram (the thunder router's
  ``thunder_held_wait_seconds``, the workers' ``sglang:e2e_request_latency_seconds``) from
  exposition text, differences between two scrapes and interpolated quantiles.
- ``parse_counter``: the sum of one counter or gauge over its label sets.
- ``window_check``: whether a run's window measured the steady state (every mode).

No I/O here: the sampler and the harness fetch, these functions compute. Exposition text is
read by the router's own parser (``backends.parse.parse_prometheus``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from thunder_sgl.backends.parse import DecodeMoments, parse_prometheus
from thunder_sgl.benchmark.measures.stats import StepRecord


def recompute_tokens(steps: Iterable[StepRecord], t_from: float = 0.0, t_to: float = math.inf) -> int:
    """Σ over successful calls ending in [t_from, t_to] of
    ``max(0, min(computed before, prompt) − cached)``, where "computed before" is the largest
    ``prompt + completion`` of an earlier successful call of the same program: a conversation
    is append-only, so that many leading tokens of this prompt had been in some KV cache once.
    Calls before ``t_from`` count as computed (they warm the program up) but are not summed."""
    computed: dict[str, int] = {}
    total = 0
    for s in sorted((s for s in steps if s.ok), key=lambda s: (s.end_s, s.step)):
        before = computed.get(s.program_id, 0)
        if t_from <= s.end_s <= t_to:
            total += max(0, min(before, s.prompt_tokens) - s.cached_tokens)
        computed[s.program_id] = max(before, s.prompt_tokens + s.completion_tokens)
    return total


def imbalance(samples: Sequence[tuple[float, Sequence[float]]], t_from: float = 0.0) -> tuple[float, float]:
    """(mean, max) over samples at time >= ``t_from`` of max − min across nodes."""
    spreads = [max(v) - min(v) for t, v in samples if t >= t_from and v]
    if not spreads:
        return 0.0, 0.0
    return sum(spreads) / len(spreads), max(spreads)


def engine_busy(before: Sequence[Sequence[dict[str, Any]] | None], after: Sequence[Sequence[dict[str, Any]] | None],
                seconds: float) -> float:
    """Mean over engine ranks of the share of ``seconds`` they spent computing: Δ
    ``total_prefill_busy_us`` + Δ Σt of ``decode_moments`` (SGLang's own accounting of
    prefill and decode iterations, ``/v1/loads``) over the window. 0 when not reported."""
    shares: list[float] = []
    if seconds <= 0:
        return 0.0
    for b, a in zip(before, after, strict=False):
        if not b or not a:
            continue
        for eb, ea in zip(b, a, strict=False):
            if "total_prefill_busy_us" not in ea:
                continue
            busy = (float(ea.get("total_prefill_busy_us") or 0) - float(eb.get("total_prefill_busy_us") or 0)) / 1e6
            db, da = DecodeMoments.parse(eb.get("decode_moments")), DecodeMoments.parse(ea.get("decode_moments"))
            if da is not None:
                busy += (da - db).busy_s if db is not None else da.busy_s
            shares.append(min(1.0, max(0.0, busy / seconds)))
    return sum(shares) / len(shares) if shares else 0.0


def engine_breakdown(before: Sequence[Sequence[dict[str, Any]] | None],
                     after: Sequence[Sequence[dict[str, Any]] | None]) -> dict[str, float]:
    """Σ over engine ranks of what their own counters say happened between two readings:
    prefill seconds and tokens, decode seconds, iterations, Σ batch sizes, tokens generated."""
    out = {"prefill_s": 0.0, "prefill_tokens": 0.0, "decode_s": 0.0, "decode_iterations": 0.0,
           "decode_batch_sum": 0.0, "generated": 0.0}
    for b, a in zip(before, after, strict=False):
        for eb, ea in zip(b or (), a or (), strict=False):
            out["prefill_s"] += (float(ea.get("total_prefill_busy_us") or 0) - float(eb.get("total_prefill_busy_us") or 0)) / 1e6
            out["prefill_tokens"] += float(ea.get("total_prefill_uncached_tokens") or 0) - float(eb.get("total_prefill_uncached_tokens") or 0)
            da, db = DecodeMoments.parse(ea.get("decode_moments")), DecodeMoments.parse(eb.get("decode_moments"))
            if da is not None:
                d = da - db if db is not None else da
                out["decode_s"] += d.busy_s
                out["decode_iterations"] += d.n
                out["decode_batch_sum"] += d.sum_b
                out["generated"] += d.generated
    return out


def parse_counter(text: str, name: str) -> float:
    """Σ of the samples of ``name`` over all label sets (prometheus_client adds ``_total`` to
    counters; both spellings are accepted). NaN samples are skipped, as everywhere the router
    reads exposition text."""
    samples = parse_prometheus(text)
    return sum(v for n in (name, name + "_total") for _, v in samples.get(n, ()))


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts by upper bound (``+Inf`` last), summed over label sets."""

    buckets: tuple[tuple[float, float], ...] = ()
    sum: float = 0.0
    count: float = 0.0

    def __sub__(self, earlier: Histogram) -> Histogram:
        """Observations between two scrapes (``earlier`` may be empty: the first scrape failed)."""
        old = dict(earlier.buckets)
        return Histogram(tuple((le, c - old.get(le, 0.0)) for le, c in self.buckets),
                         self.sum - earlier.sum, self.count - earlier.count)

    def quantile(self, q: float) -> float:
        """Linear interpolation inside the bucket holding rank ``q·count`` (as PromQL's
        histogram_quantile); the last finite bound when the rank falls in ``+Inf``; 0 if empty."""
        if self.count <= 0 or not self.buckets:
            return 0.0
        rank = q * self.count
        prev_le, prev_c = 0.0, 0.0
        for le, c in self.buckets:
            if c >= rank:
                if math.isinf(le):
                    return prev_le
                if c == prev_c:
                    return le
                return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
            prev_le, prev_c = (le if not math.isinf(le) else prev_le), c
        return prev_le

    def max_bound(self) -> float:
        """Upper bound of the highest non-empty bucket (the last finite bound for ``+Inf``)."""
        top, prev_c, last_finite = 0.0, 0.0, 0.0
        for le, c in self.buckets:
            if c > prev_c:
                top = last_finite if math.isinf(le) else le
            if not math.isinf(le):
                last_finite = le
            prev_c = c
        return top

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count > 0 else 0.0


def parse_histogram(text: str, name: str) -> Histogram:
    """The histogram ``name`` from Prometheus exposition text, label sets summed."""
    samples = parse_prometheus(text)
    buckets: dict[float, float] = {}
    for labels, v in samples.get(name + "_bucket", ()):
        if labels.get("le"):
            le = math.inf if labels["le"] in ("+Inf", "Inf") else float(labels["le"])
            buckets[le] = buckets.get(le, 0.0) + v
    total = sum((v for _, v in samples.get(name + "_sum", ())), 0.0)
    count = sum((v for _, v in samples.get(name + "_count", ())), 0.0)
    return Histogram(tuple(sorted(buckets.items())), total, count)


def overhead_per_request(client_latency_sum: float, requests: int, engine_sum: float,
                         held_sum: float = 0.0) -> float:
    """Mean time a request spent neither in the engine nor held by the router: client, router
    and event-loop delays (all arguments in the same unit). Near 0 when the processes keep up."""
    if requests <= 0:
        return 0.0
    return (client_latency_sum - engine_sum - held_sum) / requests


def timing_model_check(config: str, calls: Sequence[StepRecord], breakdown: dict[str, float]) -> dict[str, float]:
    """The engine's own accounting over a measured window against what the simulator's timing
    model of ``config`` (the one calibrated against these engines) predicts for the same requests.

    Prefill: Σ over the window's calls of ``prefill_seconds(n = prompt − cached, c = cached)``
    plus the fixed cost once per call (a batch of several requests pays it once, so this side
    errs high). Decode: every iteration pays ``t_fixed``, every running request ``per_request``, and each
    call's ``completion`` tokens read its context (``prompt + completion/2`` tokens on average).
    Returns ``{"prefill_model_s", "prefill_s", "decode_model_s", "decode_s"}``; a ratio below 1
    means the model (isolated, fastest-of-repetitions measurements) is cheaper than the engine
    under this load."""
    from thunder_sgl.sim.config import load_sim_config
    from thunder_sgl.sim.timing import Roofline, prefill_seconds

    r = Roofline.from_config(load_sim_config(config))
    pre = dec_kv = 0.0
    for x in calls:
        n = max(0, x.prompt_tokens - x.cached_tokens)
        pre += (r.prefill_fixed if n else 0.0) + prefill_seconds(r, n, x.cached_tokens)
        dec_kv += x.completion_tokens * (x.prompt_tokens + x.completion_tokens / 2)
    dec = (breakdown["decode_iterations"] * r.t_fixed + breakdown["decode_batch_sum"] * r.per_request
           + dec_kv * r.kv_cost)
    return {"prefill_model_s": pre, "prefill_s": breakdown["prefill_s"], "decode_model_s": dec,
            "decode_s": breakdown["decode_s"]}


MIN_STEPS_PER_PROGRAM = 3.0
"""Below this many counted steps per program in the window, steps/min counts waves: programs
that started together finish their steps together (a decode batch ends as one), and whether a
wave falls just inside or just outside the window swings the count by a whole wave."""
MIN_LIFETIMES_BEFORE = 0.5
"""Below this many program lifetimes ended before the window (programs that completed during
the warm-up ÷ N), the window still holds the first programs in their first steps: contexts far
below their steady mean, so the pool holds more of them than it will."""


MIN_STEPS_BEFORE_WARM = 1.0
"""Steps ended before the window, per program, that a warm-started run needs: one step per
program on average works off the cold prefills of their histories."""


def window_check(steps_completed: int, programs: int, ended_before: int, *, warm_start: bool = False,
                 steps_before: int = 0) -> dict[str, Any]:
    """Whether a run's window measures the steady state: ``steps_per_program`` (counted steps
    ÷ N), ``lifetimes_before`` (programs completed before the window ÷ N) and a ``warning``
    naming what fails ('' when both hold). Judged per run, by the same rule in every mode.

    A warm-started run (``workloads.profile.warm_start``: its first programs join mid-life,
    with contexts of the steady mix) needs no lifetime before the window, only the cold start
    worked off: each program's first request prefills its whole history, so it is TRANSIENT
    until as many steps ended before the window as there are programs (``steps_before``)."""
    n = max(1, programs)
    spp, life = steps_completed / n, ended_before / n
    why = []
    if warm_start:
        if steps_before < MIN_STEPS_BEFORE_WARM * n:
            why.append(f"TRANSIENT: {steps_before} steps ended before the window of a warm start with {programs} "
                       f"programs (< {MIN_STEPS_BEFORE_WARM:g} per program): the cold prefills of the programs' "
                       "histories are not worked off; lengthen --warmup")
    elif life < MIN_LIFETIMES_BEFORE:
        why.append(f"TRANSIENT: {ended_before} of {programs} programs had ended before the window "
                   f"(< {MIN_LIFETIMES_BEFORE:g} lifetimes): the first programs are still in their first "
                   "steps, contexts below their steady mean; lengthen --warmup")
    if spp < MIN_STEPS_PER_PROGRAM:
        why.append(f"COARSE: {spp:.1f} steps per program in the window (< {MIN_STEPS_PER_PROGRAM:g}): "
                   "steps end in waves and the count swings by a wave; lengthen --duration")
    out: dict[str, Any] = {"steps_per_program": round(spp, 2), "lifetimes_before": round(life, 2)}
    if warm_start:
        out["warm_start"] = True
        out["steps_before_per_program"] = round(steps_before / n, 2)
    out["warning"] = "; ".join(why)
    return out
