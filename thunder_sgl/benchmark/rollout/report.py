"""Rollout tables for ``results.md`` and ``rollout.csv`` (runs with ``RunResult.rollout``).

Per configuration and router: steps/min (× cache_aware), and for sync rollouts the batches'
makespan (× cache_aware), completion p50/p99, time to first response, a group's spread
(last − first member) and its last member's completion over the group's median, weight-update
windows, requests lost. ``rollout.csv``: one row per batch (sync) or per run (async).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from thunder_sgl.benchmark.reports.results import RunResult

BASELINE = "sglang-cache_aware"


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    vals = [float(r[key]) for r in rows if key in r]
    return float(np.mean(vals)) if vals else 0.0


def _max(rows: list[dict[str, Any]], key: str) -> float:
    return max((float(r[key]) for r in rows if key in r), default=0.0)


def _x(v: float, base: float) -> str:
    return f"{v / base:.2f}" if base > 0 else "–"


def markdown(results: Sequence[RunResult]) -> list[str]:
    """The rollout section (empty when no run is a rollout)."""
    runs = [r for r in results if r.rollout]
    if not runs:
        return []
    out = ["## Rollout", "",
           "steps/min over the whole run (sync: all batches, from the first release to the last end; async: "
           "the measured window); makespan = a batch's release to its last program's end (mean over batches); "
           "completion = release to the program's end (p50 / p99, all batches); first resp. = release to the "
           "program's first answer (max); spread = a group's last − first member completion (p50 / max over "
           "groups); last/median = a group's last member completion over the group's median (p50 / max); "
           "windows = weight updates (requests held by thunder during them / waiting at paused engines); "
           "lost = requests refused or failed (must be 0).", ""]
    keys = sorted({(r.profile, r.nodes, r.cluster, r.mode, r.rollout.get("mode", ""), r.programs) for r in runs})
    for profile, nodes, cluster, mode, rmode, n in keys:
        mine = [r for r in runs if (r.profile, r.nodes, r.cluster, r.mode, r.rollout.get("mode"), r.programs)
                == (profile, nodes, cluster, mode, rmode, n)]
        first = mine[0].rollout
        out += [f"### {profile}, {nodes} × {cluster}, {mode} mode, {rmode} rollout, "
                f"{'T × G = ' + str(first['tasks']) + ' × ' + str(first['group_size']) if rmode == 'sync' else 'N = ' + str(n) + ', G = ' + str(first['group_size'])}"
                f", weight update every {first['update_every_s'] / 60:g} min ({first['update_seconds']:g} s, "
                f"{first['update_pause']})", ""]
        by = {r.router: r for r in mine}
        base = by.get(BASELINE)
        base_spm = base.steps_per_min if base else 0.0
        base_ms = _mean(base.rollout.get("batches", []), "makespan_s") if base else 0.0
        out += ["| router | steps/min | ×CA | makespan s | ×CA | completion p50/p99 s | first resp. max s | "
                "spread p50/max s | last/median p50/max | windows (held/door) | lost |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for name, r in by.items():
            ro = r.rollout
            bs = ro.get("batches", [])
            g = bs if bs else [ro]
            ms = _mean(bs, "makespan_s") if bs else 0.0
            comp = (f"{_mean(bs, 'completion_p50_s'):.0f} / {_max(bs, 'completion_p99_s'):.0f}" if bs
                    else f"{r.program_completion_p50_s:.0f} / {r.program_completion_p99_s:.0f}")
            ttfr = f"{_max(bs, 'first_response_max_s'):.0f}" if bs else "–"
            some = any(x.get("groups") for x in g)
            spread = (f"{_mean(g, 'group_spread_p50_s'):.0f} / {_max(g, 'group_spread_max_s'):.0f}" if some
                      else "– (no group ended whole in the window)")
            ratio = f"{_mean(g, 'last_over_median_p50'):.2f} / {_max(g, 'last_over_median_max'):.2f}" if some else "–"
            out.append(
                f"| {name} | {r.steps_per_min:.1f} | {_x(r.steps_per_min, base_spm)} | "
                f"{f'{ms:.0f}' if bs else '–'} | {_x(ms, base_ms) if bs else '–'} | {comp} | "
                f"{ttfr} | {spread} | {ratio} | "
                f"{ro['windows']} ({ro['window_held']}/{ro['window_door']}) | {ro['requests_lost']} |")
        out.append("")
    return out


def write_csv(results: Sequence[RunResult], path: Path) -> Path | None:
    rows = []
    for r in results:
        if not r.rollout:
            continue
        head = {"router": r.router, "mode": r.mode, "profile": r.profile, "nodes": r.nodes, "programs": r.programs,
                **{k: v for k, v in r.rollout.items() if k != "batches"}}
        for b in r.rollout.get("batches") or [{}]:
            rows.append({**head, **b})
    if not rows:
        return None
    fields = list(dict.fromkeys(k for row in rows for k in row))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    return path
