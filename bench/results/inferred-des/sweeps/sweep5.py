import json
import sys

from thunder_sgl.benchmark.des.run import run_des
from thunder_sgl.config import ProgramsConfig, RouterConfig

cells = [("glm46-fp8-h100x8", 2, "mini-swe-agent", 140), ("glm46-fp8-h100x8", 2, "mini-swe-agent", 280),
         ("sglang-cpu-gpt2-small-t1", 1, "cpu-agent", 16), ("sglang-cpu-gpt2-small-t1", 1, "cpu-agent", 32), ("sglang-cpu-gpt2-small-t1", 1, "cpu-agent", 8)]
variants = [("thunder", "explicit", {}), ("thunder-inferred", "q0.98", dict(inferred_pause_quantile=0.98)),
            ("thunder-inferred", "q0.99", dict(inferred_pause_quantile=0.99))]
part = int(sys.argv[1])
for seed in (2, 3):
    for cl, nodes, prof, n in cells[part::2]:
        for router, name, kw in variants:
            r = run_des(cl, nodes, router, prof, n, 900, warmup_s=600, seed=seed,
                        router_config=RouterConfig(programs=ProgramsConfig(**kw)))
            print(json.dumps(dict(cell=f"{prof}-{n}", seed=seed, variant=name, spm=round(r.steps_per_min, 1))), flush=True)
