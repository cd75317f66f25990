"""``thunder-sgl``: version, help of every subcommand, argument errors, pass-through, report-only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from thunder_sgl import __version__
from thunder_sgl.benchmark.reports.results import RunResult
from thunder_sgl.benchmark.reports.sweep import write_report
from thunder_sgl.cli import COMMANDS, PASSTHROUGH, main

ROOT = Path(__file__).resolve().parents[2]


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"thunder-sgl {__version__}"


def test_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for name in (*COMMANDS, *PASSTHROUGH):
        assert name in out


@pytest.mark.parametrize(("cmd", "expect"), [
    ("demo", "--minutes"),
    ("bench", "--report-only"),
])
def test_subcommand_help(capsys, cmd, expect):
    with pytest.raises(SystemExit) as e:
        main([cmd, "--help"])
    assert e.value.code == 0
    assert expect in capsys.readouterr().out


@pytest.mark.parametrize(("cmd", "expect"), [
    ("sim", "--time-scale"),        # python -m thunder_sgl.sim's own parser
    ("router", "--thunder-variant"),  # thunder-router's parser (sglang_router's arguments + ours)
])
def test_passthrough_help(cmd, expect):
    out = subprocess.run([sys.executable, "-m", "thunder_sgl", cmd, "--help"], capture_output=True, text=True,
                         cwd=ROOT, timeout=60, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert expect in out.stdout


def test_no_subcommand_prints_help(capsys):
    assert main([]) == 2
    assert "demo" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    ["bench", "--routers", "thunder,nginx"],
    ["bench", "--mode", "des", "--programs", "0"],
    ["bench", "--router-arg", "nginx=--x"],
])
def test_bench_rejects_bad_arguments(capsys, argv):
    assert main(argv) == 2
    assert "thunder-sgl bench:" in capsys.readouterr().err


def test_bench_report_only(tmp_path, capsys):
    r = RunResult(router="thunder", mode="des", programs=8, nodes=1, cluster="tiny", profile="p", seed=0,
                  window_s=60.0, steps_per_min=10.0, kv_hit_rate=0.5)
    write_report([r], tmp_path, {"name": "ro"}, plots=False)
    assert main(["bench", "--report-only", str(tmp_path)]) == 0
    assert (tmp_path / "steps_per_min.png").stat().st_size > 0
    assert "results.md" in capsys.readouterr().out
