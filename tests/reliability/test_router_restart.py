"""A router killed and restarted: agents continue with their program ids (re-admitted on
their next request), and the sandboxes the dead router left behind are swept."""

from __future__ import annotations

import httpx

from thunder_sgl.benchmark.drivers.peers import start_thunder
from thunder_sgl.children import wait_until

TS = 10.0


def chat(url: str, pid: str, n: int) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", timeout=60, json={
        "model": "tiny", "max_tokens": 8, "program_id": pid,
        "messages": [{"role": "user", "content": f"step {n} of {pid} " * 50}]})


def test_agents_continue_and_local_sandboxes_are_swept_after_a_crash(spawn, tmp_path):
    sim = spawn("sim", "tiny", workers=2, time_scale=TS)
    root = tmp_path / "sbx"
    cfg = tmp_path / "thunder.yaml"
    cfg.write_text(f"sandboxes:\n  provider: local\n  local_root: {root}\n")
    extra = ["--thunder-instance-id", "restart-test", "--thunder-config", str(cfg),
             "--thunder-state-dir", str(tmp_path / "state")]

    def leftovers() -> list:
        """Sandbox working directories of this router instance (local provider)."""
        return [d for d in root.rglob("*") if d.is_dir() and d.parent.name == "restart-test"] if root.exists() else []

    r1 = spawn("thunder", sim.urls, time_scale=TS, extra=extra)
    for i in range(3):
        assert chat(r1.url, f"a{i}", 0).status_code == 200
        sid = httpx.post(f"{r1.url}/programs/a{i}/sandboxes", json={"setup": ["echo ready > mark"]}).json()["id"]
        info = httpx.get(f"{r1.url}/programs/a{i}/sandboxes/{sid}?wait=20", timeout=30).json()
        assert info["status"] == "ready", info
    dirs = leftovers()
    assert len(dirs) == 3, dirs
    r1.kill()  # SIGKILL: no clean-up at all
    assert leftovers() == dirs                                  # orphans
    r2 = start_thunder(sim.urls, time_scale=TS, extra=extra, log_dir=tmp_path / "logs2", name="thunder-2")
    try:
        # The restarted router knows none of the programs: its start-up sweep removes their
        # sandboxes.
        wait_until(lambda: leftovers() == [], 30, "the start-up sweep to remove the orphans")
        # Agents keep sending with their program ids: re-admitted, served, and they can make new sandboxes.
        for i in range(3):
            for n in (1, 2):
                assert chat(r2.url, f"a{i}", n).status_code == 200
        p = httpx.get(f"{r2.url}/programs/a0").json()
        assert p["state"] == "active" and p["steps"] == 2
        sid = httpx.post(f"{r2.url}/programs/a0/sandboxes", json={}).json()["id"]
        assert httpx.get(f"{r2.url}/programs/a0/sandboxes/{sid}?wait=20", timeout=30).json()["status"] == "ready"
    finally:
        r2.stop()
