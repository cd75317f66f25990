"""Reports from synthetic RunResults: CSV/JSON round trips, markdown content, PNG files."""

from __future__ import annotations

import json

import pytest

from thunder_sgl.benchmark.harness import report_only
from thunder_sgl.benchmark.reports.results import RunResult
from thunder_sgl.benchmark.reports.sweep import (
    FAILED,
    load_meta,
    load_results,
    markdown,
    plot_comparison,
    read_csv,
    router_order,
    write_report,
)


def run(router: str, n: int, spm: float, hit: float = 0.9, **kw) -> RunResult:
    base = dict(router=router, mode="http", programs=n, nodes=2, cluster="glm46-fp8-h100x8",
                profile="mini-swe-agent", seed=1, window_s=600.0, steps_per_min=spm, kv_hit_rate=hit,
                prompt_tokens=1_000_000, cached_tokens=int(hit * 1_000_000), recompute_tokens=50_000,
                ideal_steps_per_min=400.0, program_completion_p50_s=300.0, program_completion_p99_s=900.0,
                memory=[(0.0, [0.1, 0.2]), (5.0, [0.5, 0.7]), (10.0, [0.9, 0.6])], time_scale=20.0)
    base.update(kw)
    return RunResult(**base)


@pytest.fixture
def sweep() -> list[RunResult]:
    return [
        run("thunder", 48, 300.0, 0.95, held_wait_p50_s=1.5, held_wait_p99_s=12.0, held_wait_max_s=30.0),
        run("sglang-cache_aware", 48, 200.0, 0.4),
        run("thunder", 96, 360.0, 0.93),
        run("sglang-cache_aware", 96, 180.0, 0.2, errors={"timeout": 3}),
        run("smg-cache_aware", 96, 0.0, 0.0, errors={FAILED: 1}, notes="router did not start: boom"),
    ]


def test_json_round_trip_keeps_every_field(tmp_path, sweep):
    write_report(sweep, tmp_path, {"name": "x", "command": "thunder-sgl bench --x"}, plots=False)
    back = load_results(tmp_path)
    assert [r.to_dict() for r in back] == [r.to_dict() for r in sweep]
    assert load_meta(tmp_path)["command"] == "thunder-sgl bench --x"


def test_csv_has_one_row_per_run_with_errors_and_notes(tmp_path, sweep):
    write_report(sweep, tmp_path, plots=False)
    rows = read_csv(tmp_path / "results.csv")
    assert len(rows) == len(sweep)
    assert [r["router"] for r in rows] == [r.router for r in sweep]
    assert float(rows[0]["steps_per_min"]) == 300.0
    assert json.loads(rows[3]["errors"]) == {"timeout": 3}
    assert rows[4]["notes"] == "router did not start: boom"


def test_markdown_compares_with_cache_aware_and_ideal(sweep):
    md = markdown(sweep, {"name": "sweep", "command": "thunder-sgl bench"})
    assert "## mini-swe-agent on 2 × glm46-fp8-h100x8 (http mode)" in md
    assert "### N = 48 programs (ideal 400 steps/min)" in md
    thunder48 = next(ln for ln in md.splitlines() if ln.startswith("| thunder | 300.0"))
    assert "| 1.50 | 0.75 | 95.0% |" in thunder48          # ×CA, ×ideal, hit rate
    assert "1.5 / 12.0 / 30" in thunder48                   # held waits
    assert "| 2.00 |" in next(ln for ln in md.splitlines() if ln.startswith("| thunder | 360.0"))
    assert "| smg-cache_aware | failed |" in md
    assert "router did not start: boom" in md


def test_routers_listed_in_canonical_order():
    assert router_order(["smg-cache_aware", "zzz", "thunder", "sglang-cache_aware"]) == [
        "thunder", "sglang-cache_aware", "smg-cache_aware", "zzz"]


def test_pngs_written_for_ok_runs_only(tmp_path, sweep):
    paths = write_report(sweep, tmp_path, {"warmup_s": 2.0})
    names = {p.name for p in paths}
    assert {"steps_per_min.png", "hit_rate.png", "memory_thunder.png", "memory_sglang-cache_aware.png"} <= names
    assert "memory_smg-cache_aware.png" not in names
    for p in paths:
        assert p.stat().st_size > 0
    assert (tmp_path / "steps_per_min.png").read_bytes()[:4] == b"\x89PNG"


def test_comparison_plot(tmp_path, sweep):
    p = plot_comparison(sweep[:2], tmp_path / "demo.png", warmup_s=3.0)
    assert p.stat().st_size > 10_000


def test_report_only_rebuilds_from_json(tmp_path, sweep):
    write_report(sweep, tmp_path, {"name": "again"}, plots=False)
    (tmp_path / "results.md").unlink()
    paths = report_only(tmp_path)
    assert (tmp_path / "results.md").read_text().startswith("# again")
    assert tmp_path / "steps_per_min.png" in paths


def test_all_failed_writes_tables_without_plots(tmp_path):
    bad = [run("thunder", 8, 0.0, errors={FAILED: 1}, notes="x")]
    paths = write_report(bad, tmp_path)
    assert {p.name for p in paths} == {"results.csv", "results.json", "results.md"}
