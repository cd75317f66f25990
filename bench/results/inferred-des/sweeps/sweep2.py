import json
import sys
import time

from thunder_sgl.benchmark.des.run import run_des
from thunder_sgl.config import ProgramsConfig, RouterConfig

cells = {"a": [("glm46-fp8-h100x8", 2, "mini-swe-agent", 140), ("glm46-fp8-h100x8", 2, "mini-swe-agent", 280)],
         "b": [("sglang-cpu-gpt2-small-t1", 1, "cpu-agent", 16), ("sglang-cpu-gpt2-small-t1", 1, "cpu-agent", 32), ("sglang-cpu-gpt2-small-t1", 1, "cpu-agent", 8)]}[sys.argv[1]]
variants = {"own1.5": dict(inferred_pause_quantile=0, inferred_pause_own_factor=1.5),
            "own2": dict(inferred_pause_quantile=0, inferred_pause_own_factor=2.0),
            "own1.5q0.9": dict(inferred_pause_quantile=0.9, inferred_pause_own_factor=1.5),
            "own2q0.9": dict(inferred_pause_quantile=0.9, inferred_pause_own_factor=2.0),
            "own1.5q0.9idle2": dict(inferred_pause_quantile=0.9, inferred_pause_own_factor=1.5, inferred_idle_tool_factor=2.0),
            "q0.99idle2": dict(inferred_pause_quantile=0.99, inferred_idle_tool_factor=2.0),
            }
out = open(f"/tmp/dormsweep/{sys.argv[1]}2.jsonl", "a")
for cl, nodes, prof, n in cells:
    for router, vs in (("thunder", {"explicit": {}}), ("thunder-inferred", variants)):
        for name, kw in vs.items():
            t = time.time()
            r = run_des(cl, nodes, router, prof, n, 900, warmup_s=600, seed=1,
                        router_config=RouterConfig(programs=ProgramsConfig(**kw)))
            row = dict(cell=f"{prof}-{n}", router=router, variant=name, spm=round(r.steps_per_min, 1),
                       hit=round(r.kv_hit_rate, 3), wall=round(time.time() - t, 1),
                       dormant=[x for x in r.notes.split() if x.startswith("dormant=")])
            print(json.dumps(row), flush=True)
            out.write(json.dumps(row) + "\n")
            out.flush()
