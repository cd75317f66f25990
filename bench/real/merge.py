"""Merge the runs of several results directories into one, then rebuild its report.

A real-engine sweep takes minutes per run, so a sweep is sometimes finished by a second command
(the routers the first did not reach). This appends the runs of the other directories to the first
(a later run of the same router and N replaces the earlier one), records every command in its
meta, and rewrites results.json/.csv/.md and the plots:

    python bench/real/merge.py bench/results/real-cpu-1e bench/results/_scratch/real-cpu-1e-b
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from thunder_sgl.benchmark.reports.sweep import load_meta, load_results, write_report


def merge(target: Path, others: list[Path]) -> int:
    meta = load_meta(target)
    runs = {(r.router, r.programs): r for r in load_results(target)}
    commands = [meta.get("command", "")]
    for d in others:
        for r in load_results(d):
            runs[(r.router, r.programs)] = r
        commands.append(load_meta(d).get("command", ""))
    meta["command"] = " ; ".join(c for c in commands if c)
    write_report(list(runs.values()), target, meta)
    (target / "command.txt").write_text("\n".join(c for c in commands if c) + "\n")
    return len(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("target", type=Path)
    ap.add_argument("others", type=Path, nargs="+")
    a = ap.parse_args()
    n = merge(a.target, a.others)
    print(json.dumps({"target": str(a.target), "runs": n}))


if __name__ == "__main__":
    main()
