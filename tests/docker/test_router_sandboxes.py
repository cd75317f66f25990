"""Sandboxes through the real router process (thunder-router + simulated worker + docker)."""

from __future__ import annotations

import time

import docker
import httpx
from docker_helpers import labelled

from thunder_sgl.benchmark.drivers.peers import start_sim, start_thunder
from thunder_sgl.children import Proc, wait_until

TS = 10.0


def chat(url: str, pid: str, tokens: int, max_tokens: int = 8) -> httpx.Response:
    content = (pid.ljust(8, ".") * (tokens // 2 + 1))[: 4 * tokens]  # the simulator: 4 bytes a token
    return httpx.post(url + "/v1/chat/completions", timeout=60, json={
        "model": "tiny", "max_tokens": max_tokens, "program_id": pid,
        "messages": [{"role": "user", "content": content}]})


def router(sim: Proc, instance_id: str, tmp_path, extra: list[str] | None = None) -> Proc:
    return start_thunder(sim.urls, time_scale=TS, log_dir=tmp_path, name=f"thunder-{time.monotonic_ns()}",
                         extra=["--thunder-instance-id", instance_id, "--thunder-sandbox-provider", "docker", *(extra or [])])


def test_a_restarted_router_sweeps_every_orphan_and_its_agents_continue(
    docker_client: docker.DockerClient, instance_id: str, tmp_path
) -> None:
    sim = start_sim("tiny", workers=1, time_scale=TS, log_dir=tmp_path)
    r1 = r2 = None
    try:
        r1 = router(sim, instance_id, tmp_path)
        for i in range(3):
            pid = f"agent-{i}"
            assert chat(r1.url, pid, 50).status_code == 200
            sid = httpx.post(f"{r1.url}/programs/{pid}/sandboxes", json={}).json()["id"]
            info = httpx.get(f"{r1.url}/programs/{pid}/sandboxes/{sid}?wait=30", timeout=40).json()
            assert info["status"] == "ready", info
        assert len(labelled(docker_client, instance_id)) == 3
        r1.kill()  # a crash: nothing is cleaned up
        assert len(labelled(docker_client, instance_id)) == 3
        r2 = router(sim, instance_id, tmp_path)
        wait_until(lambda: not labelled(docker_client, instance_id), 60, "the start-up sweep to remove the orphans")
        # Agents that keep going with their program ids continue: re-admitted on their next request.
        for i in range(3):
            assert chat(r2.url, f"agent-{i}", 60).status_code == 200
        assert httpx.get(f"{r2.url}/programs/agent-0").json()["state"] == "active"
    finally:
        for p in (r2, r1, sim):
            if p is not None:
                p.stop()


def test_first_llm_call_is_not_delayed_by_sandbox_setup_when_it_waits_for_admission(
    docker_client: docker.DockerClient, instance_id: str, tmp_path
) -> None:
    """S = 3 s of sandbox set-up and W = 3 s of admission wait overlap: both are done after
    about max(S, W), not S + W."""
    sim = start_sim("tiny", workers=1, time_scale=TS, log_dir=tmp_path)
    r = None
    try:
        # Paper variant, no decay: the pool is the 32 K-token HBM, counted exactly.
        r = router(sim, instance_id, tmp_path, ["--thunder-variant", "paper", "--thunder-decay-base", "1"])
        assert chat(r.url, "filler", 28_000).status_code == 200       # occupies ~28 K of 32 K
        t0 = time.monotonic()
        sid = httpx.post(f"{r.url}/programs/late/sandboxes", json={"setup": [["sleep", "3"]]}).json()["id"]
        assert time.monotonic() - t0 < 1.5                              # create answers at once (set-up takes 3 s)

        import threading
        done: dict[str, float] = {}

        def first_call() -> None:
            assert chat(r.url, "late", 6_000).status_code == 200        # 28 K + 6 K > 32 K: held
            done["llm"] = time.monotonic() - t0

        th = threading.Thread(target=first_call)
        th.start()
        time.sleep(3.0)                                                 # W: the filler is busy
        assert "llm" not in done
        assert httpx.get(f"{r.url}/programs/late").json()["state"] == "new"   # still waiting for admission
        httpx.post(f"{r.url}/programs/filler/release")
        th.join(30)
        info = httpx.get(f"{r.url}/programs/late/sandboxes/{sid}?wait=30", timeout=40).json()
        ready = time.monotonic() - t0
        assert info["status"] == "ready"
        assert done["llm"] < 3.0 + 1.5, done          # admitted right after the release (W + ε)
        assert ready < 3.0 + 1.5, ready               # set-up ran during the wait, not after it
        assert max(done["llm"], ready) < 6.0 - 0.5    # far from the sequential S + W
    finally:
        for p in (r, sim):
            if p is not None:
                p.stop()
