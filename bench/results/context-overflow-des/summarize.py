"""Tables of ``sweep.py``'s rows: python bench/results/context-overflow-des/summarize.py FILE.jsonl"""

from __future__ import annotations

import json
import statistics
import sys


def pick(rows: list[dict], n: int, tag: str, router: str, no_hint: bool) -> dict[int, dict]:
    return {r["seed"]: r for r in rows
            if r["n"] == n and r["tag"] == tag and r["router"] == router and r["no_hint"] == no_hint}


def mean(d: dict[int, dict], seeds: list[int], key: str) -> float:
    return statistics.mean(d[s][key] for s in seeds)


def rel(d: dict[int, dict], ids: dict[int, dict], seeds: list[int]) -> str:
    if not set(seeds) <= set(d):
        return "–"
    return f"{mean(d, seeds, 'spm') / mean(ids, seeds, 'spm'):.3f}"


def main(path: str) -> None:
    rows = [json.loads(line) for line in open(path)]
    key = "ratio" if rows[0]["cell"] == "toolorchestra" else "spm"
    print("| N | rows | thunder (ids) | thunder-inferred | inferred, no hint | inferred ÷ ids | no hint ÷ ids "
          "| KV hit ids / inferred | context-overflow ends a run |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for n in sorted({r["n"] for r in rows}):
        for tag in sorted({r["tag"] for r in rows}):
            ids, inf = pick(rows, n, tag, "thunder", False), pick(rows, n, tag, "thunder-inferred", False)
            noh = pick(rows, n, tag, "thunder-inferred", True)
            seeds = sorted(set(ids) & set(inf))
            if not seeds:
                continue
            ends = statistics.mean(inf[s]["errors"].get("context_overflow", 0) for s in seeds)
            nh = f"{mean(noh, seeds, key):.3f}" if set(seeds) <= set(noh) else "–"
            print(f"| {n} | {tag}, seeds {seeds[0]}–{seeds[-1]} | {mean(ids, seeds, key):.3f} | {mean(inf, seeds, key):.3f} "
                  f"| {nh} | {rel(inf, ids, seeds)} | {rel(noh, ids, seeds)} "
                  f"| {mean(ids, seeds, 'hit'):.3f} / {mean(inf, seeds, 'hit'):.3f} | {ends:.1f} |")


if __name__ == "__main__":
    main(sys.argv[1])
