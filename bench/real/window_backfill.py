"""The window check (``measures.derived.window_check``) of real-mode runs recorded before it
existed, from their per-call records (``steps/<router>-N<n>.jsonl``) and the cell's profile.

    python bench/real/window_backfill.py bench/results/grid-cpu-real-2e [more grid dirs]

Writes ``window.md`` into each grid directory: per run, the steps per program counted in the
window and the programs that had ended before it (a program ended when its last planned LLM
call answered: the profile and seed name its steps), and the verdict. Reads only; the
results themselves are unchanged.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from thunder_sgl.benchmark.measures.derived import window_check
from thunder_sgl.benchmark.workloads.profile import load_profile, program_at


def check_run(steps_file: Path, profile_path: Path, seed: int) -> dict:
    lines = [json.loads(x) for x in steps_file.read_text().splitlines() if x.strip()]
    head, calls = lines[0], lines[1:]
    warm, wall = head["warmup_s"], head["wall_s"]
    profile = load_profile(str(profile_path))  # a path, or a name in configs/workloads/
    n = int(steps_file.stem.rsplit("-N", 1)[1])
    counted = sum(1 for c in calls if c["status"] == 200 and warm <= c["end_s"] <= wall)
    ended = 0
    for c in calls:
        if c["status"] != 200 or c["end_s"] >= warm:
            continue
        index = int(c["program"].rsplit("-", 1)[1])
        if c["step"] == len(program_at(profile, seed, index).steps) - 1:
            ended += 1
    # calls answered in the window stand for the steps counted there (a step counts when its
    # tool ends, a little later: this errs by the calls whose tools were still running)
    return window_check(counted, n, ended)


def main(argv: list[str]) -> int:
    for d in map(Path, argv):
        out = ["# Window check of the runs below (bench/real/window_backfill.py)", "",
               f"Command: `python bench/real/window_backfill.py {d}`", "",
               "steps/prog = LLM calls answered in the window ÷ N; ended = programs whose last call answered "
               "before the window ÷ N; verdict as `measures.derived.window_check` (TRANSIENT below 0.5 "
               "lifetimes ended, COARSE below 3 steps per program).", "",
               "| run | router | steps/prog | ended | verdict |", "|---|---|---:|---:|---|"]
        runs = [d] if (d / "steps").is_dir() else sorted(p for p in d.iterdir() if (p / "steps").is_dir())
        for run in runs:
            results = json.loads((run / "results.json").read_text())["results"]
            seed = results[0]["seed"]
            grid_profile = d / "profiles" / f"grid-{run.name.rsplit('-x', 1)[0]}.yaml"
            profile = grid_profile if grid_profile.exists() else Path(results[0]["profile"])
            for f in sorted((run / "steps").glob("*.jsonl")):
                c = check_run(f, profile, seed)
                verdict = "+".join(k.lower() for k in ("TRANSIENT", "COARSE") if k + ":" in c["warning"]) or "ok"
                out.append(f"| {run.name} N={f.stem.rsplit('-N', 1)[1]} | {f.stem.rsplit('-N', 1)[0]} | {c['steps_per_program']:.1f} | "
                           f"{c['lifetimes_before']:.2f} | {verdict} |")
        (d / "window.md").write_text("\n".join(out) + "\n")
        print(d / "window.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
