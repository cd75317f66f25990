import json
import sys
import time

from thunder_sgl.benchmark.des.run import run_des
from thunder_sgl.config import ProgramsConfig, RouterConfig

cells = {"a": [("glm46-fp8-h100x8", 2, "mini-swe-agent", 140), ("glm46-fp8-h100x8", 2, "mini-swe-agent", 280)],
         "b": [("sglang-cpu-gpt2-small-t1", 1, "cpu-agent", 16), ("sglang-cpu-gpt2-small-t1", 1, "cpu-agent", 32)]}[sys.argv[1]]
variants = {"off": dict(inferred_pause_min_seconds=1e5), "q0.9": {}, "q0.99": dict(inferred_pause_quantile=0.99),
            "q1.0": dict(inferred_pause_quantile=1.0), "q0.99min5": dict(inferred_pause_quantile=0.99, inferred_pause_min_seconds=5.0)}
out = open(f"/tmp/dormsweep/{sys.argv[1]}.jsonl", "a")
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
