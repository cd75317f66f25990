import dataclasses
import json
import time

from thunder_sgl.benchmark.des.run import run_des
from thunder_sgl.config import RouterConfig, SchedulerConfig
from thunder_sgl.sim import load_sim_config

out = open("/tmp/exp/sweep1.jsonl", "a")
for overlap in (0.0, 1.0):
    base = load_sim_config("glm46-fp8-h100x8-hicache")
    cfg = dataclasses.replace(
        base, timing=dataclasses.replace(base.timing, load_back_overlap=overlap)
    )
    for n in (236, 354):
        for name, router, rc in (
            ("thunder", "thunder", None),
            ("thunder-l1.1", "thunder", RouterConfig(scheduler=SchedulerConfig(hbm_lambda=1.1))),
            ("thunder-nogate", "thunder", RouterConfig(scheduler=SchedulerConfig(hbm_lambda=2.0))),
            ("thunder-paper", "thunder-paper", None),
        ):
            t = time.time()
            r = run_des(cfg, 2, router, "mini-swe-agent", n, 1200, warmup_s=1800, router_config=rc)
            row = dict(
                overlap=overlap,
                n=n,
                variant=name,
                spm=round(r.steps_per_min, 1),
                hit=round(r.kv_hit_rate, 3),
                recompute=r.recompute_tokens,
                ideal=round(r.ideal_steps_per_min, 1),
                wall=round(time.time() - t, 1),
                notes=r.notes[:300],
            )
            print(json.dumps(row), flush=True)
            out.write(json.dumps(row) + "\n")
            out.flush()
