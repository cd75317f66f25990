"""``thunder-sgl demo`` as a user runs it, shortened: exits 0, prints the table, writes the plot,
and leaves no process behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]


def test_demo_smoke(tmp_path):
    tag = f"{os.getpid()}-demo"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "THUNDER_TEST_TAG": tag}
    out_dir = tmp_path / "demo"
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "thunder_sgl", "demo", "--minutes", "0.3", "--out", str(out_dir)],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=180)
    wall = time.monotonic() - t
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    for text in ("thunder-sgl demo", "sglang-cache_aware", "steps/min", "KV hit rate", "recompute",
                 "the steps/min of sglang_router cache_aware", "plot   :"):
        assert text in out, text
    assert (out_dir / "demo.png").stat().st_size > 10_000
    assert (out_dir / "results.md").exists() and (out_dir / "results.json").exists()
    assert wall < 120, f"--minutes 0.3 took {wall:.0f} s"
    left = [q.pid for q in psutil.process_iter(["environ"]) if (q.info["environ"] or {}).get("THUNDER_TEST_TAG") == tag]
    assert not left, f"processes left running: {left}"
