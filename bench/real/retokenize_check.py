"""How an engine's answers come back in the next request: tokens per output token, and whether
the answer's KV is reused.

An agent sends each answer back as text, and the chat template tokenizes it again. A trained
model's output re-encodes to the same tokens, so the next request's prompt grows by the output
and hits the cache through it. The CPU engine's random-weight model emits token sequences that
no tokenizer would produce; their text re-encodes to other, more tokens. This reads a real run's
per-call records (``steps/<router>-N<n>.jsonl``) against the profile's nominal sizes and prints,
over consecutive calls k, k+1 of one program:

- the growth of the prompt, prompt(k+1) − prompt(k), against the nominal growth (output +
  observation + the DES's template tokens per step), per run; and, pooled over the runs, the
  least-squares fit ``growth = a · output + b · nominal observation + c``: ``a`` is what a simulator
  config's ``model.reply_tokens_per_output`` must be and ``b`` its ``text_tokens_per_nominal``
  (``a`` and ``c`` are told apart only by runs of different output sizes);
- ``cached(k+1) − prompt(k)``: how far into the answer the next request's cache hit reaches (about
  0: the hit ends where the answer starts; the output's count: the answer's KV is reused).

    python bench/real/retokenize_check.py RUN_DIR [RUN_DIR ...]

RUN_DIR is one sweep's directory (``results.json`` beside ``steps/``); the profile is the one
named in its ``results.json``. Only calls answered 200 whose next call was answered count.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import numpy as np

from thunder_sgl.benchmark.des.tokens import STEP_TEMPLATE_TOKENS
from thunder_sgl.benchmark.workloads.profile import load_profile, program_at


def pairs(run: Path) -> list[tuple[int, int, int, int]]:
    """(output(k), nominal observation(k), prompt growth, cached(k+1) − prompt(k)) per pair."""
    doc = json.loads((run / "results.json").read_text())
    spec = doc["meta"]["spec"]
    profile = load_profile(spec["profile"] if Path(spec["profile"]).exists()
                           else run.parent / "profiles" / Path(spec["profile"]).name)
    seed = int(spec["seed"])
    out: list[tuple[int, int, int, int]] = []
    for f in sorted((run / "steps").glob("*.jsonl")):
        calls = {}
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if "program" in r and r.get("status") == 200:
                calls[(r["program"], r["step"])] = r
        specs = {}
        for (pid, k), a in calls.items():
            b = calls.get((pid, k + 1))
            if b is None or not a["completion"]:
                continue
            index = int(pid.rsplit("-", 1)[1])
            s = specs.get(index) or specs.setdefault(index, program_at(profile, seed, index))
            out.append((a["completion"], s.steps[k].observation_tokens, b["prompt"] - a["prompt"],
                        b["cached"] - a["prompt"]))
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    print("| run | pairs | output | growth − nominal growth (median, p10–p90) | cached(k+1) − prompt(k) (median, p90) |")
    print("|---|---:|---:|---:|---:|")
    every: list[tuple[int, int, int, int]] = []
    for a in argv:
        rows = pairs(Path(a))
        if len(rows) < 10:
            print(f"| {a} | {len(rows)} | – | – | – |")
            continue
        every += rows
        extra = [g - (o + obs + STEP_TEMPLATE_TOKENS) for o, obs, g, _ in rows]
        q = statistics.quantiles(extra, n=10)
        r = statistics.quantiles([x for *_, x in rows], n=10)
        outs = "/".join(str(o) for o in sorted({o for o, *_ in rows}))
        print(f"| {a} | {len(rows)} | {outs} | {statistics.median(extra):.0f} ({q[0]:.0f}–{q[-1]:.0f}) | "
              f"{statistics.median(x for *_, x in rows):.0f} ({r[-1]:.0f}) |")
    if len({o for o, *_ in every}) > 1:
        x = np.array([[o, obs, 1.0] for o, obs, _, _ in every])
        y = np.array([g for _, _, g, _ in every], dtype=np.float64)
        (a_, b_, c_), *_ = np.linalg.lstsq(x, y, rcond=None)
        print(f"\nPooled fit over {len(every)} pairs: prompt growth per step = {a_:.3f} · output + {b_:.3f} · "
              f"nominal observation + {c_:.1f} (the DES, nominal: 1 · output + 1 · observation + "
              f"{STEP_TEMPLATE_TOKENS})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
