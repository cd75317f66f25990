"""The soak command, briefly: faults injected on a schedule, nothing lost, nothing leaked.
(The real soak runs for hours; this checks the command and its accounting in ~40 s.)"""

from __future__ import annotations

import json
import subprocess
import sys


def test_soak_runs_faults_and_reports_no_loss_and_no_leak(tmp_path):
    out = tmp_path / "soak"
    p = subprocess.run(
        [sys.executable, "-m", "thunder_sgl", "soak", "--minutes", "0.5", "--nodes", "2",
         "--overload", "1.5", "--fault-every", "6", "--time-scale", "10", "--sandboxes", "local", "--exec-every", "1",
         "--out", str(out)],
        capture_output=True, text=True, timeout=240,
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    s = json.loads((out / "soak.json").read_text())
    assert {f["fault"] for f in s["faults"]} >= {"crash", "silence"}   # a node killed and restarted, one silent
    assert s["requests_served"] > 100 and s["sandbox_execs"] > 50
    assert s["programs_lost"] == 0
    assert (s["leaked_programs"], s["leaked_sandboxes"], s["leaked_ports"]) == (0, 0, 0)
    assert s["releases_unfinished"] == 0 and s["leaked_sandboxes_after_stop"] == 0
    assert s["router_rss_mb_end"] > 0 and s["max_held_wait_s"] >= 0
    assert "programs_lost" in p.stdout and "leaked_sandboxes" in p.stdout
