"""Thunder-only DES grid runs against a baseline and against v9's stock routers.

    python compare.py NEW[,NEW...] [BASE[,BASE...]] [--stock GRID_JSON]

NEW and BASE are grid directories (their grid.json). The stock routers (direct, sglang_router and
smg cache_aware) run no admission rule, so their numbers are v9's
(../grid-cpu-t1-des-steady-v9/grid.json: 900 s after 300 s for 47 cells, 1,800 s after 3,600 s for
the 25 long cells); compare short runs with short ones (new/base), long runs with v9's long stock.
``--stock`` takes the stock routers (and "v9 thunder") from another grid.json instead (the two-engine
grid: ../grid-cpu-t1-des-2n-v4/grid.json).
"""
import json
import statistics as S
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
V9 = HERE.parent / "grid-cpu-t1-des-steady-v9" / "grid.json"


def thunder(dirs: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for d in dirs.split(","):
        for r in json.loads((Path(d) / "grid.json").read_text())["rows"]:
            if r["router"] == "thunder":
                out.setdefault(r["cell"], []).append(r["steps_per_min"])
    return out


def main() -> None:
    args = sys.argv[1:]
    stock_json = V9
    if "--stock" in args:
        i = args.index("--stock")
        stock_json = Path(args[i + 1])
        del args[i:i + 2]
    new = thunder(args[0])
    base = thunder(args[1]) if len(args) > 1 else {}
    stock: dict[str, dict[str, list[float]]] = {}
    v9t: dict[str, list[float]] = {}
    for r in json.loads(stock_json.read_text())["rows"]:
        if r["router"] in ("direct", "sglang-cache_aware", "smg-cache_aware"):
            stock.setdefault(r["cell"], {}).setdefault(r["router"], []).append(r["steps_per_min"])
        if r["router"] == "thunder":
            v9t.setdefault(r["cell"], []).append(r["steps_per_min"])
    rat, rb = [], []
    for cell in sorted(new):
        st = max(S.mean(v) for v in stock[cell].values())
        n = S.mean(new[cell])
        line = f"{cell:28s} new {n:8.1f} x{n / st:.3f}"
        rat.append(n / st)
        if cell in base:
            b = S.mean(base[cell])
            line += f"  base {b:8.1f} x{b / st:.3f}  new/base {n / b:.3f}"
            rb.append(n / b)
        line += f"  {stock_json.parent.name} thunder x{S.mean(v9t[cell]) / st:.3f}"
        print(line)
    print(f"cells {len(rat)}: thunder / {stock_json.parent.name} best stock min {min(rat):.3f}, geometric mean {S.geometric_mean(rat):.3f}, "
          f"below 0.97: {sum(r < 0.97 for r in rat)} (meaningful for like-for-like windows only)")
    if rb:
        print(f"new / base: min {min(rb):.3f}, max {max(rb):.3f}, geometric mean {S.geometric_mean(rb):.3f}, "
              f"unchanged (within 0.0005) {sum(abs(x - 1) < 5e-4 for x in rb)} of {len(rb)}")


if __name__ == "__main__":
    main()
