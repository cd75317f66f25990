"""The context-overflow end hint in the DES: thunder with explicit ids against thunder-inferred,
with the hint and without it (``--no-hint``: the DES router ignores the engine's refusal, as
the gateway did before it read SGLang's 400). One JSON row per run, appended to OUT.

    python bench/results/context-overflow-des/sweep.py toolorchestra OUT [--seeds 12] [--routers ...] [--no-hint]
    python bench/results/context-overflow-des/sweep.py mini-swe-agent-40k OUT [--seeds 6] [--routers ...] [--no-hint]

``toolorchestra``: one simulated RTX 5090 (qwen3-8b), N = 24, 32, 48, 7,200 s after 3,600 s,
as ``bench/toolorchestra_seeds.py`` (its profile has Qwen3-8B's 40,960-token window: about one
program in five reaches it). ``mini-swe-agent-40k``: mini-swe-agent with the same window (a
Qwen3-class model's; GLM-4.6's 200 K would cut none: 14% of its programs reach 40,960 tokens),
two GLM nodes, N = 140, 280, 900 s after 600 s, as ``bench/results/inferred-des/``. Each run in a
fresh process (``--no-hint`` patches the DES router). The rows before this change came from the
same script run against the commit before it (``PYTHONPATH`` of a worktree at df7a752, which
has no ``overflow`` argument and no refused call: the ``base`` rows).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from concurrent.futures import ProcessPoolExecutor

CELLS = {
    "toolorchestra": ("qwen3-8b-rtx5090", 1, (24, 32, 48), 7200.0, 3600.0, 0),
    "mini-swe-agent-40k": ("glm46-fp8-h100x8", 2, (140, 280), 900.0, 600.0, 40960),
}


def one(job: tuple[str, str, int, int, bool]) -> dict:
    cell, router, n, seed, no_hint = job
    from thunder_sgl.benchmark.des.run import run_des
    from thunder_sgl.benchmark.workloads.profile import load_profile

    if no_hint:
        from thunder_sgl.benchmark.des import route

        complete = route.ThunderRouter.complete
        route.ThunderRouter.complete = lambda self, agent, c, now, overflow=False: complete(self, agent, c, now)
    cluster, nodes, _, duration, warmup, window = CELLS[cell]
    name = "toolorchestra" if cell == "toolorchestra" else "mini-swe-agent"
    profile = load_profile(name)
    if window:
        profile = dataclasses.replace(profile, max_context_tokens=window)
    r = run_des(cluster, nodes, router, profile, n, duration, warmup_s=warmup, seed=seed)
    return {"cell": cell, "router": router, "n": n, "seed": seed, "no_hint": no_hint, "spm": r.steps_per_min,
            "ratio": r.steps_per_min / r.ideal_steps_per_min, "hit": r.kv_hit_rate, "errors": r.errors}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cell", choices=sorted(CELLS))
    ap.add_argument("out")
    ap.add_argument("--seeds", type=int, default=12)
    ap.add_argument("--routers", default="thunder,thunder-inferred")
    ap.add_argument("--no-hint", action="store_true")
    ap.add_argument("--tag", default="")
    a = ap.parse_args()
    jobs = [(a.cell, r, n, s, a.no_hint) for n in CELLS[a.cell][2] for s in range(1, a.seeds + 1)
            for r in a.routers.split(",")]
    with ProcessPoolExecutor(2, max_tasks_per_child=1) as ex, open(a.out, "a") as f:
        for row in ex.map(one, jobs):
            row["tag"] = a.tag
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(row["cell"], row["router"], row["n"], row["seed"], f"{row['spm']:.1f}", flush=True)


if __name__ == "__main__":
    main()
