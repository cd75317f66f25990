"""One CPU-engine grid cell over twelve workload seeds, every router of the grid, 900 s after
300 s (the grid's short window), thunder with either decay. Usage (repository root):

    PYTHONPATH=. python bench/results/decay-returns-des/cell_seeds.py PROFILE_YAML N

PROFILE_YAML: a grid cell's profile (a grid run writes them under its profiles/)."""
import statistics as S
import sys
from concurrent.futures import ProcessPoolExecutor

from thunder_sgl.benchmark.des.run import run_des
from thunder_sgl.benchmark.workloads.profile import load_profile
from thunder_sgl.config import load_config

RUNS = (("direct", None), ("sglang-cache_aware", None), ("smg-cache_aware", None),
        ("thunder", "paper"), ("thunder", "returns"))


def one(a):
    prof, n, seed, (router, decay) = a
    cfg = load_config().with_overrides({"scheduler.decay": decay}) if decay else None
    r = run_des("sglang-cpu-gpt2-small-t1", 1, router, load_profile(prof), n, 900, warmup_s=300, seed=seed,
                router_config=cfg)
    return a, r.steps_per_min, r.kv_hit_rate


if __name__ == "__main__":
    prof, n = sys.argv[1], int(sys.argv[2])
    jobs = [(prof, n, s, run) for run in RUNS for s in range(1, 13)]
    res: dict[str, list[float]] = {}
    with ProcessPoolExecutor(2) as ex:
        for (_, _, seed, (router, decay)), spm, hit in ex.map(one, jobs):
            name = router + (f" ({decay})" if decay else "")
            res.setdefault(name, []).append(spm)
            print(f"{name:20s} seed {seed:2d} {spm:7.1f} steps/min, KV hit {hit:.3f}", flush=True)
    best = max(S.mean(v) for k, v in res.items() if not k.startswith("thunder"))
    for k, v in res.items():
        print(f"{k:20s} mean {S.mean(v):6.1f} (sd {S.stdev(v):4.1f}), {S.mean(v) / best:.3f} of the best stock")
