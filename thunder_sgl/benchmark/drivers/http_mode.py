"""HTTP mode of the harness: one router at one concurrency against the real simulated cluster.

A run, in order:

1. the cluster is made clean — every worker idle, ``POST /flush_cache``, ``/v1/loads`` shows
   nothing used — so every router starts from the same empty caches;
2. the router starts in front of the workers (thunder with ``--thunder-time-scale`` = the
   simulator's, so its Δt and decay run on simulated time);
3. ``run_workload`` drives the seeded closed-loop workload for (warm-up + duration) / time
   scale wall seconds while a ``NodeSampler`` records per-node HBM use and a lag probe watches
   this process's event loop; the router's and workers' metrics are scraped at the end of the
   warm-up and at the end (held waits, pauses, engine latency, CPU);
4. the router stops and a ``RunResult`` is filled.

Whether the processes keep up is checked, not assumed: the time a request spends outside the
engine and outside thunder's hold (client, router, event loops) is reported per request, with
the CPU share of the simulator, the router and this process.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp
import psutil

from thunder_sgl.backends.parse import cached_tokens_by_source, host_tier_by_rank, parse_prometheus
from thunder_sgl.benchmark.drivers.closed_loop import run_workload
from thunder_sgl.benchmark.drivers.peers import start_sim, start_stock, start_thunder
from thunder_sgl.benchmark.drivers.sampler import NodeSampler, clean_cluster, loads, scrape
from thunder_sgl.benchmark.measures.derived import (
    Histogram,
    engine_breakdown,
    engine_busy,
    imbalance,
    overhead_per_request,
    parse_counter,
    parse_histogram,
    recompute_tokens,
    timing_model_check,
    window_check,
)
from thunder_sgl.benchmark.measures.stats import WorkloadResult
from thunder_sgl.benchmark.reports.results import DIRECT, THUNDER_INFERRED, RunResult
from thunder_sgl.benchmark.reports.sweep import FAILED
from thunder_sgl.benchmark.workloads.profile import WorkloadProfile
from thunder_sgl.benchmark.workloads.trace import Conversation as TraceConversation
from thunder_sgl.benchmark.workloads.trace import TraceRequest
from thunder_sgl.children import Proc
from thunder_sgl.gateway.metrics import ADMISSION_GAUGES
from thunder_sgl.scheduler.goodput import summarize as summarize_admission

if TYPE_CHECKING:
    from thunder_sgl.benchmark.reports.progress import Progress

HELD = "thunder_held_wait_seconds"
ENGINE_E2E = "sglang:e2e_request_latency_seconds"
MAX_MEMORY_SAMPLES = 1500
CLEAN_TIMEOUT_S = 90.0
KEEP_UP_SHARE = 0.10
"""A run kept up when requests spent less than this share of their latency outside the engine
and thunder's hold (client, router and event-loop delays) ..."""
KEEP_UP_LAG_S = 0.25
"""... and this process's event loop was late by less than this (p99, wall seconds)."""

RouterStarter = Callable[[list[str], float, Path, list[str]], Proc | None]

ROUTER_STARTERS: dict[str, RouterStarter] = {
    "thunder": lambda urls, scale, logs, extra: start_thunder(
        urls, scale, "tier-aware", extra=extra, log_dir=logs),
    THUNDER_INFERRED: lambda urls, scale, logs, extra: start_thunder(
        urls, scale, "tier-aware", extra=extra, log_dir=logs, name=THUNDER_INFERRED),
    "thunder-occupancy": lambda urls, scale, logs, extra: start_thunder(
        urls, scale, "occupancy", extra=extra, log_dir=logs, name="thunder-occupancy"),
    "thunder-fixed": lambda urls, scale, logs, extra: start_thunder(
        urls, scale, "fixed", extra=extra, log_dir=logs, name="thunder-fixed"),
    "thunder-paper": lambda urls, scale, logs, extra: start_thunder(
        urls, scale, "paper", extra=extra, log_dir=logs, name="thunder-paper"),
    "sglang-cache_aware": lambda urls, scale, logs, extra: start_stock(
        urls, "cache_aware", "sglang_router", extra=extra, log_dir=logs),
    "sglang-round_robin": lambda urls, scale, logs, extra: start_stock(
        urls, "round_robin", "sglang_router", extra=extra, log_dir=logs),
    "smg-cache_aware": lambda urls, scale, logs, extra: start_stock(
        urls, "cache_aware", "smg", extra=extra, log_dir=logs),
    DIRECT: lambda urls, scale, logs, extra: None,
}
"""How each router under test (``reports.results.ROUTERS``) is started in front of the workers; the
last argument is extra command-line arguments for that router."""


def start_router(name: str, urls: list[str], time_scale: float, log_dir: Path,
                 extra: list[str] | None = None) -> Proc | None:
    """The router process in front of ``urls`` (None for ``direct``: no router)."""
    try:
        starter = ROUTER_STARTERS[name]
    except KeyError:
        raise ValueError(f"unknown router {name!r}; valid: {', '.join(ROUTER_STARTERS)}") from None
    return starter(urls, time_scale, log_dir, list(extra or []))


class Workers(Protocol):
    """The workers a run drives: simulated (one process) or real SGLang servers."""

    @property
    def urls(self) -> list[str]: ...

    def alive(self) -> bool: ...

    def pids(self) -> list[int]: ...


@dataclass
class SimWorkers:
    proc: Proc

    @property
    def urls(self) -> list[str]:
        return self.proc.urls

    def alive(self) -> bool:
        return self.proc.alive()

    def pids(self) -> list[int]:
        return [self.proc.popen.pid]


@dataclass
class HttpCluster:
    """The simulated cluster of a sweep: started once, restarted only if it died."""

    config: str
    nodes: int
    time_scale: float
    seed: int
    log_dir: Path
    proc: Proc | None = None

    def ensure(self) -> Workers:
        if self.proc is None or not self.proc.alive():
            self.proc = start_sim(self.config, workers=self.nodes, time_scale=self.time_scale,
                                  seed=self.seed, log_dir=self.log_dir / "sim")
        return SimWorkers(self.proc)

    def log_files(self) -> list[Path]:
        return list((self.log_dir / "sim").glob("*.log"))

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None


@dataclass
class RunPlan:
    """What one HTTP run measures (times in simulated seconds)."""

    router: str
    programs: int
    profile: WorkloadProfile
    warmup_s: float
    duration_s: float
    time_scale: float
    seed: int
    sample_every_s: float = 5.0
    router_args: tuple[str, ...] = ()
    """Extra command-line arguments of the router."""
    base: dict[str, Any] = field(default_factory=dict)
    """RunResult fields fixed by the sweep (cluster, nodes, ideal_steps_per_min)."""
    timing_config: str = ""
    """Real mode: the simulator config calibrated against the engines; the notes then compare
    its timing model with the engines' own accounting, and each call of the run is kept in
    ``steps/<router>-N<n>.jsonl`` beside the results."""
    warm_start: bool = False
    """The first programs start mid-life (``workloads.profile.warm_start``)."""
    trace: TraceReplay | None = None
    """Replay a trace open-loop (``drivers.trace_loop``) instead of the closed loop."""


@dataclass
class TraceReplay:
    """A loaded trace for ``RunPlan.trace``."""

    name: str
    requests: list[TraceRequest]
    convs: list[TraceConversation]
    drain_s: float = 600.0
    ttft_slo_s: float = 5.0
    speed: float = 1.0
    text_style: str = "sim"
    """``workloads.trace.BlockTokens.text`` style: ``sim`` (exact under the simulator's tokenizer)
    or ``words`` (real engines)."""


class Cluster(Protocol):
    """What a sweep runs on: ``ensure`` (re)starts the workers, ``log_files`` for a failed run."""

    log_dir: Path

    def ensure(self) -> Workers: ...

    def log_files(self) -> list[Path]: ...


@dataclass
class _Scrape:
    wall: float = 0.0
    router: str | None = None
    workers: list[str | None] = field(default_factory=list)
    loads: list[list[dict[str, Any]] | None] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)
    admission: str | None = None
    """thunder's /metrics a second before the measured window ends, while the programs still
    run (the admission state after the clients stop describes no load)."""


def http_run(cluster: Cluster, plan: RunPlan, progress: Progress, keep_logs: Path,
             diagnostics: dict[str, Any] | None = None) -> RunResult:
    """One measured run; never raises for a failure of the run itself (the result says so and
    the sim and router logs are copied to ``keep_logs``). KeyboardInterrupt propagates after
    the router is stopped. ``diagnostics``, when given, receives whether the processes kept up
    (``keeps_up``, ``outside_share``, ``lag_p99_s``, ``cpu``)."""
    run_logs = cluster.log_dir / f"{plan.router}-N{plan.programs}"
    result = RunResult(router=plan.router, mode="http", programs=plan.programs,
                       profile=plan.profile.name, seed=plan.seed, window_s=plan.duration_s,
                       steps_per_min=0.0, kv_hit_rate=0.0, time_scale=plan.time_scale,
                       **plan.base)
    router: Proc | None = None
    direct = plan.router == DIRECT
    t_start = time.monotonic()
    try:
        progress.start_run(plan.router, plan.programs, plan.warmup_s + plan.duration_s,
                           plan.warmup_s, plan.time_scale)
        workers = cluster.ensure()
        progress.status("cleaning cluster")
        asyncio.run(_clean(workers.urls))
        progress.status("starting router" if not direct else "no router: clients straight to the engines")
        router = start_router(plan.router, workers.urls, plan.time_scale, run_logs, list(plan.router_args))
        work, warm, end, samples, lag = asyncio.run(_measure(workers, router, plan, progress))
        diag = _fill(result, plan, work, warm, end, samples, lag)
        if plan.trace is not None:
            result.profile, result.window_check, result.ideal_steps_per_min = plan.trace.name, {}, 0.0
            result.trace = {"speed": plan.trace.speed, **getattr(work, "trace", {})}
            # tokens and hit rate of the window's arrivals, answered in the window or the drain (des.trace)
            for k in ("prompt_tokens", "cached_tokens", "completion_tokens"):
                setattr(result, k, int(result.trace.pop(k, 0)))
            result.kv_hit_rate = result.cached_tokens / result.prompt_tokens if result.prompt_tokens else 0.0
        if plan.timing_config:
            _keep_steps(work, keep_logs.parent / "steps" / f"{plan.router}-N{plan.programs}.jsonl",
                        diag.get("engines", {}))
        if diagnostics is not None:
            diagnostics.update(diag)
        if router is not None and not router.alive():
            _fail(result, f"router exited during the run (code {router.popen.returncode})")
        elif not workers.alive():
            _fail(result, "a worker exited during the run")
    except Exception as e:  # noqa: BLE001 - a failed run is a result
        _fail(result, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300])
    finally:
        if router is not None:
            router.stop()
        result.wall_s = time.monotonic() - t_start
    if result.errors.get(FAILED):
        _keep_logs(cluster, run_logs, keep_logs / f"{plan.router}-N{plan.programs}")
    return result


async def _clean(urls: list[str]) -> None:
    async with aiohttp.ClientSession() as http:
        await clean_cluster(http, urls, CLEAN_TIMEOUT_S)


def _cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        p = psutil.Process(pid)
        procs = [p, *p.children(recursive=True)]
        return sum(sum(x.cpu_times()[:2]) for x in procs)
    except psutil.Error:
        return 0.0


async def _scrape(http: aiohttp.ClientSession, workers: Workers, router: Proc | None, thunder: bool) -> _Scrape:
    r = await scrape(http, router.url) if thunder and router is not None else None
    texts = list(await asyncio.gather(*(scrape(http, u) for u in workers.urls)))
    rank_loads = list(await asyncio.gather(*(loads(http, u) for u in workers.urls)))
    me = psutil.Process()
    cpu = {"sim" if isinstance(workers, SimWorkers) else "engines": sum(_cpu_seconds(p) for p in workers.pids()),
           "router": _cpu_seconds(router.popen.pid if router is not None else None),
           "client": sum(me.cpu_times()[:2])}  # this process only: the workers and router are its children
    return _Scrape(time.monotonic(), r, texts, rank_loads, cpu)


async def _measure(workers: Workers, router: Proc | None, plan: RunPlan, progress: Progress
                   ) -> tuple[WorkloadResult, _Scrape, _Scrape, list[tuple[float, list[float]]], list[float]]:
    scale = plan.time_scale
    thunder = plan.router.startswith("thunder")
    warm_wall = plan.warmup_s / scale
    async with aiohttp.ClientSession() as http:
        progress.running()
        sampler = NodeSampler(http, workers.urls, plan.sample_every_s / scale, scale)
        warm = await _scrape(http, workers, router, thunder) if warm_wall <= 0 else _Scrape()
        lags: list[float] = []

        async def at_warmup() -> None:
            nonlocal warm
            await asyncio.sleep(warm_wall)
            warm = await _scrape(http, workers, router, thunder)

        async def watch() -> None:
            while True:
                t = time.perf_counter()
                await asyncio.sleep(0.1)
                lags.append(time.perf_counter() - t - 0.1)
                progress.tick()
                if router is not None and not router.alive():
                    progress.status("router died")

        admission: str | None = None

        async def near_end() -> None:
            nonlocal admission
            await asyncio.sleep(max(0.0, (plan.warmup_s + plan.duration_s) / scale - 1.0))
            admission = await scrape(http, router.url) if router is not None else None

        tasks = [asyncio.create_task(c) for c in (sampler.run(), watch())]
        if warm_wall > 0:
            tasks.append(asyncio.create_task(at_warmup()))
        if thunder:
            tasks.append(asyncio.create_task(near_end()))
        try:
            target: str | list[str] = router.url if router is not None else workers.urls
            if plan.trace is not None:
                from thunder_sgl.benchmark.drivers.trace_loop import run_trace

                tr = plan.trace
                work = await run_trace(target, tr.requests, tr.convs, warmup_s=plan.warmup_s,
                                       duration_s=plan.duration_s, drain_s=tr.drain_s, time_scale=scale,
                                       seed=plan.seed, send_program_ids=plan.router != THUNDER_INFERRED,
                                       ttft_slo_s=tr.ttft_slo_s, name=tr.name, text_style=tr.text_style)
            else:
                work = await run_workload(target, plan.profile, plan.programs,
                                          duration_s=(plan.warmup_s + plan.duration_s) / scale,
                                          warmup_s=warm_wall, time_scale=scale, seed=plan.seed,
                                          send_program_ids=plan.router != THUNDER_INFERRED,
                                          warm_start=plan.warm_start,
                                          on_event=progress.driver_event)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        end = await _scrape(http, workers, router, thunder)
        end.admission = admission
    return work, warm, end, sampler.samples, lags


def _admission(text: str) -> str:
    """The goodput rule's state at the end of a run, from the router's ``thunder_admission_*``
    gauges (one token for the notes: ``goodput.summarize``)."""
    samples = parse_prometheus(text)
    views: dict[str, dict[str, object]] = {}
    for name, _ in ADMISSION_GAUGES:
        for labels, value in samples.get(f"thunder_admission_{name}", []):
            views.setdefault(labels.get("backend", ""), {"rule": "goodput"})[name] = value
    return summarize_admission(list(views.values()))


def _fill(r: RunResult, plan: RunPlan, work: WorkloadResult, warm: _Scrape, end: _Scrape,
          samples: list[tuple[float, list[float]]], lags: list[float]) -> dict[str, Any]:
    s = work.summary()
    scale = plan.time_scale
    r.window_s = s["window_sim_s"]
    for k in ("steps_per_min", "kv_hit_rate", "prompt_tokens", "cached_tokens", "completion_tokens",
              "programs_completed", "programs_failed", "steps_completed"):
        setattr(r, k, s[k])
    for k in ("program_completion_p50_s", "program_completion_p99_s", "step_latency_p50_s",
              "step_latency_p99_s"):
        setattr(r, k, s[k] or 0.0)
    r.errors = dict(s["errors"])
    ended = sum(1 for p in work.programs if p.outcome == "completed" and p.end_s is not None and p.end_s < work.warmup_s)
    before = sum(1 for st in work.steps if st.tool_end_s is not None and st.tool_end_s < work.warmup_s)
    r.window_check = window_check(r.steps_completed, plan.programs, ended, warm_start=plan.warm_start,
                                  steps_before=before)
    r.recompute_tokens = recompute_tokens(work.steps, work.warmup_s, work.wall_s)
    r.node_imbalance_mean, r.node_imbalance_max = imbalance(samples, plan.warmup_s)
    r.engine_busy = engine_busy(warm.loads, end.loads, (end.wall - warm.wall) * scale)
    _tier_delta(r, warm, end)
    eb = engine_breakdown(warm.loads, end.loads)
    step = max(1, len(samples) // MAX_MEMORY_SAMPLES)
    r.memory = [(round(t, 2), [round(x, 4) for x in v]) for t, v in samples[::step]]
    notes: list[str] = []
    held = Histogram()
    if warm.router is not None and end.router is not None:
        held = parse_histogram(end.router, HELD) - parse_histogram(warm.router, HELD)
        r.held_wait_p50_s = held.quantile(0.5) * scale
        r.held_wait_p99_s = held.quantile(0.99) * scale
        r.held_wait_max_s = held.max_bound() * scale
        counts = {k: parse_counter(end.router, f"thunder_{k}") - parse_counter(warm.router, f"thunder_{k}")
                  for k in ("pauses", "restores", "migrations", "held", "dormant")}
        notes.append(", ".join(f"{k} {v:.0f}" for k, v in counts.items()))
        adm = _admission(end.admission or end.router)
        if adm:
            notes.append(f"admission={adm}")
    if eb["prefill_s"] or eb["decode_s"]:
        it = eb["decode_iterations"]
        notes.append(f"engines: prefill {eb['prefill_s']:.1f} s for {eb['prefill_tokens'] / 1e3:.0f} K tokens, decode "
                     f"{eb['decode_s']:.1f} s over {it:.0f} iterations ({1e3 * eb['decode_s'] / it if it else 0:.1f} ms, "
                     f"mean batch {eb['decode_batch_sum'] / it if it else 0:.1f})")
    diag: dict[str, Any] = {"outside_share": 0.0, "lag_p99_s": 0.0, "cpu": {}, "engines": eb}
    engine = _engine_delta(warm, end)
    calls = [x for x in work.steps if x.ok and work.warmup_s <= x.end_s <= work.wall_s]
    if plan.timing_config and (eb["prefill_s"] or eb["decode_s"]) and calls:
        chk = timing_model_check(plan.timing_config, calls, eb)
        diag["timing_check"] = chk
        pre_r = chk["prefill_model_s"] / max(chk["prefill_s"], 1e-9)
        dec_r = chk["decode_model_s"] / max(chk["decode_s"], 1e-9)
        notes.append(f"timing model ({plan.timing_config}) ÷ engine: prefill {pre_r:.2f}, decode {dec_r:.2f}")
        if min(pre_r, dec_r) < SLOW_ENGINE_RATIO:
            notes.append("ENGINES FAR SLOWER THAN CALIBRATED: was the machine busy with other work?")
    if engine is not None and engine.count > 0 and calls:
        client_mean = sum(x.latency_s for x in calls) / len(calls)
        over = overhead_per_request(client_mean, 1, engine.mean / scale, held.sum / len(calls)) * scale
        diag["outside_share"] = share = over / (client_mean * scale)
        notes.append(f"outside engine+hold {over:.2f} s/request ({share:.0%} of step latency)")
    wall = end.wall - warm.wall
    if wall > 0 and warm.cpu:
        diag["cpu"] = {k: (end.cpu[k] - warm.cpu[k]) / wall for k in end.cpu}
        notes.append("CPU " + " ".join(f"{k} {100 * v:.0f}%" for k, v in diag["cpu"].items()))
    if lags:
        lags.sort()
        diag["lag_p99_s"] = lags[int(0.99 * (len(lags) - 1))]
        notes.append(f"client loop lag p99 {1000 * diag['lag_p99_s']:.0f} ms")
    diag["keeps_up"] = keeps_up = diag["outside_share"] < KEEP_UP_SHARE and diag["lag_p99_s"] < KEEP_UP_LAG_S
    if not keeps_up:
        notes.append("PROCESSES DID NOT KEEP UP: lower --time-scale")
    r.notes = "; ".join(notes)
    return diag


SLOW_ENGINE_RATIO = 0.65
"""Real mode: a timing-model ÷ engine ratio below this says the engines ran far slower than their
calibration (measured on an idle machine). On a quiet 2-core machine single runs spread
0.66-0.94 (0.79 over a sweep); beside other work 0.61-0.81 (docs/real-engine.md), so one run's
ratio flags only a gross slowdown: compare a sweep's total (``bench/real/timing_check.py``)."""


def _keep_steps(work: WorkloadResult, path: Path, engines: dict[str, float]) -> None:
    """Every call of a run, one JSON object per line (times in seconds since the run started;
    the measured window is ``warmup_s`` to ``wall_s`` of the header line, which also holds
    what the engines' own counters booked in that window: ``engines``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        f.write(json.dumps({"warmup_s": work.warmup_s, "wall_s": work.wall_s, "engines": engines}) + "\n")
        for x in work.steps:
            f.write(json.dumps({"program": x.program_id, "step": x.step, "attempt": x.attempt,
                                "start_s": round(x.start_s, 4), "end_s": round(x.end_s, 4),
                                "status": x.status, "error": x.error, "prompt": x.prompt_tokens,
                                "cached": x.cached_tokens, "completion": x.completion_tokens}) + "\n")


def _tier_delta(r: RunResult, warm: _Scrape, end: _Scrape) -> None:
    """The HiCache split of the window from the engines' own counters (``/metrics``): cached
    tokens by tier and tokens loaded back. Nothing without HiCache, or a reading missing."""
    if not warm.workers or any(t is None for t in warm.workers + end.workers):
        return
    for a, b in zip(warm.workers, end.workers, strict=True):
        sa, sb = parse_prometheus(a or ""), parse_prometheus(b or "")
        ha, hb = host_tier_by_rank(sa), host_tier_by_rank(sb)
        if not hb:
            continue
        ca, cb = cached_tokens_by_source(sa), cached_tokens_by_source(sb)
        r.cached_device_tokens += cb["device"] - ca["device"]
        r.cached_host_tokens += cb["host"] - ca["host"]
        r.cached_storage_tokens += cb["storage"] - ca["storage"]
        r.load_back_tokens += sum(t.load_back_tokens for t in hb.values()) - sum(t.load_back_tokens for t in ha.values())


def _engine_delta(warm: _Scrape, end: _Scrape) -> Histogram | None:
    if not warm.workers or any(t is None for t in warm.workers + end.workers):
        return None
    total = Histogram()
    for a, b in zip(warm.workers, end.workers, strict=True):
        d = parse_histogram(b or "", ENGINE_E2E) - parse_histogram(a or "", ENGINE_E2E)
        total = Histogram((), total.sum + d.sum, total.count + d.count)
    return total


def _fail(r: RunResult, why: str) -> None:
    r.errors[FAILED] = 1
    r.notes = (why + ("; " + r.notes if r.notes else "")).strip()


def _keep_logs(cluster: Cluster, run_logs: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for src in [*run_logs.glob("*.log"), *cluster.log_files()]:
        try:
            shutil.copy2(src, dest / src.name)
        except OSError:
            pass
