"""ToolOrchestra on one simulated RTX 5090: thunder's steps/min ÷ the bound at N = 24, 32, 48,
three seeds, 7,200 s after 3,600 s, with router config overrides (dotted names).

usage: python ablation.py ROUTER '{"scheduler.admission.mode": "fixed"}' [NS] [SEEDS] [PROFILE]
"""

import json
import statistics as st
import sys

from thunder_sgl.benchmark.des.run import run_des
from thunder_sgl.config import RouterConfig

router = sys.argv[1]
ov = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
ns = [int(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "24,32,48").split(",")]
seeds = [int(x) for x in (sys.argv[4] if len(sys.argv) > 4 else "1,2,3").split(",")]
prof = sys.argv[5] if len(sys.argv) > 5 else "toolorchestra"
cfg = RouterConfig().with_overrides(ov) if ov else None
out = []
for n in ns:
    rs = []
    for s in seeds:
        r = run_des("qwen3-8b-rtx5090", 1, router, prof, n, 7200, 3600, s, router_config=cfg)
        rs.append(r.steps_per_min / r.ideal_steps_per_min)
        print(f"  N={n} s={s} ratio={rs[-1]:.3f} {r.notes}", flush=True)
    out.append(f"N={n}: {st.mean(rs):.3f} ({min(rs):.3f}-{max(rs):.3f})")
print(router, ov, " | ".join(out))
