"""Reports of a benchmark sweep: pure functions from a list of ``RunResult`` to files.

    write_report(results, out_dir, meta)   # results.csv/.json/.md + steps_per_min.png, hit_rate.png,
                                           # memory_<router>.png
    load_results(out_dir)                  # the RunResults back from results.json

The markdown table compares, for each concurrency, every router with stock ``sglang_router``
cache_aware (the router most deployments run) and with the physical bound of calibration.md
§10 (``ideal_steps_per_min``). Runs are grouped by (mode, cluster, nodes, profile), so a results
file mixing configurations still gives one table per configuration. A run the harness could not
complete carries ``errors[FAILED]`` and the reason in ``notes``; it appears in the table as
failed and is left out of the plots.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from thunder_sgl.benchmark.reports import trace as trace_report
from thunder_sgl.benchmark.reports.results import ALL_ROUTERS, RunResult
from thunder_sgl.benchmark.rollout import report as rollout_report

FAILED = "run_failed"
"""Key of ``RunResult.errors`` marking a run that did not complete (router did not start, …)."""
BASELINE = "sglang-cache_aware"
"""The router every other one is compared with."""

Group = tuple[str, str, int, str]


def failed(r: RunResult) -> bool:
    return bool(r.errors.get(FAILED))


def group_key(r: RunResult) -> Group:
    return (r.mode, r.cluster, r.nodes, r.profile)


def groups(results: Iterable[RunResult]) -> dict[Group, list[RunResult]]:
    out: dict[Group, list[RunResult]] = {}
    for r in results:
        out.setdefault(group_key(r), []).append(r)
    return out


def router_order(names: Iterable[str]) -> list[str]:
    """Known routers in ``ALL_ROUTERS`` order, then any other name alphabetically."""
    names = set(names)
    return [n for n in ALL_ROUTERS if n in names] + sorted(names - set(ALL_ROUTERS))


# ---------------------------------------------------------------- CSV / JSON


def write_csv(results: Sequence[RunResult], path: Path) -> Path:
    """One row per run: ``RunResult.CSV_FIELDS``, then the error counts and the notes."""
    with Path(path).open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([*RunResult.CSV_FIELDS, "errors", "notes"])
        for r in results:
            row = r.row()
            w.writerow([_csv_cell(row[k]) for k in RunResult.CSV_FIELDS]
                       + [json.dumps(r.errors, sort_keys=True) if r.errors else "", r.notes])
    return Path(path)


def read_csv(path: Path) -> list[dict[str, str]]:
    with Path(path).open(newline="") as fh:
        return list(csv.DictReader(fh))


def write_json(results: Sequence[RunResult], path: Path, meta: dict[str, Any] | None = None) -> Path:
    """``{"meta": …, "results": [RunResult.to_dict(), …]}`` (memory samples included)."""
    doc = {"meta": meta or {}, "results": [r.to_dict() for r in results]}
    Path(path).write_text(json.dumps(doc, indent=1, default=_json_default) + "\n")
    return Path(path)


def load_results(path: str | Path) -> list[RunResult]:
    """The runs of a results directory (its ``results.json``) or of a JSON file."""
    return [RunResult.from_dict(d) for d in _load_doc(path)["results"]]


def load_meta(path: str | Path) -> dict[str, Any]:
    return dict(_load_doc(path).get("meta") or {})


def _load_doc(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    doc = json.loads(p.read_text())
    if isinstance(doc, list):  # a bare list of runs
        doc = {"results": doc}
    return doc


# ---------------------------------------------------------------- markdown


def markdown(results: Sequence[RunResult], meta: dict[str, Any] | None = None) -> str:
    """Tables per configuration and concurrency, then notes of failed runs."""
    meta = meta or {}
    lines = [f"# {meta.get('name', 'Benchmark')}", ""]
    if meta.get("command"):
        lines += [f"Command: `{meta['command']}`", ""]
    lines += [
        "steps/min per simulated minute after warm-up; ×CA = ratio to stock sglang_router "
        "cache_aware at the same N; ×ideal = ratio to the physical bound of calibration.md §10 (with a host tier: its HiCache ceiling); "
        "recompute = prompt tokens prefilled again that the program had computed before "
        "(share of all prompt tokens); imbalance = mean (max) over time of max−min per-node HBM "
        "used/capacity; completion = program start to end, simulated seconds; held = time thunder "
        "held a request (simulated seconds, p50/p99/max; in http mode read from the router's "
        "histogram, so quantiles are interpolated and max is the upper edge of the highest "
        "occupied bucket).",
        "",
    ]
    for (mode, cluster, nodes, profile), runs in groups(results).items():
        first = runs[0]
        lines += [f"## {profile} on {nodes} × {cluster} ({mode} mode)", ""]
        info = [f"window {first.window_s:.0f} s simulated", f"seed {first.seed}"]
        if mode == "http":
            info.append(f"time scale {first.time_scale:g}")
        lines += [", ".join(info), ""]
        for n in sorted({r.programs for r in runs}):
            lines += _table(n, [r for r in runs if r.programs == n]) + [""]
        warned = [r for r in runs if r.window_check.get("warning")]
        if warned:
            lines += ["**Window** (steps/min there is not the steady state: `measures.derived.window_check`):", ""]
            lines += [f"- {r.router} N={r.programs}: {r.window_check['warning']}" for r in warned]
            lines.append("")
        notes = [r for r in runs if r.notes]
        if notes:
            lines += ["Notes:", ""]
            lines += [f"- {r.router} N={r.programs}: {r.notes}" for r in notes]
            lines.append("")
    lines += rollout_report.markdown(results)
    lines += trace_report.markdown(results)
    return "\n".join(lines).rstrip() + "\n"


def _table(n: int, runs: list[RunResult]) -> list[str]:
    by = {r.router: r for r in runs}
    base = by.get(BASELINE)
    base_spm = base.steps_per_min if base is not None and not failed(base) else 0.0
    ideal = max((r.ideal_steps_per_min for r in runs), default=0.0)
    head = f"### N = {n} programs" + (f" (ideal {ideal:.0f} steps/min)" if ideal else "")
    out = [head, "",
           "| router | steps/min | ×CA | ×ideal | KV hit | recompute tok | imbalance | "
           "completion p50/p99 s | held p50/p99/max s | errors |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for name in router_order(by):
        r = by[name]
        if failed(r):
            out.append(f"| {name} | failed | | | | | | | | {_errors(r)} |")
            continue
        out.append(
            f"| {name} | {r.steps_per_min:.1f} | {_ratio(r.steps_per_min, base_spm)} | "
            f"{_ratio(r.steps_per_min, r.ideal_steps_per_min)} | {r.kv_hit_rate:.1%} | "
            f"{_tokens(r.recompute_tokens)} ({_share(r.recompute_tokens, r.prompt_tokens)}) | "
            f"{r.node_imbalance_mean:.2f} ({r.node_imbalance_max:.2f}) | "
            f"{r.program_completion_p50_s:.0f} / {r.program_completion_p99_s:.0f} | "
            f"{_held(r)} | {_errors(r)} |"
        )
    return out + _tier_table(runs)


def _tier_table(runs: list[RunResult]) -> list[str]:
    """The HiCache split of the cache hits (engines' own counters), when any run has one."""
    if not any(r.cached_host_tokens or r.cached_storage_tokens or r.load_back_tokens or r.cached_device_tokens
               for r in runs):
        return []
    out = ["", "KV hits by tier (the engines' `sglang:cached_tokens_total{cache_source}` over the window, "
           "share of prompt tokens) and tokens loaded back host → device:", "",
           "| router | device | host | storage | load-back tok | step p50 / p99 s |", "|---|---:|---:|---:|---:|---:|"]
    by = {r.router: r for r in runs}
    for name in router_order(by):
        r = by[name]
        if failed(r):
            continue
        out.append(f"| {name} | {_share(r.cached_device_tokens, r.prompt_tokens)} | "
                   f"{_share(r.cached_host_tokens, r.prompt_tokens)} | {_share(r.cached_storage_tokens, r.prompt_tokens)} | "
                   f"{_tokens(r.load_back_tokens)} | {r.step_latency_p50_s:.1f} / {r.step_latency_p99_s:.1f} |")
    return out


def _ratio(x: float, base: float) -> str:
    return f"{x / base:.2f}" if base > 0 else "–"


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "–"


def _tokens(n: int) -> str:
    return f"{n / 1e6:.1f} M" if n >= 1e6 else f"{n / 1e3:.0f} K" if n >= 1e3 else str(n)


def _held(r: RunResult) -> str:
    if not r.router.startswith("thunder"):
        return "–"
    return f"{r.held_wait_p50_s:.1f} / {r.held_wait_p99_s:.1f} / {r.held_wait_max_s:.0f}"


def _errors(r: RunResult) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(r.errors.items()) if k != FAILED) or ""


# ---------------------------------------------------------------- plots


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_metric(results: Sequence[RunResult], metric: str, path: Path, ylabel: str,
                ideal: bool = False, percent: bool = False) -> Path:
    """``metric`` against N, one line per router (one panel per configuration)."""
    plt = _pyplot()
    gs = groups(r for r in results if not failed(r))
    fig, axes = plt.subplots(1, max(1, len(gs)), figsize=(6.4 * max(1, len(gs)), 4.4), squeeze=False)
    for ax, ((mode, cluster, nodes, profile), runs) in zip(axes[0], gs.items(), strict=False):
        for name in router_order(r.router for r in runs):
            pts = sorted((r.programs, getattr(r, metric)) for r in runs if r.router == name)
            ys = [100 * y if percent else y for _, y in pts]
            ax.plot([x for x, _ in pts], ys, marker="o", label=name)
        if ideal:
            pts = sorted({r.programs: r.ideal_steps_per_min for r in runs if r.ideal_steps_per_min}.items())
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], "k--", label="ideal (§10)")
        ax.set_xticks(sorted({r.programs for r in runs}))
        ax.set_title(f"{profile}, {nodes} × {cluster} ({mode})", fontsize=10)
        ax.set_xlabel("concurrent programs N")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0, top=100 if percent else None)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_memory(r: RunResult, path: Path, warmup_s: float | None = None) -> Path:
    """Per-node HBM used/capacity over simulated time of one run."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.0))
    times = [t for t, _ in r.memory]
    nodes = max((len(v) for _, v in r.memory), default=0)
    for i in range(nodes):
        ax.plot(times, [100 * v[i] if i < len(v) else math.nan for _, v in r.memory], lw=1, label=f"node {i}")
    if warmup_s:
        ax.axvline(warmup_s, color="grey", ls=":", label="end of warm-up")
    ax.set_title(f"{r.router}: HBM used per node, N = {r.programs} ({r.nodes} × {r.cluster})", fontsize=10)
    ax.set_xlabel("simulated seconds")
    ax.set_ylabel("HBM in use (num_used_tokens) / capacity, %")
    ax.set_ylim(0, 105)
    ax.grid(alpha=0.3)
    if nodes <= 16:
        ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def plot_comparison(results: Sequence[RunResult], path: Path, warmup_s: float | None = None) -> Path:
    """Routers side by side at one configuration: steps/min, KV hit rate, completion time and
    recompute as bars, and HBM use over time (mean over nodes) below."""
    plt = _pyplot()
    runs = [r for r in results if not failed(r)]
    names = [r.router for r in runs]
    colors = [f"C{i}" for i in range(len(runs))]
    fig = plt.figure(figsize=(12, 7))
    grid = fig.add_gridspec(2, 4, height_ratios=[1, 1.1])
    bars = (("steps / simulated min", [r.steps_per_min for r in runs], "{:.0f}"),
            ("KV hit rate (%)", [100 * r.kv_hit_rate for r in runs], "{:.0f}%"),
            ("recompute (M tokens)", [r.recompute_tokens / 1e6 for r in runs], "{:.1f}"),
            ("program completion p50 (s)", [r.program_completion_p50_s for r in runs], "{:.0f}"))
    for i, (title, ys, fmt) in enumerate(bars):
        ax = fig.add_subplot(grid[0, i])
        ax.bar(range(len(ys)), ys, color=colors)
        for x, y in enumerate(ys):
            ax.annotate(fmt.format(y), (x, y), ha="center", va="bottom", fontsize=9)
        ax.set_xticks(range(len(ys)), names, rotation=15, fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.margins(y=0.15)
    ax = fig.add_subplot(grid[1, :])
    for r, c in zip(runs, colors, strict=True):
        ax.plot([t for t, _ in r.memory], [100 * sum(v) / max(1, len(v)) for _, v in r.memory],
                color=c, lw=1, label=r.router)
    if warmup_s:
        ax.axvline(warmup_s, color="grey", ls=":", label="end of warm-up")
    ax.set_xlabel("simulated seconds")
    ax.set_ylabel("HBM in use / capacity (%)")
    ax.set_ylim(0, 105)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    if runs:
        r = runs[0]
        fig.suptitle(f"{r.profile}, N = {r.programs} programs on {r.nodes} × {r.cluster}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def write_report(results: Sequence[RunResult], out_dir: str | Path,
                 meta: dict[str, Any] | None = None, plots: bool = True) -> list[Path]:
    """Every report file of a sweep into ``out_dir`` (the PNGs only with ``plots``); returns
    the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = meta or {}
    paths = [write_csv(results, out / "results.csv"), write_json(results, out / "results.json", meta)]
    (out / "results.md").write_text(markdown(results, meta))
    paths.append(out / "results.md")
    rollout_csv = rollout_report.write_csv(results, out / "rollout.csv")
    if rollout_csv is not None:
        paths.append(rollout_csv)
    ok = [r for r in results if not failed(r)]
    if not ok or not plots:
        return paths
    paths.append(plot_metric(ok, "steps_per_min", out / "steps_per_min.png", "steps / simulated min", ideal=True))
    paths.append(plot_metric(ok, "kv_hit_rate", out / "hit_rate.png", "KV hit rate (%)", percent=True))
    for name in router_order(r.router for r in ok):
        mine = [r for r in ok if r.router == name and r.memory]
        if mine:
            top = max(mine, key=lambda r: (r.programs, r.nodes))
            paths.append(plot_memory(top, out / f"memory_{name}.png", meta.get("warmup_s")))
    return paths


def _csv_cell(v: Any) -> Any:
    return round(v, 6) if isinstance(v, float) and math.isfinite(v) else v


def _json_default(o: Any) -> Any:
    if isinstance(o, (set, tuple)):
        return list(o)
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
