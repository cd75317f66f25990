import dataclasses
import sys

from thunder_sgl.benchmark.des.run import run_des
from thunder_sgl.benchmark.grid import parse_cells
from thunder_sgl.benchmark.workloads.profile import WorkloadProfile
from thunder_sgl.config import RouterConfig

cell = parse_cells(sys.argv[1])[0]
prof = WorkloadProfile.from_dict(cell.profile(24576))
n = cell.programs(24576, 1)
def rc(**kw):
    adm = kw.pop("adm", {})
    base = RouterConfig()
    sch = dataclasses.replace(base.scheduler, admission=dataclasses.replace(base.scheduler.admission, **adm), **kw)
    return dataclasses.replace(base, scheduler=sch)
variants = {"default": rc(), "probe_up_off": rc(adm={"probe_up": "off"}), "no_refs": rc(session_refs=False),
            "min_gain_0": rc(adm={"min_gain": 0.0})}
for seed in (1, 2):
    d = run_des("sglang-cpu-gpt2-small-t1", 1, "direct", prof, n, 1800, warmup_s=3600, seed=seed).steps_per_min
    out = [f"direct {d:.1f}"]
    for name, cfg in variants.items():
        r = run_des("sglang-cpu-gpt2-small-t1", 1, "thunder", prof, n, 1800, warmup_s=3600, seed=seed, router_config=cfg)
        adm = [x for x in r.notes.split() if x.startswith("admission=")]
        out.append(f"{name} {r.steps_per_min:.1f} ({r.steps_per_min/d:.2f}) {adm}")
    print(seed, " | ".join(out), flush=True)
