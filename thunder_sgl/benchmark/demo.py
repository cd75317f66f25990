"""``thunder-sgl demo``: thunder against stock ``sglang_router`` cache_aware, on this machine.

One simulated node of GLM-4.6-FP8 on 8×H100 (KV pool 1.05 M tokens, the paper's setup) serves
mini-swe-agent programs in a closed loop, about three times as many as its KV cache holds —
the regime where request-level routing thrashes: an agent's KV is evicted while its tool runs
and the whole history is prefilled again. Each router runs for half the time budget on the same
cluster, flushed clean in between, with the same seeded programs (one after the other rather
than two clusters at once: on a small machine two clusters would compete for the cores, and the
simulator's clock needs its process to keep up). The simulator runs ``--time-scale`` times
faster than real time, so three minutes of wall time are more than half an hour of GPU time.

After each run the demo checks that the processes kept up with the simulated clock (requests
spend almost no time outside the engine and the router's hold); if the first run did not, it
halves the time scale, says so, and runs again. Everything started is stopped at the end and on
Ctrl-C; every wait is bounded.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from thunder_sgl.benchmark.drivers.http_mode import HttpCluster, RunPlan, http_run
from thunder_sgl.benchmark.measures.ideal import ideal_steps_per_min
from thunder_sgl.benchmark.reports.progress import LiveProgress
from thunder_sgl.benchmark.reports.results import RunResult
from thunder_sgl.benchmark.reports.sweep import FAILED, plot_comparison, write_report
from thunder_sgl.benchmark.workloads.profile import (
    WorkloadProfile,
    load_profile,
    mean_context_tokens,
)
from thunder_sgl.sim.config import load_sim_config

ROUTERS = ("thunder", "sglang-cache_aware")
SETUP_WALL_S = 12.0
"""Wall seconds a run spends outside its measured part (router start, cache flush, stop)."""
MIN_CHECKED_WALL_S = 30.0
"""Shorter runs are dominated by the start-up burst (every program's first request at once):
their keep-up check is reported but does not trigger a rerun."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--minutes", type=float, default=3.0, help="total wall time of both runs (default 3)")
    p.add_argument("--out", type=Path, default=Path("thunder-demo"), help="results directory (default ./thunder-demo)")
    p.add_argument("--cluster", default="glm46-fp8-h100x8", help="simulator config of the node")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--profile", default="mini-swe-agent")
    p.add_argument("--programs", type=int, default=0,
                   help="concurrent programs (default: 3 × what the KV cache holds)")
    p.add_argument("--time-scale", type=float, default=0.0,
                   help="simulated seconds per wall second (default: 15 with 2+ cores, else 7)")
    p.add_argument("--seed", type=int, default=1)


def run_demo(args: argparse.Namespace) -> int:
    console = Console()
    if not console.is_terminal:  # a log file or a pipe: wide enough for the table
        console = Console(width=120)
    profile = load_profile(args.profile)
    cfg = load_sim_config(args.cluster)
    capacity = cfg.server.max_total_num_tokens * cfg.server.dp_size * args.nodes
    cbar = mean_context_tokens(profile, args.seed)
    fits = capacity / cbar
    programs = args.programs or max(2, round(3 * fits))
    scale = args.time_scale or (15.0 if (os.cpu_count() or 1) >= 2 else 7.0)
    run_wall = max(4.0, (60.0 * args.minutes - 2 * SETUP_WALL_S) / 2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    console.print(
        f"[bold]thunder-sgl demo[/bold]: thunder vs stock sglang_router (cache_aware)\n"
        f"  cluster : {args.nodes} × {cfg.name} — KV pool {capacity / 1e6:.2f} M tokens, "
        f"≈ {fits:.0f} programs of {cbar / 1e3:.1f} K tokens (mean context of {profile.name})\n"
        f"  workload: {profile.name}, {programs} programs in a closed loop "
        f"(≈ {programs / fits:.1f}× what the KV cache holds), seed {args.seed}\n"
        f"  plan    : each router {run_wall:.0f} s wall on a flushed cluster, one after the other; "
        f"simulator at {scale:g}× real time", highlight=False)
    tmp = Path(tempfile.mkdtemp(prefix="thunder-demo-"))
    cluster = HttpCluster(args.cluster, args.nodes, scale, args.seed, tmp)
    results: list[RunResult] = []
    try:
        console.print(f"starting {args.nodes} simulated worker(s) …", highlight=False)
        cluster.ensure()
        with LiveProgress("thunder-sgl demo", console) as progress:
            progress.plan([(r, programs) for r in ROUTERS])
            for i, router in enumerate(ROUTERS):
                for attempt in range(3):
                    r, diag = _one(cluster, router, programs, profile, scale, run_wall, args.seed,
                                   progress, out, cfg.name, args.nodes)
                    if (diag.get("keeps_up", True) or r.errors.get(FAILED) or i > 0 or attempt == 2
                            or run_wall < MIN_CHECKED_WALL_S):
                        break
                    scale /= 2
                    progress.message(f"the processes did not keep up with the simulated clock "
                                     f"({diag.get('outside_share', 0):.0%} of request time outside "
                                     f"the engine); lowering the time scale to {scale:g} and running again")
                    cluster.stop()
                    cluster = HttpCluster(args.cluster, args.nodes, scale, args.seed, tmp)
                    cluster.ensure()
                if not diag.get("keeps_up", True) and not r.errors.get(FAILED) and run_wall >= MIN_CHECKED_WALL_S:
                    progress.message(f"warning: {router} did not keep up with the simulated clock; "
                                     f"its numbers are distorted (try --time-scale {scale / 2:g})")
                results.append(r)
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    warmup = _warmup(run_wall * scale)
    meta = {"name": "thunder-sgl demo", "command": "thunder-sgl demo " + _argv(args), "warmup_s": warmup}
    write_report(results, out, meta, plots=False)
    plot = _plots(results, out, warmup)
    console.print(_table(results))
    console.print(_verdict(results), highlight=False)
    console.print(f"results: {out / 'results.md'}\nplot   : {plot}", highlight=False)
    return 0 if results and not any(r.errors.get(FAILED) for r in results) else 1


def _warmup(total_sim_s: float) -> float:
    """A third of the run, at most 10 simulated minutes: contexts grow and caches fill."""
    return min(600.0, total_sim_s / 3)


def _one(cluster: HttpCluster, router: str, programs: int, profile: WorkloadProfile, scale: float,
         run_wall: float, seed: int, progress: LiveProgress, out: Path, cluster_name: str,
         nodes: int) -> tuple[RunResult, dict[str, Any]]:
    total = run_wall * scale
    warm = _warmup(total)
    plan = RunPlan(router, programs, profile, warm, total - warm, scale, seed, 5.0,
                   base={"cluster": cluster_name, "nodes": nodes})
    diag: dict[str, Any] = {}
    t = time.monotonic()
    r = http_run(cluster, plan, progress, out / "logs", diag)
    r.ideal_steps_per_min = ideal_steps_per_min(cluster.config, cluster.nodes, profile, programs)
    r.wall_s = time.monotonic() - t
    progress.end_run(r)
    return r, diag


def _plots(results: list[RunResult], out: Path, warmup_s: float) -> Path:
    ok = [r for r in results if not r.errors.get(FAILED)]
    path = out / "demo.png"
    plot_comparison(ok, path, warmup_s)
    return path


def _table(results: list[RunResult]) -> Table:
    t = Table(title="thunder vs sglang_router cache_aware (simulated time)")
    for col in ("router", "steps/min", "KV hit rate", "programs done", "completion p50 / p99 s",
                "recompute tokens", "held p50 / p99 s"):
        t.add_column(col, justify="left" if col == "router" else "right")
    for r in results:
        if r.errors.get(FAILED):
            t.add_row(r.router, "failed", "", "", "", "", r.notes[:60])
            continue
        held = f"{r.held_wait_p50_s:.1f} / {r.held_wait_p99_s:.1f}" if r.router.startswith("thunder") else "–"
        t.add_row(r.router, f"{r.steps_per_min:.1f}", f"{r.kv_hit_rate:.1%}", str(r.programs_completed),
                  f"{r.program_completion_p50_s:.0f} / {r.program_completion_p99_s:.0f}",
                  f"{r.recompute_tokens / 1e6:.2f} M ({r.recompute_tokens / max(1, r.prompt_tokens):.0%})", held)
    return t


def _verdict(results: list[RunResult]) -> str:
    by = {r.router: r for r in results if not r.errors.get(FAILED)}
    a, b = by.get("thunder"), by.get("sglang-cache_aware")
    if a is None or b is None or b.steps_per_min <= 0:
        return "no comparison: a run failed (see the notes in results.md)"
    return (f"thunder: {a.steps_per_min / b.steps_per_min:.2f}× the steps/min of sglang_router cache_aware, "
            f"KV hit rate {a.kv_hit_rate:.0%} vs {b.kv_hit_rate:.0%} "
            f"({a.window_s / 60:.1f} simulated minutes measured per router, after the warm-up)"
            + (f"; physical bound (calibration.md §10): {a.ideal_steps_per_min:.0f} steps/min"
               if a.ideal_steps_per_min else ""))


def _argv(args: argparse.Namespace) -> str:
    parts = [f"--minutes {args.minutes:g}"]
    if str(args.out) != "thunder-demo":
        parts.append(f"--out {args.out}")
    for k in ("cluster", "profile"):
        if getattr(args, k) != {"cluster": "glm46-fp8-h100x8", "profile": "mini-swe-agent"}[k]:
            parts.append(f"--{k} {getattr(args, k)}")
    for k in ("nodes", "programs", "time_scale", "seed"):
        v = getattr(args, k)
        if v and v != {"nodes": 1, "seed": 1}.get(k):
            parts.append(f"--{k.replace('_', '-')} {v:g}")
    return " ".join(parts)
