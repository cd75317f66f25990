"""Time the scheduler's tick over 10,000 programs and 64 backends (issue: < 10 ms).

    python bench/tick_bench.py [--programs 10000] [--backends 64] [--repeat 50] [--inner 3] [--group-size 8]
                               [--cost-at change|tick]

The state is a steady state reached by the scheduler itself: 10,000 programs admitted by
ticks onto 64 GLM-4.6-like backends (1.05 M HBM tokens, host tier ×2), contexts 2–60 K
tokens, 40% reasoning, the rest acting for up to 30 s; the cluster is oversubscribed, so the
queue is long and every tick pauses and restores some programs. Reports the median and p90
of ``tick`` (decisions computed, not applied) and of a cold-start tick (all programs new).
Each tick's decisions are then applied and its admission states kept on the backends, as the
controller does (``control.controller``), so the goodput rule updates a running state.
With ``--group-size G`` the programs are groups of G samples of one task (RL rollouts) sharing
a 1,000-token task prompt, and placement is the group-aware one (``GroupPicker``).

``tick`` is pure, so each state is timed ``--inner`` times: the first evaluation is what a
router would see (it includes Python's GC and whatever else the machine is doing); the best
of the evaluations is the tick's own cost, robust to a busy machine. Both are reported.
Between ticks each program's change is told to the scheduler (``changed``), as the
controller's request path tells it: the costs of the ~3,000 programs changed are computed
there (``--cost-at tick``: left to the tick instead, as before 2026-12-08; the per-change cost
is timed and reported beside it).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from thunder_sgl.backends import Backend, Tiers
from thunder_sgl.config import SchedulerConfig
from thunder_sgl.programs import Program, ProgramTable, Usage
from thunder_sgl.scheduler import ThunderScheduler, apply
from thunder_sgl.scheduler.grouping import GroupPicker


def build(n_programs: int, n_backends: int, seed: int = 1,
          group_size: int = 0) -> tuple[ThunderScheduler, ProgramTable, list[Backend]]:
    rng = random.Random(seed)
    backends = [
        Backend(f"http://node{i}:30000", 0, Tiers(hbm_tokens=1_050_000, host_tokens=2_100_000))
        for i in range(n_backends)
    ]
    table = ProgramTable()
    policy = ThunderScheduler(SchedulerConfig(), picker=GroupPicker() if group_size else None)
    for i in range(n_programs):
        gid = f"task-{i // group_size}" if group_size else None
        p = table.create(f"prog-{i}", 0.0, gid, 1000)
        if p.group is not None:
            p.group_key = p.group.key
        p.prefix_key, p.shared_prefix_tokens = "swe-system", 1500
        p.pending_prompt_tokens = rng.randint(2_000, 60_000)
        p.held = 1
    apply(policy.tick(0.0, table, backends), table, 0.0)
    for p in table:
        p.held = 0
        if p.active:  # give admitted programs a history, some reasoning, some acting
            p.start_request(0.0, p.pending_prompt_tokens)
            p.finish_request(rng.uniform(0, 5), Usage(p.pending_prompt_tokens, 300), 0.3)
            if rng.random() < 0.4:
                p.start_request(5.0, p.context_tokens + 500)
    return policy, table, backends


def evolve(table: ProgramTable, now: float, rng: random.Random) -> list[Program]:
    """One tick's worth of agent progress: steps finish (contexts grow), tools return.
    Returns the programs changed."""
    changed = []
    for p in table:
        if not p.active:
            if p.held == 0 and rng.random() < 0.5:
                p.hold(now, p.context_tokens + 800)  # a paused program's next request arrives
                changed.append(p)
            continue
        if p.in_flight:
            if rng.random() < 0.5:
                p.finish_request(now, Usage(p.pending_prompt_tokens, 300), 0.3)
                changed.append(p)
        elif rng.random() < 0.6:
            p.start_request(now, p.context_tokens + 800)
            changed.append(p)
    return changed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--programs", type=int, default=10_000)
    ap.add_argument("--backends", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--inner", type=int, default=3, help="evaluations of each state's tick (it is pure)")
    ap.add_argument("--group-size", type=int, default=0, help="programs per group (RL task); 0: no groups")
    ap.add_argument("--cost-at", choices=["change", "tick"], default="change",
                    help="change: each change told to the scheduler between ticks, as the controller does; "
                         "tick: the changed programs' costs left to the tick")
    args = ap.parse_args()

    policy, table, backends = build(args.programs, args.backends, group_size=args.group_size)
    by_key = {b.key: b for b in backends}
    rng = random.Random(3)
    now, first, best, decisions, per_change = 5.0, [], [], [], []
    for _ in range(args.repeat):
        now += policy.cfg.tick_seconds
        changed = evolve(table, now, rng)
        if args.cost_at == "change":  # the controller's request path, once per change (timed apart)
            t0 = time.perf_counter()
            for p in changed:
                policy.changed(p)
            per_change.append(((time.perf_counter() - t0) * 1e3, len(changed)))
        times = []
        for _ in range(max(1, args.inner)):
            t0 = time.perf_counter()
            d = policy.tick(now, table, backends)
            times.append((time.perf_counter() - t0) * 1e3)
        first.append(times[0])
        best.append(min(times))
        decisions.append((len(d.pauses), len(d.placements)))
        apply(d, table, now)
        for key, level in d.admission.items():  # kept for the next tick, as the controller keeps it
            by_key[key].admission = level
    active = sum(1 for p in table if p.active)
    print(f"programs={len(table)} backends={len(backends)} active={active} waiting={table.waiting_count}; "
          f"pauses/placements per tick (mean): {statistics.mean(a for a, _ in decisions):.1f}/"
          f"{statistics.mean(b for _, b in decisions):.1f}")
    for label, samples in (("steady tick, first evaluation", first), (f"steady tick, best of {args.inner}", best)):
        samples.sort()
        print(f"{label}: median {statistics.median(samples):.2f} ms, p90 {samples[int(0.9 * len(samples))]:.2f} ms, "
              f"max {samples[-1]:.2f} ms over {len(samples)} ticks")
    if per_change:
        ms, n = sum(x for x, _ in per_change), sum(k for _, k in per_change)
        print(f"request path (changed, once per change): {1e3 * ms / n:.2f} us per change, "
              f"{ms / len(per_change):.2f} ms over a tick's {n / len(per_change):.0f} changes")
    cold = []
    for _ in range(5):
        fresh = ProgramTable()
        rng = random.Random(2)
        for i in range(args.programs):
            p = fresh.create(f"n{i}", 0.0)
            p.pending_prompt_tokens, p.held = rng.randint(2_000, 60_000), 1
        t0 = time.perf_counter()
        policy.tick(0.0, fresh, backends)
        cold.append((time.perf_counter() - t0) * 1e3)
    print(f"cold-start tick ({args.programs} new programs at once): median {statistics.median(cold):.2f} ms")


if __name__ == "__main__":
    main()
