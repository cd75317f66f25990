"""Where thunder's GPU time per step goes on ToolOrchestra (one simulated RTX 5090, N = 24, 32,
48, seeds 1–3, 7,200 s after 3,600 s), against the bound's (ideal.py, calibration.md §10).

From the DES engine's own counters over the window: decode and prefill iteration seconds per
completed step (no mixed chunks on this config: an iteration is one or the other), idle seconds
per step, the mean decode batch and the prompt tokens prefilled per step; from the scheduler's
ticks: pauses per step, the share of ticks a long waiter reserved the pool (nothing behind it
placed), and the scheduler's demand ÷ pool; from the engine's samples: the referenced KV
(capacity − free − evictable) ÷ capacity.

usage: python decompose.py ROUTER '{overrides}'
"""

import json
import statistics as st
import sys

from thunder_sgl.benchmark.des.run import DesRun
from thunder_sgl.benchmark.measures.ideal import ideal_bound
from thunder_sgl.config import RouterConfig
from thunder_sgl.scheduler import core

router = sys.argv[1]
ov = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
cfg = RouterConfig().with_overrides(ov) if ov else None
log: list[tuple[bool, int, float]] = []
orig = core.ThunderScheduler.tick


def tick(self, now, programs, backends):
    d = orig(self, now, programs, backends)
    if now >= 3600:
        demand = next(iter(d.demand.values())) / next(iter(d.pool.values()))
        log.append((d.reserved_for is not None, len(d.pauses), demand))
    return d


core.ThunderScheduler.tick = tick
orig_drain = DesRun.drain


def drain(self):
    self.end_totals = self._engine_totals(self.now)  # before the run's end aborts what runs
    orig_drain(self)


DesRun.drain = drain
print("| N | seed | ×bound | GPU s/step | decode s/step | prefill s/step | idle s/step | decode batch "
      "| prefill tok/step | pauses/step | referenced pool | reserving ticks | demand/pool |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
agg: dict[int, list[tuple[float, ...]]] = {}
b = None
for n in (24, 32, 48):
    b = ideal_bound("qwen3-8b-rtx5090", 1, "toolorchestra", n)
    for s in (1, 2, 3):
        log.clear()
        d = DesRun("qwen3-8b-rtx5090", 1, router, "toolorchestra", n, 7200, 3600, s, cfg, 5.0, None, False)
        r = d.run()
        e = d.end_totals
        w = d._warm
        span = e["t"] - w["t"]
        steps = d.window_steps
        busy = (e["busy"] - w["busy"]) / steps
        pre = (e["prefill_busy"] - w["prefill_busy"]) / steps
        idle = (span - (e["busy"] - w["busy"])) / steps
        ptok = (e["prefill"] - w["prefill"]) / steps
        batch = (e["generated"] - w["generated"]) / max(1, e["decode_steps"] - w["decode_steps"])
        used = st.mean(u[0] for t, u in d.rec.usage if t >= 3600)
        ratio = r.steps_per_min / r.ideal_steps_per_min
        res = st.mean(x[0] for x in log)
        pauses = sum(x[1] for x in log) / steps
        dem = st.mean(x[2] for x in log)
        row = (ratio, busy + idle, busy - pre, pre, idle, batch, ptok, pauses, used, res, dem)
        agg.setdefault(n, []).append(row)
        print(f"| {n} | {s} | {ratio:.3f} | {busy + idle:.2f} | {busy - pre:.2f} | {pre:.2f} | {idle:.3f} | {batch:.2f} "
              f"| {ptok:.0f} | {pauses:.2f} | {used:.2f} | {res:.2f} | {dem:.2f} |", flush=True)
    m = [st.mean(c) for c in zip(*agg[n], strict=True)]
    print(f"| {n} | mean | {m[0]:.3f} | {m[1]:.2f} | {m[2]:.2f} | {m[3]:.2f} | {m[4]:.3f} | {m[5]:.2f} | {m[6]:.0f} "
          f"| {m[7]:.2f} | {m[8]:.2f} | {m[9]:.2f} | {m[10]:.2f} |", flush=True)
assert b is not None
pt = b.point
print(f"| bound | – | 1 | {60 / b.steps_per_min:.2f} | {b.output * pt.tau / pt.batch:.2f} | {b.t_prefill:.2f} | 0 "
      f"| {pt.batch:.2f} | {b.new_prompt:.0f} | 0 | 1 (N_res {b.resident:.1f}) | – | – |")
