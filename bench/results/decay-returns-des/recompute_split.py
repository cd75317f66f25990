"""Where one ToolOrchestra DES run's recomputed prompt tokens come from: programs paused since
their previous request, programs never paused (their referenced KV evicted by the engine), first
steps. Usage (repository root): PYTHONPATH=. python bench/results/decay-returns-des/recompute_split.py N SEED [ROUTER [DECAY]]"""
import sys, collections
from thunder_sgl.benchmark.des import route
from thunder_sgl.benchmark.des.run import run_des
from thunder_sgl.benchmark.workloads.profile import load_profile

WARM = 3600
rec = []
orig = route.ThunderRouter.complete
last_pauses = {}
def complete(self, agent, c, now, overflow=False):
    t = agent.ticket
    if c is not None and c.error is None and now > WARM and t is not None:
        p = self.ctl.programs.get(agent.pid)
        pz = p.pauses if p is not None else -1
        prev = last_pauses.get(agent.pid, 0)
        rec.append((agent.step, c.prompt_tokens, c.cached_tokens, pz - prev, now))
        last_pauses[agent.pid] = pz
    elif t is not None:
        p = self.ctl.programs.get(agent.pid)
        if p is not None: last_pauses[agent.pid] = p.pauses
    return orig(self, agent, c, now, overflow)
route.ThunderRouter.complete = complete

n = int(sys.argv[1]); s = int(sys.argv[2]); router = sys.argv[3] if len(sys.argv) > 3 else "thunder"
from thunder_sgl.config import load_config
cfg = load_config().with_overrides({"scheduler.decay": sys.argv[4]}) if len(sys.argv) > 4 else None
r = run_des("qwen3-8b-rtx5090", 1, router, load_profile("toolorchestra"), n, 7200, warmup_s=WARM, seed=s, router_config=cfg)
print(router, n, s, "ratio %.3f" % (r.steps_per_min / r.ideal_steps_per_min), "hit %.3f" % r.kv_hit_rate, r.notes)
cat = collections.defaultdict(lambda: [0, 0, 0])
for step, pt, ct, dp, now in rec:
    k = "first" if step == 0 else ("paused" if dp > 0 else "kept")
    cat[k][0] += 1; cat[k][1] += pt; cat[k][2] += pt - ct
tot = sum(v[2] for v in cat.values())
for k, (cnt, pt, rc) in cat.items():
    print(f"  {k:7s} reqs {cnt:4d} prompt {pt/1e6:6.2f}M recompute {rc/1e6:6.2f}M ({rc/max(tot,1):.0%}) mean recompute/req {rc/cnt:7.0f}")
import statistics
kept = [(pt-ct, step, pt, ct, now) for step, pt, ct, dp, now in rec if step > 0 and dp == 0]
kept.sort(reverse=True)
print("kept recompute quantiles", [round(x) for x in statistics.quantiles([k[0] for k in kept], n=10)])
for k in kept[:15]: print("   ", k)
