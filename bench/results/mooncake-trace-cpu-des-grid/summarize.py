"""The table of README.md: python summarize.py DIR (each cell's results.json, thunder before beside it)."""
import glob
import json
import os
import sys

root = sys.argv[1]
rows = {}
for f in sorted(glob.glob(f"{root}/*/results.json")):
    name = os.path.basename(os.path.dirname(f))
    cell = name.replace("-before", "")
    for r in json.load(open(f))["results"]:
        router = r["router"] + ("@before" if name.endswith("-before") else "")
        t = r["trace"]
        rows.setdefault(cell, {})[router] = (t["ttft_p50_s"], t["ttft_p99_s"], t["slo_attainment"], r["kv_hit_rate"], r.get("engine_busy"), t["requests_answered"], t["requests_offered"])
routers = ["direct", "sglang-cache_aware", "smg-cache_aware", "thunder@before", "thunder"]
print("| cell | " + " | ".join(routers) + " |")
print("|---|" + "---:|" * len(routers))
for cell, d in rows.items():
    out = []
    for k in routers:
        if k in d:
            p50, p99, slo, hit, busy, a, o = d[k]
            out.append(f"{p50:.2f} / {p99:.2f} s, {100*slo:.1f}%, hit {100*hit:.1f}%" + ("" if a == o else f" ({a}/{o})"))
        else:
            out.append("–")
    busy = d.get("direct", (0,)*5)[4]
    print(f"| {cell} (busy {busy:.2f}) | " + " | ".join(out) + " |" if isinstance(busy, float) else f"| {cell} | " + " | ".join(out) + " |")
