"""Real against simulated: the same sweep on real SGLang CPU engines and on the simulator
calibrated against them, side by side per router and N.

    python bench/real/compare.py bench/results/real-cpu-1e bench/results/real-cpu-1e-sim \\
        [--out bench/results/real-cpu-1e/real-vs-sim.md]

Agreement goal (issue "Real SGLang in the loop"): steps/min within 15% and KV hit rate within
0.05 for every router and N. The table says, for each cell, whether it holds. With HiCache on
both sides (runs that report hits by tier) a second table compares the share of prompt tokens
served from each tier (goal: within 0.05 per tier, router and N; issue 22 item 5).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from thunder_sgl.benchmark.reports.results import RunResult
from thunder_sgl.benchmark.reports.sweep import load_meta, load_results, router_order

STEPS_TOL = 0.15
HIT_TOL = 0.05
TIER_TOL = 0.05


def table(real_dir: Path, sim_dir: Path) -> str:
    real = {(r.router, r.programs): r for r in load_results(real_dir)}
    sim = {(r.router, r.programs): r for r in load_results(sim_dir)}
    keys = sorted(set(real) & set(sim), key=lambda k: (k[1], router_order([x for x, _ in real]).index(k[0])))
    lines = [
        f"# Real against simulated: {real_dir.name} vs {sim_dir.name}", "",
        f"Real: `{load_meta(real_dir).get('command', '')}`  ",
        f"Simulated: `{load_meta(sim_dir).get('command', '')}`", "",
        f"Goal: steps/min within {STEPS_TOL:.0%}, KV hit rate within {HIT_TOL:.2f}.", "",
        "| N | router | steps/min real | sim | sim ÷ real | hit real | sim | Δ hit | engine busy real / sim | agrees |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    ok_all = 0
    for k in keys:
        r, s = real[k], sim[k]
        ratio = s.steps_per_min / r.steps_per_min if r.steps_per_min else float("inf")
        dh = s.kv_hit_rate - r.kv_hit_rate
        ok = abs(ratio - 1) <= STEPS_TOL and abs(dh) <= HIT_TOL
        ok_all += ok
        lines.append(f"| {k[1]} | {k[0]} | {r.steps_per_min:.1f} | {s.steps_per_min:.1f} | {ratio:.2f} | "
                     f"{r.kv_hit_rate:.3f} | {s.kv_hit_rate:.3f} | {dh:+.3f} | {r.engine_busy:.2f} / {s.engine_busy:.2f} | "
                     f"{'yes' if ok else 'no'} |")
    lines += ["", f"{ok_all} of {len(keys)} cells agree."]
    lines += tier_table(keys, real, sim)
    return "\n".join(lines) + "\n"


def _tiers(r: RunResult) -> tuple[float, float, float]:
    p = r.prompt_tokens or 1
    return r.cached_device_tokens / p, r.cached_host_tokens / p, r.cached_storage_tokens / p


def tier_table(keys: list[tuple[str, int]], real: dict[tuple[str, int], RunResult],
               sim: dict[tuple[str, int], RunResult]) -> list[str]:
    """Hits by tier (share of prompt tokens, the engines' own counters), when both sides have them."""
    def has(r: RunResult) -> bool:
        return bool(r.cached_device_tokens or r.cached_host_tokens or r.cached_storage_tokens)

    keys = [k for k in keys if has(real[k]) and has(sim[k])]
    if not keys:
        return []
    lines = ["", f"Hits by tier (share of prompt tokens): goal within {TIER_TOL:.2f} per tier.", "",
             "| N | router | device real / sim | host real / sim | storage real / sim | max Δ | load-back tok real / sim | agrees |",
             "|---:|---|---:|---:|---:|---:|---:|---|"]
    ok_all = 0
    for k in keys:
        a, b = _tiers(real[k]), _tiers(sim[k])
        d = max(abs(x - y) for x, y in zip(a, b, strict=True))
        ok = d <= TIER_TOL
        ok_all += ok
        lines.append(f"| {k[1]} | {k[0]} | {a[0]:.2f} / {b[0]:.2f} | {a[1]:.2f} / {b[1]:.2f} | {a[2]:.2f} / {b[2]:.2f} | "
                     f"{d:.2f} | {real[k].load_back_tokens / 1e3:,.0f} K / {sim[k].load_back_tokens / 1e3:,.0f} K | "
                     f"{'yes' if ok else 'no'} |")
    return lines + ["", f"{ok_all} of {len(keys)} cells agree by tier."]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("real", type=Path)
    ap.add_argument("sim", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    text = table(a.real, a.sim)
    out = a.out or a.real / "real-vs-sim.md"
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
