"""The DES sweeps of the dormant rule behind ../README.md: thunder with ids and thunder-inferred
under variants of ``ProgramsConfig``, 900 s after 600 s. ``python sweep.py SET PART`` runs one
set's cells ``PART::2`` (two processes for two cores) and appends rows to ``SET.jsonl`` here.

The sets ran against the code of their moment (the rows are what that code measured): ``1``
ranked candidates by idle time; ``2`` also used ``inferred_pause_own_factor`` (a threshold from
the program's own longest tool, since removed, so set 2 no longer runs); ``3`` and later rank
by idle ÷ longest tool as the code now does (``3.jsonl`` stops before its last row); ``s4`` and
``s5`` ran the final code (``s5``: seeds 2 and 3); ``s6`` tried ``dormant_keeps_place`` (a
dormant program that asks again queues from when it went dormant; since removed, so ``s6`` no
longer runs). ``s7`` scanned the belief of the
probability rule, ``s8`` ran its default, ``s9`` the same after the silences were taken at the
request's arrival (``Served.returns``), ``s10`` the KV references of likely ended programs
dropped (``inferred_unref_belief``, P(ended) at which an idle inferred program's KV reference
was closed while it kept its place) beside that default, and ``s11`` the better of them, u0.5, on
fresh seeds 4–6: worst cell 0.972 against 0.966 on seeds 1–3, then 0.963 against 0.969 on 4–6, a
gain that did not hold, so the option was removed and ``s10``/``s11`` no longer run. ``s12`` ran
the default on seeds 1–12; ``s13`` the mini-swe-agent cells with the end sign
(``conversations`` rule 7) on a share of the programs' last answers (the profile's
``end_sign_share``; the explicit-id rows are ``s12``'s, run for run); ``s14`` the default on
seeds 1–12 after the admission rule counted likely ended programs out of the programs that
cycle (``Program.ended_p``; the explicit rows and the mini-swe-agent cells are ``s12``'s run
for run)."""

import dataclasses
import json
import sys
import time

from thunder_sgl.benchmark.des.run import run_des
from thunder_sgl.benchmark.workloads.profile import load_profile
from thunder_sgl.config import ProgramsConfig, RouterConfig

MINI = [("glm46-fp8-h100x8", 2, "mini-swe-agent", 140), ("glm46-fp8-h100x8", 2, "mini-swe-agent", 280)]
CPU = [("sglang-cpu-gpt2-small-t1", 1, "cpu-agent", n) for n in (16, 32, 8)]
EXPLICIT = ("thunder", "explicit", {})
SETS = {
    "1": (MINI + CPU[:2], (1,), [EXPLICIT] + [("thunder-inferred", k, v) for k, v in {
        "off": dict(inferred_pause_min_seconds=1e5), "q0.9": {}, "q0.99": dict(inferred_pause_quantile=0.99),
        "q1.0": dict(inferred_pause_quantile=1.0),
        "q0.99min5": dict(inferred_pause_quantile=0.99, inferred_pause_min_seconds=5.0)}.items()]),
    "2": (MINI + CPU, (1,), [EXPLICIT] + [("thunder-inferred", k, v) for k, v in {
        "own1.5": dict(inferred_pause_quantile=0, inferred_pause_own_factor=1.5),
        "own2": dict(inferred_pause_quantile=0, inferred_pause_own_factor=2.0),
        "own1.5q0.9": dict(inferred_pause_quantile=0.9, inferred_pause_own_factor=1.5),
        "own2q0.9": dict(inferred_pause_quantile=0.9, inferred_pause_own_factor=2.0),
        "own1.5q0.9idle2": dict(inferred_pause_quantile=0.9, inferred_pause_own_factor=1.5, inferred_idle_tool_factor=2.0),
        "q0.99idle2": dict(inferred_pause_quantile=0.99, inferred_idle_tool_factor=2.0)}.items()]),
    "3": (MINI + CPU, (1,), [EXPLICIT] + [("thunder-inferred", k, v) for k, v in {
        "r-q0.9": dict(inferred_pause_quantile=0.9),
        "r-own1q0.9": dict(inferred_pause_quantile=0.9, inferred_pause_own_factor=1.0),
        "r-own1.5q0.9": dict(inferred_pause_quantile=0.9, inferred_pause_own_factor=1.5),
        "r-q0.99": dict(inferred_pause_quantile=0.99),
        "r-own1q0.99": dict(inferred_pause_quantile=0.99, inferred_pause_own_factor=1.0)}.items()]),
    "s4": (MINI + CPU, (1,), [("thunder-inferred", k, v) for k, v in {
        "q0.95": dict(inferred_pause_quantile=0.95), "q0.98": dict(inferred_pause_quantile=0.98),
        "q0.99min5": dict(inferred_pause_quantile=0.99, inferred_pause_min_seconds=5.0)}.items()]),
    "s5": (MINI + CPU, (2, 3), [EXPLICIT, ("thunder-inferred", "q0.98", dict(inferred_pause_quantile=0.98)),
                                ("thunder-inferred", "q0.99", dict(inferred_pause_quantile=0.99))]),
    "s6": (MINI + CPU, (1, 2), [EXPLICIT] + [("thunder-inferred", k, v) for k, v in {
        "q0.98-place-off": dict(dormant_keeps_place=False), "q0.98-place": {},
        "q0.95-place": dict(inferred_pause_quantile=0.95), "q0.9-place": dict(inferred_pause_quantile=0.9)}.items()]),
    "s7": (MINI + CPU, (1, 2, 3), [EXPLICIT] + [("thunder-inferred", f"b{b}", dict(inferred_pause_belief=b))
                                              for b in (0.3, 0.5, 0.7, 0.8, 0.9, 0.95)]),
    "s8": (MINI + CPU, (1, 2, 3), [EXPLICIT, ("thunder-inferred", "b0.9", {})]),
    "s9": (MINI + CPU, (1, 2, 3), [EXPLICIT] + [("thunder-inferred", f"b{b}", dict(inferred_pause_belief=b))
                                              for b in (0.9, 0.8, 0.7)]),
    "s10": (MINI + CPU, (1, 2, 3), [("thunder-inferred", "b0.9", {})] + [
        ("thunder-inferred", f"u{u}", dict(inferred_unref_belief=u)) for u in (0.5, 0.7)]),
    "s11": (MINI + CPU, (4, 5, 6), [EXPLICIT, ("thunder-inferred", "b0.9", {}),
                                    ("thunder-inferred", "u0.5", dict(inferred_unref_belief=0.5))]),
    "s12": (MINI + CPU, tuple(range(1, 13)), [EXPLICIT, ("thunder-inferred", "b0.9", {})]),
    "s13": (MINI, tuple(range(1, 13)), [EXPLICIT] + [("thunder-inferred", f"sign{x}", {"end_sign_share": x})
                                                     for x in (0.5, 0.9)]),
    "s14": (MINI + CPU, tuple(range(1, 13)), [EXPLICIT, ("thunder-inferred", "b0.9", {})]),
}

if __name__ == "__main__":
    name, part = sys.argv[1], int(sys.argv[2])
    cells, seeds, variants = SETS[name]
    with open(f"{name}.jsonl", "a") as out:
        for seed in seeds:
            for cl, nodes, prof, n in cells[part::2]:
                for router, variant, kw in variants:
                    t = time.time()
                    kw = dict(kw)
                    profile = load_profile(prof)
                    if "end_sign_share" in kw:  # a workload setting, not the router's
                        profile = dataclasses.replace(profile, end_sign_share=kw.pop("end_sign_share"))
                    r = run_des(cl, nodes, router, profile, n, 900, warmup_s=600, seed=seed,
                                router_config=RouterConfig(programs=ProgramsConfig(**kw)))
                    row = dict(cell=f"{prof}-{n}", seed=seed, router=router, variant=variant,
                               spm=round(r.steps_per_min, 1), hit=round(r.kv_hit_rate, 3),
                               wall=round(time.time() - t, 1),
                               dormant=[x for x in r.notes.split() if x.startswith(("dormant=", "unrefs="))])
                    print(json.dumps(row), flush=True)
                    out.write(json.dumps(row) + "\n")
