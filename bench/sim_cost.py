"""CPU cost of the simulator: simulated seconds per wall second on a mini-SWE-agent-like load.

In-process engines (no HTTP), one discrete-event loop over N nodes and P programs in a closed
loop. Each program: a shared system prompt (~1.5 K tokens), then ~30 steps; a step sends the
whole conversation so far, gets ~250 output tokens, runs a tool (lognormal, median 0.5 s) and
appends an observation, so the context grows by ~800 tokens per step. Program i is pinned to
node i mod N (sticky routing: the simplest policy, not a recommendation).

    PYTHONPATH=. python bench/sim_cost.py                 # 8 nodes × 256 programs, GLM-4.6-FP8
    PYTHONPATH=. python bench/sim_cost.py --nodes 64 --programs 2000 --steps 30
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import time

import numpy as np

from thunder_sgl.sim import SimRequest, SimWorker, load_sim_config


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="glm46-fp8-h100x8")
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--programs", type=int, default=256)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--system-tokens", type=int, default=1500)
    ap.add_argument("--observation-tokens", type=int, default=550, help="mean new tokens per step besides the output")
    ap.add_argument("--output-tokens", type=int, default=250)
    ap.add_argument("--tool-median", type=float, default=0.5)
    ap.add_argument("--tool-sigma", type=float, default=1.2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    cfg = load_sim_config(args.config)
    workers = [SimWorker(cfg, i) for i in range(args.nodes)]
    rng = random.Random(args.seed)
    nrng = np.random.default_rng(args.seed)

    def fresh(n: int) -> bytes:
        return nrng.integers(1 << 24, 1 << 31, size=n, dtype=np.uint32).tobytes()

    system = fresh(args.system_tokens)
    context = [system + fresh(200) for _ in range(args.programs)]  # system prompt + the task
    steps = [0] * args.programs
    agents: list[tuple[float, int, int]] = []  # (time, seq, program)
    for p in range(args.programs):
        heapq.heappush(agents, (rng.uniform(0, 5.0), p, p))
    seq = args.programs
    done_steps = 0
    total_steps = args.programs * args.steps
    # one heap of (next event time, worker) with lazy invalidation: only workers whose next event
    # is due are advanced, so the loop costs O(log N) per event, not O(N)
    wheap: list[tuple[float, int]] = []
    queued: list[float | None] = [None] * args.nodes

    def requeue(i: int) -> None:
        nxt = workers[i].next_event_time()
        if nxt is not None and nxt != queued[i]:
            heapq.heappush(wheap, (nxt, i))
        queued[i] = nxt

    t = 0.0
    wall0 = time.perf_counter()
    while done_steps < total_steps:
        t = min(wheap[0][0] if wheap else math.inf, agents[0][0] if agents else math.inf)
        while wheap and wheap[0][0] <= t:
            te, i = heapq.heappop(wheap)
            if queued[i] != te:
                continue  # stale entry
            queued[i] = None
            for c in workers[i].advance(t):
                p = int(c.rid.split(":")[0])
                context[p] += c.output_ids.tobytes()
                steps[p] += 1
                done_steps += 1
                if steps[p] < args.steps:
                    tool = min(60.0, args.tool_median * math.exp(args.tool_sigma * rng.gauss(0, 1)))
                    obs = max(50, int(rng.expovariate(1.0 / args.observation_tokens)))
                    context[p] += fresh(obs)
                    seq += 1
                    heapq.heappush(agents, (c.time + tool, seq, p))
            requeue(i)
        while agents and agents[0][0] <= t:
            _, _, p = heapq.heappop(agents)
            i = p % args.nodes
            workers[i].submit(SimRequest(f"{p}:{steps[p]}", context[p], args.output_tokens), t)
            requeue(i)
    wall = time.perf_counter() - wall0

    prompt = sum(w.counters.prompt_tokens for w in workers)
    cached = sum(w.counters.cached_tokens for w in workers)
    retract = sum(w.counters.retractions for w in workers)
    evicted = sum(e.cache.counters.evicted_device for w in workers for e in w.engines)
    print(f"config={cfg.name} nodes={args.nodes} programs={args.programs} steps/program={args.steps}")
    print(f"simulated {t:.1f} s in {wall:.2f} s wall: {t / wall:.1f} simulated s per wall s")
    print(f"steps/min={done_steps / t * 60:.1f}  KV hit rate={cached / max(1, prompt):.3f}  "
          f"retractions={retract}  evicted tokens={evicted}  mean final context={sum(len(c) for c in context) / 4 / args.programs:.0f}")


if __name__ == "__main__":
    main()
