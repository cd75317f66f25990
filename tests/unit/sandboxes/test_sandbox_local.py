"""Local-process sandboxes through the manager: lifecycle, exec, reaping, ahead-of-time
preparation and the sweep of a crashed owner's leftovers."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sandbox_owner import kill_owner, start_owner, tagged_pids

from thunder_sgl.errors import ConfigError, Conflict, Forbidden, GatewayTimeout, NotFound
from thunder_sgl.sandboxes import SandboxManager, SandboxStatus, open_manager, open_provider, procs
from thunder_sgl.sandboxes.base import ENV_PROGRAM, ENV_SANDBOX
from thunder_sgl.sandboxes.config import SandboxConfig
from thunder_sgl.sandboxes.local import LocalProvider
from thunder_sgl.sandboxes.ports import port_is_free

S = SandboxStatus


async def ready(m: SandboxManager, pid: str, spec: dict | None = None) -> str:
    info = await m.create(pid, spec or {})
    assert info.status is S.PREPARING
    info = await m.wait_ready(pid, info.id, 10)
    assert info.status is S.READY, info.error
    return info.id


async def test_create_returns_at_once_and_prepares_in_the_background(local_manager: SandboxManager) -> None:
    t0 = time.perf_counter()
    info = await local_manager.create("p", {"setup": ["sleep 0.5"]})
    assert time.perf_counter() - t0 < 0.3          # well before the 0.5 s set-up ends
    assert local_manager.get("p", info.id).status is S.PREPARING
    with pytest.raises(GatewayTimeout):
        await local_manager.wait_ready("p", info.id, 0.05)
    done = await local_manager.wait_ready("p", info.id, 10)
    assert done.status is S.READY and done.prepare_seconds is not None and done.prepare_seconds >= 0.5


async def test_setup_overlaps_the_admission_wait(local_manager: SandboxManager) -> None:
    """S = W = 1 s: created at arrival, the sandbox is ready at max(S, W), not S + W, and
    the first LLM call (after admission) is not delayed by it. The docker version of this
    test measures the same with a real container."""
    s = w = 1.0
    t0 = time.perf_counter()
    info = await local_manager.create("p", {"setup": [f"sleep {s}"]})
    assert time.perf_counter() - t0 < 0.3
    await asyncio.sleep(w)  # waiting for admission
    first_call = time.perf_counter() - t0
    await local_manager.wait_ready("p", info.id, 10)
    ready_at = time.perf_counter() - t0
    assert first_call < w + 0.3 and ready_at < max(s, w) + 0.5 < s + w


async def test_exec_reports_exit_code_stdout_stderr_and_duration(local_manager: SandboxManager) -> None:
    sid = await ready(local_manager, "p")
    r = await local_manager.exec("p", sid, "echo out; echo err >&2; sleep 0.2; exit 3", 5)
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (3, "out\n", "err\n", False)
    assert 0.2 <= r.duration_seconds < 2


async def test_exec_timeout_kills_the_whole_process_group(local_manager: SandboxManager, instance_id: str) -> None:
    sid = await ready(local_manager, "p")
    t0 = time.perf_counter()
    r = await local_manager.exec("p", sid, ["sh", "-c", "echo started; sleep 30 & sleep 30"], 0.5)
    assert r.timed_out and r.exit_code == 124 and r.stdout == "started\n"
    assert 0.5 <= r.duration_seconds < 2 and time.perf_counter() - t0 < 3
    assert await gone(instance_id, **{ENV_SANDBOX: sid})


async def test_environment_is_scrubbed_and_tagged(local_manager: SandboxManager, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROUTER_SECRET_KEY", "hunter2")
    sid = await ready(local_manager, "p", {"ports": 2, "env": {"MODE": "test"}})
    r = await local_manager.exec("p", sid, "env", 5, env={"EXTRA": "1"})
    env = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
    assert "ROUTER_SECRET_KEY" not in env
    assert env["MODE"] == "test" and env["EXTRA"] == "1" and env[ENV_PROGRAM] == "p" and env[ENV_SANDBOX] == sid
    assert env["THUNDER_PORTS"] == ",".join(map(str, local_manager.get("p", sid).ports))
    assert env["HOME"].endswith("/work")


async def test_workdir_maps_into_the_sandbox_tree(local_manager: SandboxManager) -> None:
    sid = await ready(local_manager, "p", {"workdir": "/repo"})
    r = await local_manager.exec("p", sid, "pwd; touch made-here", 5)
    handle = Path(local_manager.get("p", sid).handle or "")
    assert r.stdout.strip() == str(handle / "work" / "repo")
    assert (handle / "work" / "repo" / "made-here").exists()
    r = await local_manager.exec("p", sid, "true", 5, workdir="/missing")
    assert r.exit_code == 126 and "does not exist" in r.stderr  # a result, as docker answers
    r = await local_manager.exec("p", sid, ["no-such-binary-here"], 5)
    assert r.exit_code == 127


async def test_output_beyond_the_cap_is_truncated(tmp_path: Path, instance_id: str) -> None:
    m = SandboxManager(SandboxConfig(provider="local"), LocalProvider(instance_id, tmp_path, max_output_bytes=100), instance_id)
    try:
        sid = await ready(m, "p")
        r = await m.exec("p", sid, "yes | head -c 5000", 5)
        assert len(r.stdout) == 100 and r.truncated
    finally:
        await m.close()


async def test_background_child_holding_stdout_does_not_hold_the_exec(local_manager: SandboxManager) -> None:
    sid = await ready(local_manager, "p")
    t0 = time.perf_counter()
    r = await local_manager.exec("p", sid, "sleep 20 & echo spawned", 5)
    assert r.exit_code == 0 and r.stdout == "spawned\n" and time.perf_counter() - t0 < 2


async def test_delete_removes_and_exec_after_it_is_409(local_manager: SandboxManager, instance_id: str) -> None:
    sid = await ready(local_manager, "p", {"command": ["sleep", "300"], "ports": 1})
    handle = local_manager.get("p", sid).handle
    port = local_manager.get("p", sid).ports[0]
    assert tagged_pids(instance_id, **{ENV_SANDBOX: sid})
    info = await local_manager.delete("p", sid)
    assert info.status is S.REMOVED and local_manager.get("p", sid).status is S.REMOVED
    assert await gone(instance_id, **{ENV_SANDBOX: sid}) and not Path(handle or "").exists()
    assert local_manager.ports.owner_of(port) is None
    with pytest.raises(Conflict, match="is removed; exec needs status ready"):
        await local_manager.exec("p", sid, "true", 5)
    with pytest.raises(NotFound):
        await local_manager.exec("p", "sb-unknown", "true", 5)


async def test_delete_while_preparing_kills_the_setup(local_manager: SandboxManager, instance_id: str) -> None:
    info = await local_manager.create("p", {"setup": ["sleep 30"]})
    await asyncio.sleep(0.3)
    t0 = time.perf_counter()
    await local_manager.delete("p", info.id)
    assert time.perf_counter() - t0 < 3
    assert local_manager.get("p", info.id).status is S.REMOVED
    assert await gone(instance_id, **{ENV_PROGRAM: "p"})


async def test_failed_setup_is_reported_and_owns_nothing(local_manager: SandboxManager, instance_id: str) -> None:
    info = await local_manager.create("p", {"setup": ["echo preparing", "echo broken >&2; exit 7"], "ports": 1})
    done = await local_manager.wait_ready("p", info.id, 10)
    assert done.status is S.FAILED
    assert done.error == "setup[1] ['sh', '-c', 'echo broken >&2; exit 7'] exited with 7: broken"
    assert local_manager.ports.owned("p") == [] and done.handle is None
    with pytest.raises(Conflict, match="is failed: setup"):
        await local_manager.exec("p", info.id, "true", 5)


async def test_release_reaps_every_process_even_setsid_escapees(local_manager: SandboxManager, instance_id: str) -> None:
    sids = [await ready(local_manager, "p", {"command": ["sleep", "300"], "ports": 1}) for _ in range(2)]
    ports = local_manager.ports.owned("p")
    await local_manager.exec("p", sids[0], "setsid sleep 300 >/dev/null 2>&1 &", 5)
    await local_manager.register_resource("p", {"kind": "port", "port": 1024 + os.getpid() % 1000})
    assert await eventually(lambda: len(tagged_pids(instance_id, **{ENV_PROGRAM: "p"})) >= 3)
    summary = await local_manager.release_program("p")
    assert summary["sandboxes"] == 2 and summary["errors"] == []
    assert await gone(instance_id, **{ENV_PROGRAM: "p"})
    assert local_manager.ports.in_use == 0 and all(port_is_free(p) for p in ports)
    assert local_manager.owned("p") == {"sandboxes": [], "containers": [], "ports": []}
    assert (await local_manager.release_program("p"))["sandboxes"] == 0  # idempotent
    with pytest.raises(NotFound):
        local_manager.get("p", sids[0])


async def test_concurrent_releases_share_one_and_a_reused_id_waits_for_it(local_manager: SandboxManager) -> None:
    await ready(local_manager, "p", {"command": ["sleep", "300"]})
    first, second = await asyncio.gather(local_manager.release_program("p"), local_manager.release_program("p"))
    assert first == second and first["sandboxes"] == 1
    release = asyncio.ensure_future(local_manager.release_program("p"))
    await asyncio.sleep(0)  # the release has begun
    sid = await ready(local_manager, "p")  # same id, new life: not reaped by the release above
    await release
    assert local_manager.get("p", sid).status is S.READY


class SlowCreate(LocalProvider):
    """A provider whose creates wait in a backlog and, once asked, cannot be called off (the
    docker SDK's call runs in a worker thread: cancelling the awaiting task does not stop it)."""

    async def create(self, program_id, sandbox_id, spec, ports):  # type: ignore[no-untyped-def]
        async def later() -> str:
            await asyncio.sleep(0.8)
            return await LocalProvider.create(self, program_id, sandbox_id, spec, ports)

        return await asyncio.shield(asyncio.ensure_future(later()))


async def test_close_waits_for_releases_in_flight_so_nothing_is_created_after_it(tmp_path: Path, instance_id: str) -> None:
    m = SandboxManager(SandboxConfig(provider="local"), SlowCreate(instance_id, tmp_path / "sb"), instance_id)
    info = await m.create("p0", {"command": ["sleep", "300"]})
    assert info.status is S.PREPARING
    handler = asyncio.ensure_future(m.release_program("p0"))  # a release route's handler ...
    await asyncio.sleep(0.05)
    handler.cancel()  # ... cancelled by the server's shutdown: the release itself goes on
    assert m.releasing == 1 and m.programs() == []
    await m.close()  # owns nothing any more, but must not return before p0's release ends
    assert m.releasing == 0
    await asyncio.sleep(1.2)  # a create left running would have made its process by now
    assert await gone(instance_id)
    assert not list((tmp_path / "sb").glob("*/*"))


async def test_stop_then_prepare_ahead_restarts_before_the_program_runs(local_manager: SandboxManager, instance_id: str) -> None:
    sid = await ready(local_manager, "p", {"command": ["sleep", "300"]})
    assert await local_manager.stop_program("p") == 1
    assert local_manager.get("p", sid).status is S.STOPPED
    def states() -> set[str]:
        return {procs.state(p) for p in tagged_pids(instance_id, **{ENV_SANDBOX: sid})}

    assert await eventually(lambda: states() == {"T"})
    assert await local_manager.prepare_ahead("p", wait=True) == 1
    assert local_manager.get("p", sid).status is S.READY
    assert await eventually(lambda: states() == {"S"})


async def test_exec_on_a_sandbox_the_router_stopped_restarts_it(tmp_path: Path, instance_id: str) -> None:
    config = SandboxConfig(provider="local", prepare_ahead=False)
    m = SandboxManager(config, LocalProvider(instance_id, tmp_path), instance_id)
    try:
        sid = await ready(m, "p", {"command": ["sleep", "300"]})
        await m.stop_program("p")
        assert await m.prepare_ahead("p", wait=True) == 0  # switched off by config
        r = await m.exec("p", sid, "echo back", 5)
        assert r.stdout == "back\n" and m.get("p", sid).status is S.READY
    finally:
        await m.close()


async def test_too_many_sandboxes_is_409(local_manager: SandboxManager) -> None:
    for _ in range(4):
        await local_manager.create("p", {})
    with pytest.raises(Conflict, match=r"program already owns 4 sandboxes \(sandboxes.max_sandboxes_per_program\)"):
        await local_manager.create("p", {})


async def test_container_resources_need_docker(local_manager: SandboxManager) -> None:
    with pytest.raises(Exception, match="container resources need the docker sandbox provider") as e:
        await local_manager.register_resource("p", {"kind": "container", "id": "abc"})
    assert getattr(e.value, "status", None) == 400


async def test_provider_none_refuses_sandboxes_with_403() -> None:
    m = SandboxManager(SandboxConfig(provider="none"), None, "x")
    with pytest.raises(Forbidden, match="sandboxes are disabled"):
        await m.create("p", {})
    assert (await m.release_program("p"))["sandboxes"] == 0 and await m.sweep_orphans(set()) == 0


async def test_sweep_reaps_the_local_sandboxes_of_a_killed_owner(tmp_path: Path, instance_id: str) -> None:
    root = tmp_path / "sandboxes"
    owner, report = start_owner("local", instance_id, 3, "--root", str(root))
    boxes = report["sandboxes"]
    try:
        kill_owner(owner)
        # Orphans: the owner is dead, its sandboxes' processes (and setsid escapees) live on.
        assert await eventually(lambda: len(tagged_pids(instance_id)) >= 6)
        fresh = SandboxManager(SandboxConfig(provider="local"), LocalProvider(instance_id, root), instance_id)
        assert await fresh.sweep_orphans(live_program_ids={"prog-0"}) == 2
        assert await eventually(lambda: tagged_pids(instance_id) == tagged_pids(instance_id, **{ENV_PROGRAM: "prog-0"}))
        assert [d.name for d in (root / instance_id).iterdir()] == [boxes[0]["id"]]
        # The live program is released later by a manager that never created its sandbox.
        assert (await fresh.release_program("prog-0"))["stray"] == 1
        assert await gone(instance_id) and list((root / instance_id).iterdir()) == []
        await fresh.close()
    finally:
        if owner.poll() is None:
            kill_owner(owner)


async def gone(instance_id: str, **match: str) -> bool:
    """No live process carries the tag (a SIGKILLed process lingers for an instant)."""
    return await eventually(lambda: tagged_pids(instance_id, **match) == [])


async def eventually(check: Callable[[], bool], timeout: float = 2.0) -> bool:
    """A process that is in the middle of execve shows an empty environ for an instant."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def test_a_command_that_cannot_start_fails_the_sandbox_and_leaves_no_directory(local_manager: SandboxManager, tmp_path: Path) -> None:
    info = await local_manager.create("p", {"command": ["/no/such/server"], "ports": 1})
    done = await local_manager.wait_ready("p", info.id, 10)
    assert done.status is S.FAILED and done.error is not None and "cannot start command ['/no/such/server']" in done.error
    assert list((tmp_path / "sandboxes").glob("*/sb-*")) == [] and local_manager.ports.owned("p") == []


async def test_provider_is_chosen_by_config_and_docker_fails_loudly_without_a_daemon(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    assert open_provider(SandboxConfig(provider="none"), "i") is None
    assert isinstance(open_provider(SandboxConfig(provider="local"), "i", local_root=tmp_path), LocalProvider)
    assert isinstance(open_provider(SandboxConfig(provider="auto"), "i", local_root=tmp_path), LocalProvider)
    with pytest.raises(ConfigError, match="sandboxes.provider is docker but no docker daemon answers"):
        open_provider(SandboxConfig(provider="docker"), "i")
    m = await open_manager(SandboxConfig(provider="auto"), "i", local_root=tmp_path)
    assert m.provider is not None and m.provider.name == "local"
    await m.close()
