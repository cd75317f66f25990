"""How far a short measured window is from the steady state, per cell and router (DES).

Reads grid directories (``thunder-sgl bench --grid ... --name <dir>``) run with the same cells,
routers and repeats but different warm-ups, windows or starts, and one reference directory run
far past the start-up transient (``--warmup 6000 --duration 1800``); prints, for every cell and
router, each directory's steps/min ÷ the reference's mean, per repeat, with ``*`` where the run's
own window check flagged it (TRANSIENT or COARSE).

    python bench/window_convergence.py REF DIR [DIR ...] > convergence.md

Used to choose real-engine windows: a real run costs its warm-up and window in wall time, so
the DES (calibrated against the engine, at the engine's measured speed) says which windows
measure the steady state before the engine's time is spent.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def rows(path: Path) -> list[dict]:
    doc = json.loads((path / "grid.json").read_text())
    return doc["rows"] if isinstance(doc, dict) else doc


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    dirs = [Path(a) for a in argv]
    runs: dict[tuple[str, int, str], dict[str, list[tuple[float, str]]]] = {}
    for d in dirs:
        for r in rows(d):
            runs.setdefault((r["cell"], r["programs"], r["router"]), {}).setdefault(d.name, []).append(
                (r["steps_per_min"], r["window"]))
    ref = dirs[0].name
    print(f"# Steps/min ÷ the steady state ({ref}), per repeat\n")
    print("`*`: the run's window check flagged it (TRANSIENT or COARSE).\n")
    print("| cell | N | router | steady steps/min | " + " | ".join(d.name for d in dirs[1:]) + " |")
    print("|---|---:|---|---:|" + "---:|" * (len(dirs) - 1))
    for (cell, n, router), v in sorted(runs.items()):
        base = sum(x for x, _ in v[ref]) / len(v[ref])
        cols = ["/".join(f"{x / base:.2f}{'*' if w else ''}" for x, w in v.get(d.name, [])) or "–"
                for d in dirs[1:]]
        print(f"| {cell} | {n} | {router} | {base:.1f} | " + " | ".join(cols) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
