"""Writes compare.md from the grid.csv files here and ../grid-cpu-t1-des-steady-v9/grid.csv (direct):
python compare.py > compare.md"""
import collections
import csv
import math


def load(names):
    d = collections.defaultdict(list)
    for n in names:
        for r in csv.DictReader(open(f"{n}/grid.csv")):
            d[r["cell"]].append(float(r["steps_per_min"]))
    return {k: sum(v) / len(v) for k, v in d.items()}


dd = collections.defaultdict(list)
for r in csv.DictReader(open("../grid-cpu-t1-des-steady-v9/grid.csv")):
    if r["router"] == "direct":
        dd[r["cell"]].append(float(r["steps_per_min"]))
direct = {k: sum(v) / len(v) for k, v in dd.items()}
b, n = load(["base-s1", "base-s2"]), load(["new-s1", "new-s2"])
bl, nl = load(["base-long"]), load(["new-long"])
rat = sorted((n[c] / b[c], c) for c in b)
print("# thunder with the gate's reservation against the code before it (DES, one CPU engine)\n")
print("Steps/min of thunder, mean of seeds 1 and 2 (900 s after 300 s), before (`base`, 584862d) and")
print("after (`new`); `direct` from ../grid-cpu-t1-des-steady-v9 (unchanged code, its mean over the same")
print("windows, or over its long runs for the cells it ran long). Sorted by new ÷ base.\n")
print("| cell | base | new | new ÷ base | base ÷ direct | new ÷ direct |\n|---|---:|---:|---:|---:|---:|")
for r, c in rat:
    print(f"| {c} | {b[c]:.1f} | {n[c]:.1f} | {r:.3f} | {b[c] / direct[c]:.3f} | {n[c] / direct[c]:.3f} |")
g = math.exp(sum(math.log(r) for r, _ in rat) / len(rat))
print(f"\n72 cells: geometric mean of new ÷ base {g:.3f}; worst {rat[0][0]:.3f} ({rat[0][1]}), "
      f"best {rat[-1][0]:.3f} ({rat[-1][1]}).\n")
print("Long runs (1,800 s after 3,600 s, 2 repeats) of the three cells where new lost most or stood lowest")
print("against direct (`base-long`, `new-long`; the base rows equal v9's run for run):\n")
print("| cell | base | new | new ÷ base | new ÷ direct (v9's long direct) |\n|---|---:|---:|---:|---:|")
for c in bl:
    print(f"| {c} | {bl[c]:.1f} | {nl[c]:.1f} | {nl[c] / bl[c]:.3f} | {nl[c] / direct[c]:.3f} |")
