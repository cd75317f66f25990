"""ToolOrchestra (qwen3-8b-rtx5090, 7,200 s after 3,600 s) at one N, seeds 1..SEEDS, any router, with scheduler
overrides: mean of steps/min / the bound. Usage (repository root):
python bench/results/decay-returns-des/toolorchestra_n.py N SEEDS ROUTER[:JSON] ...
e.g. toolorchestra_n.py 48 24 thunder thunder-fixed 'thunder:{"scheduler.decay_base": 1.0}'"""
import sys, json, statistics
from concurrent.futures import ProcessPoolExecutor
from thunder_sgl.benchmark.des.run import run_des
from thunder_sgl.benchmark.workloads.profile import load_profile
from thunder_sgl.config import load_config
N = int(sys.argv[1]); K = int(sys.argv[2])
def one(a):
    router, ov, s = a
    cfg = load_config().with_overrides(ov) if ov else None
    r = run_des("qwen3-8b-rtx5090", 1, router, load_profile("toolorchestra"), N, 7200, warmup_s=3600, seed=s, router_config=cfg)
    return r.steps_per_min / r.ideal_steps_per_min, r.kv_hit_rate
if __name__ == "__main__":
    for v in sys.argv[3:]:
        router, _, ovs = v.partition(":")
        ov = json.loads(ovs) if ovs else {}
        with ProcessPoolExecutor(2) as ex:
            res = list(ex.map(one, [(router, ov, s) for s in range(1, K + 1)]))
        xs = [r[0] for r in res]; hs = [r[1] for r in res]
        print(f"N={N} {router} {ov}: {statistics.mean(xs):.3f} (se {statistics.stdev(xs)/len(xs)**.5:.3f}) hit {statistics.mean(hs):.3f}", flush=True)
