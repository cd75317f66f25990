"""Docker sandboxes at scale and across a crash: nothing labelled ours outlives its program."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import docker
import pytest
from docker_helpers import IMAGE, ManagerFactory, labelled
from sandbox_owner import kill_owner, start_owner

from thunder_sgl.sandboxes import SandboxStatus
from thunder_sgl.sandboxes.config import SandboxConfig
from thunder_sgl.sandboxes.ports import port_is_free

N_PROGRAMS = 200
LISTEN_EVERY = 10
"""Every 10th program's sandbox uses the host network and listens on its port."""


@pytest.mark.slow
async def test_200_programs_create_exec_release_leave_no_container_and_no_port(
    make_manager: ManagerFactory, docker_client: docker.DockerClient, instance_id: str
) -> None:
    m = await make_manager()
    listen = {"network": "host", "ports": 1, "command": "exec httpd -f -p 127.0.0.1:$THUNDER_PORTS"}
    plain = {"ports": 1, "memory_mb": 64, "pids": 32}
    pids = [f"prog-{i}" for i in range(N_PROGRAMS)]
    t0 = time.perf_counter()
    infos = await asyncio.gather(*(m.create(p, listen if i % LISTEN_EVERY == 0 else plain) for i, p in enumerate(pids)))
    t_created = time.perf_counter()
    ready = await asyncio.gather(*(m.wait_ready(i.program_id, i.id, 150) for i in infos))
    t_ready = time.perf_counter()
    assert [r.status for r in ready] == [SandboxStatus.READY] * N_PROGRAMS, {r.error for r in ready}
    assert len(labelled(docker_client, instance_id)) == N_PROGRAMS
    ports = [p for r in ready for p in r.ports]
    assert len(set(ports)) == N_PROGRAMS and m.ports.in_use == N_PROGRAMS
    listening = [r.ports[0] for i, r in enumerate(ready) if i % LISTEN_EVERY == 0]
    assert not any(port_is_free(p) for p in listening)

    results = await asyncio.gather(*(m.exec(i.program_id, i.id, "echo $THUNDER_PROGRAM_ID:$THUNDER_PORTS", 60) for i in infos))
    t_exec = time.perf_counter()
    expected = [f"{i.program_id}:{i.ports[0]}\n" for i in infos]
    wrong = [k for k, (r, e) in enumerate(zip(results, expected, strict=True)) if r.stdout != e]
    # The docker daemon now and then drops the whole output of a command that ends at once
    # (moby/moby#27289, docker/docker-py#2042: exit code 0, stdout empty); one such exec of 200
    # failed CI on 2026-12-02. Anything else — wrong output, a failed exec, more than 1% lost —
    # is ours.
    assert all(results[k].stdout == "" and results[k].exit_code == 0 for k in wrong), [results[k] for k in wrong]
    assert len(wrong) <= N_PROGRAMS // 100, wrong

    summaries = await asyncio.gather(*(m.release_program(p) for p in pids))
    t_released = time.perf_counter()
    assert all(s["sandboxes"] == 1 and not s["errors"] for s in summaries)
    assert labelled(docker_client, instance_id) == []
    assert m.ports.in_use == 0 and all(port_is_free(p) for p in ports)
    exec_lat = sorted(r.duration_seconds for r in results)
    print(
        f"\n[200 programs] create calls {t_created - t0:.2f}s, all ready {t_ready - t0:.1f}s, "
        f"200 execs {t_exec - t_ready:.1f}s (p50 {exec_lat[100] * 1000:.0f} ms, p99 {exec_lat[198] * 1000:.0f} ms), "
        f"200 releases {t_released - t_exec:.1f}s, total {t_released - t0:.1f}s"
    )
    assert t_released - t0 < 180


async def test_a_restarted_router_sweeps_the_orphans_of_a_killed_one(
    make_manager: ManagerFactory, docker_client: docker.DockerClient, instance_id: str, tmp_path: Path
) -> None:
    state = tmp_path / "sandbox-resources.json"
    owner, report = start_owner("docker", instance_id, 5, "--state", str(state))
    try:
        kill_owner(owner)
        orphans = labelled(docker_client, instance_id)
        assert len(orphans) == 5 and all(c["State"] == "running" for c in orphans)
        external = docker_client.containers.get(report["external"])
        assert external.status == "running"

        # The same instance id after a restart; the router's table knows only prog-0 (say it
        # was persisted): everything else is swept, including the journaled external container.
        fresh = await make_manager(state_path=state)
        assert await fresh.sweep_orphans(live_program_ids={"prog-0"}) == 5
        left = labelled(docker_client, instance_id)
        assert [c["Labels"]["thunder_sgl.program"] for c in left] == ["prog-0"]
        assert docker_client.api.containers(all=True, filters={"id": report["external"]}) == []

        # prog-0 is released later by a manager that never created its sandbox: the label
        # safety net of release finds it.
        assert (await fresh.release_program("prog-0"))["stray"] == 1
        assert labelled(docker_client, instance_id) == []
    finally:
        if owner.poll() is None:
            kill_owner(owner)


async def test_another_instances_containers_are_never_swept(
    make_manager: ManagerFactory, docker_client: docker.DockerClient, instance_id: str
) -> None:
    m = await make_manager()
    info = await m.create("p", {})
    await m.wait_ready("p", info.id, 30)
    other = await make_manager(instance="someone-else")
    assert await other.sweep_orphans(set()) == 0
    assert len(labelled(docker_client, instance_id)) == 1


async def test_registered_external_container_is_reaped_with_its_program(
    make_manager: ManagerFactory, docker_client: docker.DockerClient, instance_id: str
) -> None:
    m = await make_manager()
    c = docker_client.containers.create(IMAGE, ["sleep", "3600"], name=f"ext-{instance_id}", network_mode="none")
    c.start()
    got = await m.register_resource("p", {"kind": "container", "id": c.name})
    assert got["id"] == c.id and m.owned("p")["containers"] == [c.id]
    await m.release_program("p")
    assert docker_client.api.containers(all=True, filters={"id": c.id}) == []


async def test_registering_a_container_of_another_program_is_403_and_unknown_is_404(make_manager: ManagerFactory) -> None:
    m = await make_manager()
    info = await m.create("owner", {})
    info = await m.wait_ready("owner", info.id, 30)
    for body, status in (({"kind": "container", "id": info.handle}, 403), ({"kind": "container", "id": "no-such-container"}, 404)):
        try:
            await m.register_resource("thief", body)
        except Exception as e:
            assert getattr(e, "status", None) == status, e
        else:
            raise AssertionError("registration should have failed")
    assert m.get("owner", info.id).status is SandboxStatus.READY


async def test_docker_exec_timeout_kills_the_command_inside_the_container(make_manager: ManagerFactory) -> None:
    m = await make_manager(SandboxConfig(provider="docker"))
    info = await m.create("p", {})
    await m.wait_ready("p", info.id, 30)
    t0 = time.perf_counter()
    r = await m.exec("p", info.id, "echo begin; sleep 30", 0.5)
    assert r.timed_out and r.exit_code == 124 and r.stdout == "begin\n" and time.perf_counter() - t0 < 5
    ps = await m.exec("p", info.id, "ps -o args", 10)
    assert "sleep 30" not in ps.stdout, ps.stdout
