"""The calibrated timing model against the engines' own accounting, run by run.

    python bench/real/timing_check.py bench/results/real-cpu-1e [more results dirs] \\
        [--config sglang-cpu-gpt2-small-t1] [--out bench/results/real-cpu-1e/timing-check.md]

A real-mode run keeps every call (prompt, cached and completion tokens, times) in
``steps/<router>-N<n>.jsonl``, and the engines' counters over its measured window (prefill
seconds and tokens, decode seconds, iterations, Σ batch sizes). For the calls of the window this
prices the same work with the simulator's timing model (``sim.timing``: the calibration of
``bench/real/calibrate.py``, measured one request at a time on an idle engine) and reports the
ratio, and what the difference is per call: the cost of serving under load that the isolated
measurements do not see.

``--write-config NAME`` also writes ``configs/sim/NAME.yaml``: the calibrated config with its
prefill constants divided by the prefill ratio Σ model / Σ engine over all the runs given, and
its decode constants by the decode ratio — the engine's speed under a benchmark's load, measured
by the engine itself, in place of its speed measured alone (one factor per phase; nothing fitted
to steps/min).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from thunder_sgl.config import resolve_config_path
from thunder_sgl.sim.config import load_sim_config
from thunder_sgl.sim.timing import Roofline, prefill_seconds

NOTE = re.compile(r"engines: prefill ([\d.]+) s for (\d+) K tokens, decode ([\d.]+) s over (\d+) iterations"
                  r" \([\d.]+ ms, mean batch ([\d.]+)\)")


def _engines_from_notes(results: Path, router: str, n: int) -> dict[str, float]:
    for r in json.loads((results / "results.json").read_text())["results"]:
        if r["router"] == router and r["programs"] == n and (m := NOTE.search(r.get("notes", ""))):
            it = float(m.group(4))
            return {"prefill_s": float(m.group(1)), "prefill_tokens": 1e3 * float(m.group(2)),
                    "decode_s": float(m.group(3)), "decode_iterations": it, "decode_batch_sum": it * float(m.group(5))}
    return {}


def check(path: Path, r: Roofline) -> dict[str, Any] | None:
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    head, calls = lines[0], [x for x in lines[1:] if x["status"] == 200]
    router, n = path.stem.rsplit("-N", 1)
    eng = head.get("engines") or _engines_from_notes(path.parent.parent, router, int(n))
    if not eng or not eng.get("prefill_s"):
        return None
    win = [x for x in calls if head["warmup_s"] <= x["end_s"] <= head["wall_s"]]
    pre = dec_kv = 0.0
    for x in win:
        new = max(0, x["prompt"] - x["cached"])
        pre += (r.prefill_fixed if new else 0.0) + prefill_seconds(r, new, x["cached"])
        dec_kv += x["completion"] * (x["prompt"] + x["completion"] / 2)
    dec = eng["decode_iterations"] * r.t_fixed + eng["decode_batch_sum"] * r.per_request + dec_kv * r.kv_cost
    return {"router": router, "programs": int(n), "calls": len(win),
            "new_per_call": sum(max(0, x["prompt"] - x["cached"]) for x in win) / max(1, len(win)),
            "prompt_per_call": sum(x["prompt"] for x in win) / max(1, len(win)),
            "prefill_model_s": pre, "prefill_s": eng["prefill_s"], "decode_model_s": dec, "decode_s": eng["decode_s"],
            "iterations": eng["decode_iterations"], "mean_batch": eng["decode_batch_sum"] / max(1.0, eng["decode_iterations"])}


PREFILL_KEYS = ("prefill_fixed_s", "prefill_per_token_s", "prefill_per_attention_s", "prefill_per_sequence_attention_s")
DECODE_KEYS = ("decode_fixed_s", "decode_per_request_s", "decode_per_kv_token_s")


def rows_of(dirs: list[Path], config: str) -> list[dict[str, Any]]:
    r = Roofline.from_config(load_sim_config(config))
    return [{**c, "dir": d.name} for d in dirs for p in sorted((d / "steps").glob("*.jsonl"))
            if (c := check(p, r)) is not None]


def ratios(rows: list[dict[str, Any]]) -> tuple[float, float]:
    """(Σ prefill model / Σ engine, Σ decode model / Σ engine) over all runs."""
    return (sum(c["prefill_model_s"] for c in rows) / sum(c["prefill_s"] for c in rows),
            sum(c["decode_model_s"] for c in rows) / sum(c["decode_s"] for c in rows))


def write_config(config: str, name: str, rows: list[dict[str, Any]], dirs: list[Path]) -> Path:
    """The config with each phase's timing constants divided by that phase's ratio."""
    import yaml

    src = resolve_config_path(config, "sim")
    pre, dec = ratios(rows)
    data = yaml.safe_load(src.read_text())
    t = data["timing"]
    for k in PREFILL_KEYS:
        t[k] = float(f"{t.get(k, 0.0) / pre:.6g}")
    for k in DECODE_KEYS:
        t[k] = float(f"{t.get(k, 0.0) / dec:.6g}")
    data["name"] = name
    head = (f"# {src.stem} with its timing scaled to the engine's speed under load, by\n"
            f"# bench/real/timing_check.py --write-config {name} over {len(rows)} runs of "
            f"{', '.join(d.name for d in dirs)}:\n"
            f"# prefill constants / {pre:.3f}, decode constants / {dec:.3f} (Σ model ÷ Σ engine-booked seconds).\n"
            f"# The isolated calibration ({src.stem}) measured one request at a time on an idle engine.\n")
    out = src.with_name(f"{name}.yaml")
    out.write_text(head + yaml.safe_dump(data, sort_keys=False))
    return out


def table(dirs: list[Path], config: str) -> str:
    rows = rows_of(dirs, config)
    out = [f"# Timing model ({config}) against the engines' accounting", "",
           "Calls of each run's measured window priced by the simulator's timing model, against what the engines "
           "booked in the same window. Ratio < 1: the model is cheaper than the engine under this load.", "",
           "| run | router | N | calls | new tok/call | prompt tok/call | prefill model / engine s | ratio | "
           "extra per call ms | decode model / engine s | ratio | mean batch |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in rows:
        extra = 1e3 * (c["prefill_s"] - c["prefill_model_s"]) / max(1, c["calls"])
        out.append(f"| {c['dir']} | {c['router']} | {c['programs']} | {c['calls']} | {c['new_per_call']:.0f} | "
                   f"{c['prompt_per_call']:.0f} | {c['prefill_model_s']:.1f} / {c['prefill_s']:.1f} | "
                   f"{c['prefill_model_s'] / c['prefill_s']:.2f} | {extra:.0f} | {c['decode_model_s']:.1f} / "
                   f"{c['decode_s']:.1f} | {c['decode_model_s'] / max(c['decode_s'], 1e-9):.2f} | {c['mean_batch']:.1f} |")
    if rows:
        pre, dec = ratios(rows)
        out += ["", f"All runs: prefill model ÷ engine {pre:.2f}, decode {dec:.2f}."]
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", type=Path, nargs="+")
    ap.add_argument("--config", default="sglang-cpu-gpt2-small-t1")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--write-config", default="", metavar="NAME", help="write configs/sim/NAME.yaml scaled to the engine under load")
    a = ap.parse_args()
    text = table(a.dirs, a.config)
    if a.write_config:
        print(f"wrote {write_config(a.config, a.write_config, rows_of(a.dirs, a.config), a.dirs)}")
    if a.out:
        a.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
