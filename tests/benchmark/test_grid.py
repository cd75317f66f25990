"""The workload grid (benchmark/grid.py): cells, their profiles, the sweep per cell and the table."""

from __future__ import annotations

import json

import pytest

from thunder_sgl.benchmark import grid
from thunder_sgl.benchmark.harness import BenchSpec
from thunder_sgl.benchmark.measures.derived import window_check
from thunder_sgl.benchmark.reports.results import RunResult
from thunder_sgl.benchmark.workloads.profile import load_profile, mean_context_tokens

POOL = 24_576


def test_the_grid_spans_every_combination_and_real_mode_a_spread_of_it():
    assert len(grid.ALL_CELLS) == 3 * 3 * 2 * 4
    assert len({c.name for c in grid.ALL_CELLS}) == len(grid.ALL_CELLS)
    assert len(grid.REAL_CELLS) >= 10 and set(grid.REAL_CELLS) <= set(grid.ALL_CELLS)
    for attr, values in (("share", grid.SHARES), ("tool_s", grid.TOOLS), ("output", grid.OUTPUTS)):
        assert {getattr(c, attr) for c in grid.REAL_CELLS} == set(values)


def test_cells_by_name_and_clear_errors():
    assert grid.parse_cells("ctx20-tool2-out16-x6") == (grid.Cell(0.20, 2.0, 16, 6),)
    assert grid.parse_cells("real") == grid.REAL_CELLS
    with pytest.raises(ValueError, match="unknown grid cell"):
        grid.parse_cells("ctx30-tool2-out16-x6")
    with pytest.raises(ValueError, match="no grid cells"):
        grid.parse_cells(" , ")


@pytest.mark.parametrize("cell", [grid.Cell(0.05, 2.0, 16, 1), grid.Cell(0.10, 0.5, 128, 2), grid.Cell(0.20, 8.0, 16, 4)])
def test_a_cells_profile_has_the_mean_context_it_names(cell, tmp_path):
    path = tmp_path / "p.yaml"
    import yaml
    path.write_text(yaml.safe_dump(cell.profile(POOL)))
    share = mean_context_tokens(load_profile(path), seed=3, n=400) / POOL
    assert share == pytest.approx(cell.mean_context(POOL) / POOL, rel=0.1)
    if cell.output == 16:
        assert share == pytest.approx(cell.share, rel=0.1)
    assert cell.programs(POOL, 1) == round(cell.multiple * POOL / cell.mean_context(POOL))


def test_run_grid_runs_each_cell_and_repeat_and_tabulates_thunder_against_the_best_stock(tmp_path):
    calls = []

    def fake(spec, command):
        calls.append(spec)
        base = {"thunder": 60.0, "thunder-fixed": 50.0, "direct": 55.0, "sglang-cache_aware": 40.0}
        out = []
        for r in spec.routers:
            notes = "admission=L3,n9.0,k5.0,probes2/1won,fallbacks0" if r == "thunder" else ""
            # the second cell's first repeat of direct measured a start-up transient
            transient = spec.name.startswith("ctx05") and spec.seed == 1 and r == "direct"
            check = window_check(40, 10, 0 if transient else 10)
            out.append(RunResult(router=r, mode="des", programs=spec.programs[0], nodes=1, cluster="x", profile="p",
                                 seed=spec.seed, window_s=60.0, steps_per_min=base[r] + spec.seed, kv_hit_rate=0.5,
                                 notes=notes, window_check=check))
        return out

    spec = BenchSpec(mode="des", cluster="sglang-cpu-gpt2-small-t1", routers=("thunder", "thunder-fixed", "direct",
                                                                                "sglang-cache_aware"),
                     out=tmp_path, name="g")
    cells = grid.parse_cells("ctx20-tool2-out16-x6,ctx05-tool0.5-out16-x2")
    root = grid.run_grid(spec, cells, 2, POOL, fake, say=lambda _: None)
    assert len(calls) == 4 and {c.seed for c in calls} == {spec.seed, spec.seed + 1}
    assert all(c.out == root and c.programs == (cells[0].programs(POOL, 1),) for c in calls[:2])
    table = (root / "grid.md").read_text()
    assert "ctx20-tool2-out16-x6" in table and "| direct | 1.09 | 1.19 |" in table  # (60+1.5)/(55+1.5), /(50+1.5)
    assert "L3,n9.0,k5.0" in table
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines() if line.startswith("| ctx")}
    assert "| transient |" in rows["ctx05-tool0.5-out16-x2"] and "| ok |" in rows["ctx20-tool2-out16-x6"]
    assert "Steady-state cells only (window ok): min 1.09, median 1.09 over 1 cells" in table
    summary = json.loads((root / "grid.json").read_text())["summary"]
    assert summary[0]["spread"]["thunder"] == pytest.approx(0.5)
    assert (root / "profiles" / f"{cells[0].profile_name}.yaml").exists()


def test_merge_concatenates_parts_or_replaces_the_cells_a_later_part_reran(tmp_path):
    def part(name, rows):
        d = tmp_path / name
        d.mkdir()
        grid.write_grid(d, rows, "t")
        return d

    def row(cell, router, spm, window=""):
        return {"cell": cell, "share": 0.2, "tool_s": 8.0, "output": 16, "multiple": 4, "programs": 20, "repeat": 1,
                "router": router, "steps_per_min": spm, "kv_hit_rate": 0.5, "failed": False, "admission": "",
                "window": window}

    a = part("a", [row("ctx20-tool8-out16-x4", "thunder", 60.0, "transient"), row("ctx20-tool8-out16-x4", "direct", 80.0),
                   row("ctx05-tool2-out16-x2", "thunder", 100.0), row("ctx05-tool2-out16-x2", "direct", 50.0)])
    b = part("b", [row("ctx20-tool8-out16-x4", "thunder", 75.0), row("ctx20-tool8-out16-x4", "direct", 76.0)])
    both = json.loads((grid.merge([a, b], tmp_path / "m", "t").parent / "grid.json").read_text())["rows"]
    assert len(both) == 6
    rows = json.loads((grid.merge([a, b], tmp_path / "r", "t", replace=True).parent / "grid.json").read_text())["rows"]
    assert len(rows) == 4 and {r["steps_per_min"] for r in rows if r["cell"] == "ctx20-tool8-out16-x4"} == {75.0, 76.0}
