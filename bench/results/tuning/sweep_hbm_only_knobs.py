import json
import time

from thunder_sgl.benchmark.des.run import run_des
from thunder_sgl.config import RouterConfig, SchedulerConfig

out = open("/tmp/exp/sweep3.jsonl", "a")
variants = {
    "default": {},
    "lmin0.9": {"lambda_min": 0.9},
    "lmin0.95": {"lambda_min": 0.95},
    "x4": {"decay_base": 4.0},
    "x1.5": {"decay_base": 1.5},
    "tick2": {"tick_seconds": 2.0},
    "lmax1.05": {"lambda_max": 1.05, "lambda_min": 1.05},
}
for n in (236, 354):
    for name, kw in variants.items():
        t = time.time()
        r = run_des(
            "glm46-fp8-h100x8",
            2,
            "thunder",
            "mini-swe-agent",
            n,
            1200,
            warmup_s=1800,
            seed=1,
            router_config=RouterConfig(scheduler=SchedulerConfig(**kw)),
        )
        row = dict(
            n=n,
            v=name,
            spm=round(r.steps_per_min, 1),
            hit=round(r.kv_hit_rate, 3),
            recompute=r.recompute_tokens,
            ideal=round(r.ideal_steps_per_min, 1),
            wall=round(time.time() - t, 1),
            notes=r.notes[:200],
        )
        print(json.dumps(row), flush=True)
        out.write(json.dumps(row) + "\n")
        out.flush()
