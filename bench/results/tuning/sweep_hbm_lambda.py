import json
import time

from thunder_sgl.benchmark.des.run import run_des
from thunder_sgl.config import RouterConfig, SchedulerConfig

out = open("/tmp/exp/sweep2.jsonl", "a")
for n in (177, 236, 354):
    for lam in (1.0, 1.1, 1.2):
        t = time.time()
        r = run_des(
            "glm46-fp8-h100x8-hicache",
            2,
            "thunder",
            "mini-swe-agent",
            n,
            1200,
            warmup_s=1800,
            seed=1,
            router_config=RouterConfig(scheduler=SchedulerConfig(hbm_lambda=lam)),
        )
        row = dict(
            n=n,
            lam=lam,
            spm=round(r.steps_per_min, 1),
            hit=round(r.kv_hit_rate, 3),
            recompute=r.recompute_tokens,
            p50=round(r.program_completion_p50_s),
            wall=round(time.time() - t, 1),
        )
        print(json.dumps(row), flush=True)
        out.write(json.dumps(row) + "\n")
        out.flush()
    t = time.time()
    r = run_des(
        "glm46-fp8-h100x8-hicache",
        2,
        "thunder-paper",
        "mini-swe-agent",
        n,
        1200,
        warmup_s=1800,
        seed=1,
    )
    row = dict(
        n=n,
        lam="paper",
        spm=round(r.steps_per_min, 1),
        hit=round(r.kv_hit_rate, 3),
        recompute=r.recompute_tokens,
        p50=round(r.program_completion_p50_s),
        wall=round(time.time() - t, 1),
    )
    print(json.dumps(row), flush=True)
    out.write(json.dumps(row) + "\n")
    out.flush()
