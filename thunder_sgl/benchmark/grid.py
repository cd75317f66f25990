"""A workload grid: one benchmark sweep per cell of (context share, tool time, output, N).

Judging a policy on one workload hides the regimes where it loses. A grid varies what decides
whether holding KV for programs pays:

- the mean context of a program as a share of one engine's KV pool (about 5, 10 and 20%): how
  many programs fit;
- the tool time (median 0.5, 2 and 8 s): how long an admitted program leaves the batch;
- the output per step (16 and 128 tokens): decode against prefill;
- N, the programs in flight, as a multiple of what the pools hold (1×, 2×, 4×, 6×).

Each cell is an agent profile written next to its results (``profiles/<cell>.yaml``: the shape
of ``cpu-agent`` — a shared system prompt, a task, observations appended each step — with the
observation sized so the time-averaged context hits the share) and one ``run_bench`` sweep of
every router at that cell's N, repeated ``repeats`` times with seeds ``seed, seed+1, …``.
``grid.md`` tabulates, per cell, each router's steps/min (mean of the repeats, with their
spread), thunder against the best stock router (direct, sglang_router and smg cache_aware),
and the admission level thunder's goodput rule chose there.

DES mode runs every cell (72); real mode runs ``REAL_CELLS`` (12, chosen to span the regimes:
each share, tool time and output at low and high N) unless ``cells`` names others.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from thunder_sgl.benchmark.reports.results import RunResult

SHARES = (0.05, 0.10, 0.20)
TOOLS = (0.5, 2.0, 8.0)
OUTPUTS = (16, 128)
MULTIPLES = (1, 2, 4, 6)

SYSTEM_TOKENS, INSTANCE_TOKENS = 400, 200
STEPS_LOW, STEPS_HIGH = 10, 20
"""The cells' agent: a 400-token shared prompt, a 200-token task, 10–20 steps."""

_N = STEPS_HIGH - STEPS_LOW + 1
_ES = (STEPS_LOW + STEPS_HIGH) / 2
_ES2 = sum(k * k for k in range(STEPS_LOW, STEPS_HIGH + 1)) / _N
_HALF = (_ES2 - _ES) / (2 * _ES)
_SIGMA = math.log(3.0) / 1.6448536269514722

STOCK = ("direct", "sglang-cache_aware", "smg-cache_aware", "sglang-round_robin")
"""Request-level routers: thunder is judged against the best of those in the sweep."""
GRID_ROUTERS = ("thunder", "thunder-fixed", "direct", "sglang-cache_aware", "smg-cache_aware")


@dataclass(frozen=True)
class Cell:
    share: float
    """Mean context of a program as a share of one engine's pool."""
    tool_s: float
    """Median tool time, seconds."""
    output: int
    """Output tokens per step."""
    multiple: int
    """N as a multiple of the programs the pools hold."""

    @property
    def name(self) -> str:
        return f"ctx{round(self.share * 100):02d}-tool{self.tool_s:g}-out{self.output}-x{self.multiple}"

    @property
    def profile_name(self) -> str:
        return f"grid-ctx{round(self.share * 100):02d}-tool{self.tool_s:g}-out{self.output}"

    def context(self, pool: int) -> float:
        return self.share * pool

    def observation_mean(self, pool: int) -> float:
        """Per-step growth g solving ``base + h·g = share·pool`` — the context averaged over
        every step of every program, ``h = E[S(S−1)/2] / E[S]`` for S steps — less the output;
        at least 8 tokens (a long output alone can exceed the share)."""
        g = (self.context(pool) - SYSTEM_TOKENS - INSTANCE_TOKENS) / _HALF
        return max(8.0, g - self.output)

    def observation_median(self, pool: int) -> float:
        """The lognormal's median for that mean (p95 = 3 × median: σ = ln 3 / 1.645)."""
        return self.observation_mean(pool) / math.exp(_SIGMA ** 2 / 2)

    def mean_context(self, pool: int) -> float:
        return SYSTEM_TOKENS + INSTANCE_TOKENS + _HALF * (self.observation_mean(pool) + self.output)

    def programs(self, pool: int, nodes: int) -> int:
        """N: ``multiple`` × the programs of the mean context that the pools hold."""
        return max(1, round(self.multiple * nodes * pool / self.mean_context(pool)))

    def profile(self, pool: int) -> dict[str, Any]:
        obs = self.observation_median(pool)
        return {
            "name": self.profile_name,
            "description": f"grid cell: mean context ~{self.share:.0%} of a {pool}-token pool, tools ~{self.tool_s:g} s, "
                           f"{self.output} output tokens",
            "system_prompt_tokens": SYSTEM_TOKENS,
            "instance_tokens": INSTANCE_TOKENS,
            "steps": {"kind": "uniform_int", "low": STEPS_LOW, "high": STEPS_HIGH},
            "output_tokens": self.output,
            "observation_tokens": {"kind": "lognormal", "median": round(obs, 1), "p95": round(3 * obs, 1),
                                   "min": 1, "max": round(10 * obs, 1)},
            "tool_name": "bash",
            "tool_seconds": {"kind": "lognormal", "median": self.tool_s, "p95": 4 * self.tool_s, "max": 15 * self.tool_s},
        }


ALL_CELLS = tuple(Cell(s, t, o, m) for s in SHARES for t in TOOLS for o in OUTPUTS for m in MULTIPLES)
REAL_CELLS = (
    Cell(0.05, 2.0, 16, 4), Cell(0.05, 0.5, 16, 2), Cell(0.05, 8.0, 128, 6),
    Cell(0.10, 2.0, 16, 1), Cell(0.10, 2.0, 16, 4), Cell(0.10, 8.0, 128, 2), Cell(0.10, 0.5, 128, 6),
    Cell(0.20, 2.0, 16, 2), Cell(0.20, 2.0, 16, 6), Cell(0.20, 8.0, 16, 4), Cell(0.20, 0.5, 128, 1),
    Cell(0.20, 2.0, 128, 4),
)


def parse_cells(text: str) -> tuple[Cell, ...]:
    """``all``, ``real``, or cell names separated by commas (``ctx20-tool2-out16-x6``)."""
    if text == "all":
        return ALL_CELLS
    if text == "real":
        return REAL_CELLS
    by_name = {c.name: c for c in ALL_CELLS}
    out = []
    for name in (x.strip() for x in text.split(",") if x.strip()):
        if name not in by_name:
            raise ValueError(f"unknown grid cell {name!r}; cells are named like {ALL_CELLS[0].name} "
                             f"(ctx {', '.join(str(round(s * 100)) for s in SHARES)}; tool {', '.join(f'{t:g}' for t in TOOLS)}; "
                             f"out {', '.join(map(str, OUTPUTS))}; x {', '.join(map(str, MULTIPLES))}), or all, or real")
        out.append(by_name[name])
    if not out:
        raise ValueError("no grid cells named")
    return tuple(out)


RunSweep = Callable[[Any, str], list[RunResult]]
"""(BenchSpec, command) → results: ``harness.run_bench``, injected so tests can fake it."""


def run_grid(base: Any, cells: Iterable[Cell], repeats: int, pool: int, run: RunSweep, command: str = "",
             say: Callable[[str], None] = print) -> Path:
    """Run every cell ``repeats`` times as its own sweep under ``base.results_dir``; write
    ``grid.md``, ``grid.csv`` and ``grid.json`` there. Returns the grid's directory."""
    root = base.results_dir
    (root / "profiles").mkdir(parents=True, exist_ok=True)
    if command:
        (root / "command.txt").write_text(command + "\n")
    cells = list(cells)
    rows: list[dict[str, Any]] = []
    for i, cell in enumerate(cells):
        path = root / "profiles" / f"{cell.profile_name}.yaml"
        path.write_text(yaml.safe_dump(cell.profile(pool), sort_keys=False))
        n = cell.programs(pool, base.nodes)
        for rep in range(repeats):
            say(f"grid: cell {i + 1}/{len(cells)} {cell.name} (N = {n}), repeat {rep + 1}/{repeats}")
            spec = dataclasses.replace(base, profile=str(path), programs=(n,), seed=base.seed + rep,
                                       name=f"{cell.name}-r{rep + 1}", out=root)
            for r in run(spec, command):
                rows.append({"cell": cell.name, "share": cell.share, "tool_s": cell.tool_s, "output": cell.output,
                             "multiple": cell.multiple, "programs": n, "repeat": rep + 1, "router": r.router,
                             "steps_per_min": r.steps_per_min, "kv_hit_rate": r.kv_hit_rate,
                             "failed": bool(r.errors.get("failed")), "admission": admission_of(r.notes),
                             "window": window_flag(r.window_check)})
            write_grid(root, rows, f"{base.mode} mode, {base.nodes} × {base.cluster_name}"
                       + (", warm start" if getattr(base, "warm_start", False) else ""))
    return root


def window_flag(check: dict[str, Any]) -> str:
    """'transient', 'coarse', both ('transient+coarse'), or '' (``measures.derived.window_check``)."""
    w = check.get("warning") or ""
    return "+".join(k.lower() for k in ("TRANSIENT", "COARSE") if k + ":" in w)


def admission_of(notes: str) -> str:
    """The admission summary a thunder run's notes carry (``admission=…``), or ''."""
    for part in notes.split():
        if part.startswith("admission="):
            return part.split("=", 1)[1].rstrip(";,")
    return ""


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per cell: each router's mean steps/min and spread over repeats, thunder ÷ best stock."""
    out = []
    for cell in dict.fromkeys(r["cell"] for r in rows):
        mine = [r for r in rows if r["cell"] == cell and not r["failed"]]
        per: dict[str, list[float]] = {}
        for r in mine:
            per.setdefault(r["router"], []).append(r["steps_per_min"])
        mean = {k: statistics.fmean(v) for k, v in per.items()}
        spread = {k: (max(v) - min(v)) / 2 for k, v in per.items()}
        stock = {k: v for k, v in mean.items() if k in STOCK}
        best_stock = max(stock.items(), key=lambda kv: kv[1]) if stock else ("", 0.0)
        th = mean.get("thunder", 0.0)
        first = next(r for r in rows if r["cell"] == cell)
        out.append({
            "cell": cell, "programs": first["programs"], "mean": mean, "spread": spread,
            "best_stock": best_stock[0], "ratio": th / best_stock[1] if best_stock[1] else None,
            "ratio_fixed": th / mean["thunder-fixed"] if mean.get("thunder-fixed") else None,
            "admission": [r["admission"] for r in mine if r["router"] == "thunder" and r["admission"]],
            "repeats": max((r["repeat"] for r in mine), default=0),
            "window": "+".join(sorted({f for r in mine for f in (r.get("window") or "").split("+") if f})),
        })
    return out


def write_grid(root: Path, rows: list[dict[str, Any]], title: str) -> None:
    """``grid.md``, ``grid.json`` and ``grid.csv`` of ``rows``; ``title``: mode, nodes and
    cluster, as the table's heading says them."""
    summary = summarize(rows)
    routers = [r for r in GRID_ROUTERS if any(r in s["mean"] for s in summary)]
    routers += sorted({k for s in summary for k in s["mean"]} - set(routers))
    lines = [
        f"# Workload grid ({title})", "",
        "Steps/min per router, mean of the repeats ± half their range; ×best = thunder ÷ the best of the "
        "request-level routers in the sweep (direct, sglang_router and smg cache_aware); ×fixed = thunder ÷ "
        "thunder-fixed; admission = what thunder's goodput rule held at the end of each repeat "
        "(level L of the grid of levels, n programs, k protected). Cell: mean context as % of one pool, "
        "median tool seconds, output tokens, N as a multiple of what the pools hold. window = whether any "
        "run of the cell missed the steady state (`measures.derived.window_check`): transient = fewer than "
        "half the programs had ended before the window (contexts still small), coarse = fewer than 3 steps "
        "per program counted (steps end in waves); such a cell's ratio is not a steady-state result.", "",
        "| cell | N | " + " | ".join(routers) + " | best stock | ×best | ×fixed | window | admission |",
        "|---|---:|" + "---:|" * len(routers) + "---|---:|---:|---|---|",
    ]
    for s in summary:
        cells = [f"{s['mean'][r]:.1f} ± {s['spread'][r]:.1f}" if r in s["mean"] else "–" for r in routers]
        ratio = f"{s['ratio']:.2f}" if s["ratio"] is not None else "–"
        rf = f"{s['ratio_fixed']:.2f}" if s["ratio_fixed"] is not None else "–"
        lines.append(f"| {s['cell']} | {s['programs']} | " + " | ".join(cells)
                     + f" | {s['best_stock']} | {ratio} | {rf} | {s.get('window') or 'ok'} | {'; '.join(s['admission'])} |")
    ratios = [s["ratio"] for s in summary if s["ratio"] is not None]
    if ratios:
        lines += ["", f"thunder ÷ best stock: min {min(ratios):.2f}, median {statistics.median(ratios):.2f}, "
                      f"max {max(ratios):.2f} over {len(ratios)} cells; cells below 0.97: "
                      + (", ".join(s["cell"] for s in summary if s["ratio"] is not None and s["ratio"] < 0.97) or "none")]
        steady = [s for s in summary if s["ratio"] is not None and not s.get("window")]
        if len(steady) < len(ratios):
            lines += ["", "Steady-state cells only (window ok): " + (
                f"min {min(s['ratio'] for s in steady):.2f}, median {statistics.median(s['ratio'] for s in steady):.2f} "
                f"over {len(steady)} cells" if steady else "none")]
    (root / "grid.md").write_text("\n".join(lines) + "\n")
    (root / "grid.json").write_text(json.dumps({"rows": rows, "summary": summary}, indent=1, default=str))
    keys = ["cell", "programs", "repeat", "router", "steps_per_min", "kv_hit_rate", "failed", "admission", "window"]
    (root / "grid.csv").write_text("\n".join([",".join(keys)] + [",".join(str(r.get(k, "")) for k in keys) for r in rows]) + "\n")


def merge(parts: list[Path], out: Path, title: str, replace: bool = False) -> Path:
    """One grid from several (cells split across processes): rows concatenated, table rewritten.
    ``replace``: a cell's rows in a later part replace the earlier parts' rows of that cell (a
    rerun of some cells, e.g. with a longer window where the first run's was transient)."""
    rows: list[dict[str, Any]] = []
    for p in parts:
        new = json.loads((p / "grid.json").read_text())["rows"]
        if replace:
            again = {r["cell"] for r in new}
            rows = [r for r in rows if r["cell"] not in again]
        rows += new
    out.mkdir(parents=True, exist_ok=True)
    write_grid(out, rows, title)
    return out / "grid.md"


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m thunder_sgl.benchmark.grid",
                                 description="merge grids run as several processes into one grid.md")
    ap.add_argument("parts", nargs="+", type=Path, help="grid directories (each with grid.json)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--title", default="des mode, 1 × sglang-cpu-gpt2-small-t1", help="the table's heading")
    ap.add_argument("--replace", action="store_true",
                    help="a cell in a later part replaces that cell's rows of the earlier parts")
    args = ap.parse_args(argv)
    print(merge(args.parts, args.out, args.title, args.replace))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
