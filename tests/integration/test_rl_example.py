"""examples/rl_rollout.py, as docs/rl.md tells users to run it, stays true."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rl_rollout.py"


def load_example():  # noqa: ANN201 - the example module
    spec = importlib.util.spec_from_file_location("rl_rollout", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def run(capsys, argv: list[str]) -> tuple[int, dict]:  # noqa: ANN001
    rc = load_example().main(argv)
    return rc, json.loads(capsys.readouterr().out)


def test_the_example_rolls_out_through_two_weight_updates_on_its_own_simulated_cluster(capsys):
    rc, out = run(capsys, [])  # exactly the docs' command: it starts workers and a router itself
    assert rc == 0, out
    assert out["failed"] == [] and out["programs_left"] == 0 and out["weight_updates"] == 2
    assert out["requests_answered"] == 8 * 6 + out["resent_after_abort"]
    assert out["router_weight_version"] == "step-2" and "step-2" in out["weight_versions_seen"]
    # 8 trajectories in groups of 4: both groups completed, reported by the router
    assert (out["groups_completed"], out["groups_live"]) == (2, 0) and out["group_spread_max_seconds"] >= 0


def test_the_example_aborts_slow_requests_by_rid_through_the_router(spawn, capsys):
    sim = spawn("sim", "tiny", workers=2, time_scale=10.0)
    router = spawn("thunder", sim.urls, time_scale=10.0)
    rc, out = run(capsys, ["--router", router.url, "--programs", "3", "--steps", "2", "--updates", "0",
                           "--max-tokens", "5000", "--request-timeout", "0.5"])
    assert rc == 0, out
    assert out["aborted_by_timeout"] == 3 and out["requests_answered"] == 3 and out["programs_left"] == 0
    assert out["failed"] == []
