"""The mini-swe-agent environment of ``examples/mini_swe_agent_thunder.py``: an unmodified
agent whose shell commands run in its thunder program's docker sandbox, released (container
removed) when the agent stops. Real router process, simulated worker, docker."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import docker
import httpx
import pytest
from docker_helpers import labelled

from thunder_sgl.benchmark.drivers.peers import start_sim, start_thunder
from thunder_sgl.children import wait_until

pytest.importorskip("minisweagent")
pytestmark = pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")  # see tests/integration/test_mini_swe_agent.py

TS = 10.0
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mini_swe_agent_thunder.py"


def example():
    spec = importlib.util.spec_from_file_location("mini_swe_agent_thunder", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["mini_swe_agent_thunder"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def router(docker_client: docker.DockerClient, instance_id: str, tmp_path):
    sim = start_sim("tiny", workers=1, time_scale=TS, log_dir=tmp_path)
    r = None
    try:
        r = start_thunder(sim.urls, time_scale=TS, log_dir=tmp_path, name=f"thunder-{time.monotonic_ns()}",
                          extra=["--thunder-instance-id", instance_id, "--thunder-sandbox-provider", "docker"])
        yield r
    finally:
        for p in (r, sim):
            if p is not None:
                p.stop()


def test_commands_run_in_the_programs_sandbox_and_a_submission_ends_the_agent(router, docker_client, instance_id):
    from minisweagent.exceptions import Submitted

    env = example().ThunderSandboxEnvironment(router_url=router.url, program_id="msa-env")
    try:
        assert len(labelled(docker_client, instance_id)) == 1
        out = env.execute({"command": "echo hello > /tmp/f && cat /tmp/f && ls /definitely-missing"})
        assert "hello" in out["output"] and out["returncode"] != 0
        assert env.get_template_vars()["system"] == "Linux"
        with pytest.raises(Submitted) as e:
            env.execute({"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && echo the patch"})
        assert e.value.messages[0]["extra"]["submission"].strip() == "the patch"
        prog = httpx.get(f"{router.url}/programs/msa-env").json()
        assert prog["tool_seconds_total"] > 0  # the router saw the program acting while commands ran
    finally:
        env.release()
    wait_until(lambda: not labelled(docker_client, instance_id), 30, "the released program's sandbox to be removed")


def test_an_unmodified_agent_runs_and_its_sandbox_is_released_when_it_stops(router, docker_client, instance_id):
    res = example().run_agent(router.url, "tiny", "Fix the bug in utils.py", steps=3, max_tokens=16)
    assert res["calls"] == 3 and res["exit"] == "LimitsExceeded"
    assert httpx.get(f"{router.url}/programs/{res['program_id']}").status_code == 404  # released
    wait_until(lambda: not labelled(docker_client, instance_id), 30, "the agent's sandbox to be removed")
