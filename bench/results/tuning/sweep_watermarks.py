import json
import time

from thunder_sgl.benchmark.des.run import run_des
from thunder_sgl.config import RouterConfig, SchedulerConfig

out = open("/tmp/exp/sweep4.jsonl", "a")
variants = {
    "lmin0.8": dict(lambda_min=0.8),
    "lmin0.85": dict(lambda_min=0.85),
    "lmin0.9": dict(lambda_min=0.9),
    "lmax0.95-lmin0.85": dict(lambda_max=0.95, lambda_min=0.85),
    "default": {},
}
for cluster in ("glm46-fp8-h100x8", "glm46-fp8-h100x8-hicache"):
    for n in (118, 236, 354):
        for name, kw in variants.items():
            t = time.time()
            r = run_des(
                cluster,
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
                cluster=cluster,
                n=n,
                v=name,
                spm=round(r.steps_per_min, 1),
                hit=round(r.kv_hit_rate, 3),
                recompute=r.recompute_tokens,
                ideal=round(r.ideal_steps_per_min, 1),
                p50=round(r.program_completion_p50_s),
                wall=round(time.time() - t, 1),
            )
            print(json.dumps(row), flush=True)
            out.write(json.dumps(row) + "\n")
            out.flush()
