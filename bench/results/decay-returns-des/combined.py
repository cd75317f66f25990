"""The one-engine CPU grid as the README's table reads it: the 25 long cells from their
1,800-s-after-3,600-s runs, the 47 others from the 900-s-after-300-s runs, thunder's mean over
the runs given ÷ the best of v9's stock routers (direct, sglang_router and smg cache_aware).

    python combined.py SHORT[,SHORT...] LONG[,LONG...] [SHORT LONG ...]   (grid directories)
    python combined.py ../goodput-calibration-des/g-v6-s1,../goodput-calibration-des/g-v6-s2 \
        ../goodput-calibration-des/g-v6-long g1n-ret-s1,g1n-ret-s2 g1n-ret-long-s1,g1n-ret-long-s2
"""
import json
import statistics as S
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "goodput-calibration-des"))
from compare import V9, thunder  # noqa: E402 - the grids' reader and v9's stock routers


def main() -> None:
    stock: dict[str, dict[str, list[float]]] = {}
    for r in json.loads(V9.read_text())["rows"]:
        if r["router"] in ("direct", "sglang-cache_aware", "smg-cache_aware"):
            stock.setdefault(r["cell"], {}).setdefault(r["router"], []).append(r["steps_per_min"])
    args = sys.argv[1:]
    for short_dirs, long_dirs in zip(args[::2], args[1::2]):
        short, long = thunder(short_dirs), thunder(long_dirs)
        rat = {c: S.mean(long.get(c) or short[c]) / max(S.mean(v) for v in stock[c].values()) for c in short}
        v = sorted(rat.values())
        worst = sorted(rat.items(), key=lambda kv: kv[1])[:3]
        print(f"{short_dirs} + {long_dirs}\n  worst {v[0]:.3f}, median {S.median(v):.3f}, geometric mean "
              f"{S.geometric_mean(v):.3f}, best {v[-1]:.3f}, below 0.97: {sum(x < 0.97 for x in v)}; lowest: "
              + ", ".join(f"{c} {x:.3f}" for c, x in worst))


if __name__ == "__main__":
    main()
