"""ToolOrchestra (qwen3-8b-rtx5090, N = 24/32/48, 7,200 s after 3,600 s) with scheduler overrides, seeds 1..SEEDS,
mean of steps/min ÷ the bound per N. Usage (repository root):
PYTHONPATH=. python bench/results/decay-returns-des/toolorchestra_variants.py SEEDS VARIANT...
VARIANT: base (the config's defaults) or key=value,key=value (dotted overrides, e.g. scheduler.decay=returns)."""
import sys, statistics, json
from concurrent.futures import ProcessPoolExecutor
from thunder_sgl.benchmark.des.run import run_des
from thunder_sgl.benchmark.workloads.profile import load_profile
from thunder_sgl.config import load_config

def parse(v):
    try: return json.loads(v)
    except Exception: return v

def one(a):
    n, s, ov, prof, cluster, warm, dur = a
    cfg = load_config().with_overrides(ov) if ov else None
    r = run_des(cluster, 1, "thunder", load_profile(prof), n, dur, warmup_s=warm, seed=s, router_config=cfg)
    return n, s, r.steps_per_min / r.ideal_steps_per_min, r.kv_hit_rate

if __name__ == "__main__":
    k = int(sys.argv[1]); variants = sys.argv[2:]
    prof, cluster, ns, warm, dur = "toolorchestra", "qwen3-8b-rtx5090", (24, 32, 48), 3600, 7200
    for v in variants:
        ov = {} if v == "base" else {kv.split("=")[0]: parse(kv.split("=")[1]) for kv in v.split(",")}
        jobs = [(n, s, ov, prof, cluster, warm, dur) for n in ns for s in range(1, k + 1)]
        res = {}
        with ProcessPoolExecutor(2) as ex:
            for n, s, ratio, hit in ex.map(one, jobs):
                res[(n, s)] = (ratio, hit)
        out = [v]
        for n in ns:
            xs = [res[(n, s)][0] for s in range(1, k + 1)]
            hs = [res[(n, s)][1] for s in range(1, k + 1)]
            out.append(f"N={n} {statistics.mean(xs):.3f} (hit {statistics.mean(hs):.3f})")
        print("  ".join(out), flush=True)
