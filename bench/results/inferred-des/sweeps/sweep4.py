import json
import sys

from thunder_sgl.benchmark.des.run import run_des
from thunder_sgl.config import ProgramsConfig, RouterConfig

cells = [("glm46-fp8-h100x8", 2, "mini-swe-agent", 140), ("glm46-fp8-h100x8", 2, "mini-swe-agent", 280),
         ("sglang-cpu-gpt2-small-t1", 1, "cpu-agent", 16), ("sglang-cpu-gpt2-small-t1", 1, "cpu-agent", 32), ("sglang-cpu-gpt2-small-t1", 1, "cpu-agent", 8)]
variants = {"q0.95": dict(inferred_pause_quantile=0.95), "q0.98": dict(inferred_pause_quantile=0.98),
            "q0.99min5": dict(inferred_pause_min_seconds=5.0)}
part = int(sys.argv[1])
for cl, nodes, prof, n in cells[part::2]:
    for name, kw in variants.items():
        r = run_des(cl, nodes, "thunder-inferred", prof, n, 900, warmup_s=600, seed=1,
                    router_config=RouterConfig(programs=ProgramsConfig(**kw)))
        print(json.dumps(dict(cell=f"{prof}-{n}", variant=name, spm=round(r.steps_per_min, 1))), flush=True)
