"""ToolOrchestra on one simulated RTX 5090 (qwen3-8b), thunder over 24 seeds at N = 24, 32, 48:
7,200 s measured after 3,600 s, each run's steps/min ÷ its bound (``ideal_steps_per_min``).
One seed swings a run by ±6% (standard deviation about 0.04), so the goal (≥ 0.90 of the bound)
is read on the mean of 24 (standard error about 0.008). Eight seeds were used until v10; their
means moved by up to 0.02 with the seeds alone (v11's header). About 4 minutes on two cores.

    python bench/toolorchestra_seeds.py > bench/results/toolorchestra-rtx5090-des-24seeds-<tag>.txt
    python bench/toolorchestra_seeds.py --seeds 8 ...   # the old eight
    python bench/toolorchestra_seeds.py --decay returns ...   # scheduler.decay (default: the config's)
"""

import statistics
from concurrent.futures import ProcessPoolExecutor

from thunder_sgl.benchmark.des.run import run_des
from thunder_sgl.benchmark.workloads.profile import load_profile
from thunder_sgl.config import load_config


def one(a):
    n, s, decay = a
    cfg = load_config().with_overrides({"scheduler.decay": decay}) if decay else None
    r = run_des("qwen3-8b-rtx5090", 1, "thunder", load_profile("toolorchestra"), n, 7200, warmup_s=3600, seed=s,
                router_config=cfg)
    adm = [x for x in r.notes.split() if x.startswith("admission=")]
    return n, s, r.steps_per_min / r.ideal_steps_per_min, adm


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=24)
    ap.add_argument("--decay", choices=["paper", "returns"], default=None)
    args = ap.parse_args()
    k = args.seeds
    jobs = [(n, s, args.decay) for n in (24, 32, 48) for s in range(1, k + 1)]
    res = {}
    with ProcessPoolExecutor(2) as ex:
        for n, s, ratio, adm in ex.map(one, jobs):
            res[(n, s)] = ratio
            print(f"  N={n} s={s} ratio={ratio:.3f} {adm}", flush=True)
    for n in (24, 32, 48):
        xs = [res[(n, s)] for s in range(1, k + 1)]
        mean, sd = statistics.mean(xs), statistics.stdev(xs)
        print(f"N={n} mean {mean:.3f} (sd {sd:.3f}, se {sd / len(xs) ** 0.5:.3f}, seeds 1-{k})")
