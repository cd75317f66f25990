"""The table of README.md: python summarize.py DIR (each cell's results.json)."""
import glob
import json
import math
import os
import sys

root = sys.argv[1]
ROUTERS = ["direct", "sglang-cache_aware", "smg-cache_aware", "thunder"]
cells = {}
for f in sorted(glob.glob(f"{root}/*/results.json")):
    name = os.path.basename(os.path.dirname(f))
    cell, seed = name.rsplit("-seed", 1)
    for r in json.load(open(f))["results"]:
        t = r["trace"]
        cells.setdefault(cell, {}).setdefault(r["router"], {})[int(seed)] = (t["slo_attainment"], t["ttft_p50_s"], t["ttft_p99_s"])


def key(c):
    n, s = c[1:].split("-s")
    return int(n), float(s)


print("| cell | seed | " + " | ".join(ROUTERS) + " | thunder ÷ best stock (SLO) | TTFT p50 thunder − best stock |")
print("|---|---:|" + "---:|" * (len(ROUTERS) + 2))
logs, wins, losses, ties, dp50 = [], 0, 0, 0, []
for cell in sorted(cells, key=key):
    d = cells[cell]
    for seed in sorted(d["thunder"]):
        row = []
        for r in ROUTERS:
            slo, p50, p99 = d[r][seed]
            row.append(f"{100 * slo:.1f}%, {p50:.1f} / {p99:.1f} s")
        best = max(d[r][seed][0] for r in ROUTERS[:-1])
        best_p50 = min(d[r][seed][1] for r in ROUTERS[:-1])
        th = d["thunder"][seed]
        ratio = th[0] / best if best > 0 else float("nan")
        if best < 0.999:  # overloaded: the objective is missed by every router
            logs.append(math.log(ratio))
            wins += ratio > 1.0
            losses += ratio < 1.0
            ties += ratio == 1.0
            dp50.append(th[1] - best_p50)
        print(f"| {cell} | {seed} | " + " | ".join(row) + f" | {ratio:.3f} | {th[1] - best_p50:+.2f} s |")
n = len(logs)
print()
print(f"overloaded runs (best stock SLO < 99.9%): {n}; thunder ÷ best stock router, SLO attainment: geometric mean "
      f"{math.exp(sum(logs) / n):.3f}, min {math.exp(min(logs)):.3f}, max {math.exp(max(logs)):.3f}; "
      f"ahead in {wins}, behind in {losses}, equal in {ties}; TTFT p50 minus the best stock router's: "
      f"mean {sum(dp50) / n:+.2f} s")
for r in ROUTERS[:-1]:
    xs = [math.log(d["thunder"][s][0] / d[r][s][0]) for d in cells.values() for s in d["thunder"] if d[r][s][0] < 0.999]
    print(f"thunder ÷ {r} over its overloaded runs ({len(xs)}): geometric mean {math.exp(sum(xs) / len(xs)):.3f}, "
          f"ahead in {sum(x > 0 for x in xs)}, behind in {sum(x < 0 for x in xs)}")
