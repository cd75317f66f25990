"""ToolOrchestra on one simulated RTX 5090 (qwen3-8b), thunder over eight seeds at N = 24, 32, 48:
7,200 s measured after 3,600 s, each run's steps/min ÷ its bound (``ideal_steps_per_min``).
One seed swings a run by ±5%, so the goal (≥ 0.90 of the bound) is read on the mean of eight.

    python bench/toolorchestra_seeds.py > bench/results/toolorchestra-rtx5090-des-8seeds-<tag>.txt
"""

from concurrent.futures import ProcessPoolExecutor

from thunder_sgl.benchmark.des.run import run_des
from thunder_sgl.benchmark.workloads.profile import load_profile


def one(a):
    n, s = a
    r = run_des("qwen3-8b-rtx5090", 1, "thunder", load_profile("toolorchestra"), n, 7200, warmup_s=3600, seed=s)
    adm = [x for x in r.notes.split() if x.startswith("admission=")]
    return n, s, r.steps_per_min / r.ideal_steps_per_min, adm


if __name__ == "__main__":
    jobs = [(n, s) for n in (24, 32, 48) for s in range(1, 9)]
    res = {}
    with ProcessPoolExecutor(2) as ex:
        for n, s, ratio, adm in ex.map(one, jobs):
            res[(n, s)] = ratio
            print(f"  N={n} s={s} ratio={ratio:.3f} {adm}", flush=True)
    for n in (24, 32, 48):
        xs = [res[(n, s)] for s in range(1, 9)]
        print(f"N={n} mean {sum(xs)/len(xs):.3f}")
