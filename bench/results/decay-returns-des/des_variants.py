"""thunder in DES runs with scheduler overrides, side by side (two processes). Usage (repository root):
PYTHONPATH=. python bench/results/decay-returns-des/des_variants.py CLUSTER NODES PROFILE N1,N2 DURATION WARMUP SEEDS VARIANT...
VARIANT: base (the config's defaults) or key=value,key=value (dotted scheduler overrides)."""
import sys, json, time
from concurrent.futures import ProcessPoolExecutor
from thunder_sgl.benchmark.des.run import run_des
from thunder_sgl.benchmark.workloads.profile import load_profile
from thunder_sgl.config import load_config
def parse(v):
    try: return json.loads(v)
    except Exception: return v
def one(a):
    cluster, nodes, prof, n, dur, warm, seed, v = a
    ov = {} if v == "base" else {kv.split("=")[0]: parse(kv.split("=")[1]) for kv in v.split(",")}
    cfg = load_config().with_overrides(ov) if ov else None
    t = time.time()
    r = run_des(cluster, nodes, "thunder", load_profile(prof), n, dur, warmup_s=warm, seed=seed, router_config=cfg)
    return a, r.steps_per_min, r.kv_hit_rate, r.steps_per_min / r.ideal_steps_per_min, time.time() - t
if __name__ == "__main__":
    cluster, nodes, prof, ns, dur, warm, seeds = sys.argv[1], int(sys.argv[2]), sys.argv[3], [int(x) for x in sys.argv[4].split(",")], float(sys.argv[5]), float(sys.argv[6]), [int(x) for x in sys.argv[7].split(",")]
    vs = sys.argv[8:]
    jobs = [(cluster, nodes, prof, n, dur, warm, s, v) for n in ns for s in seeds for v in vs]
    with ProcessPoolExecutor(2) as ex:
        for a, spm, hit, ratio, wall in ex.map(one, jobs):
            print(f"{a[3]} s{a[6]} {a[7]:40s} spm {spm:8.1f} hit {hit:.3f} of-bound {ratio:.3f} wall {wall:.0f}s", flush=True)
