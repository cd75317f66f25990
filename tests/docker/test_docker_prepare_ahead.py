"""Ahead-of-time preparation: sandbox set-up overlaps the program's wait for admission, so
the first LLM call is not delayed by it, and a paused program's stopped container is
restarted while it waits to be restored."""

from __future__ import annotations

import asyncio
import time

import docker
from docker_helpers import ManagerFactory

from thunder_sgl.sandboxes import SandboxManager, SandboxStatus

SETUP_S = 2.0
"""S: environment set-up time (the spec's setup commands)."""
ADMISSION_WAIT_S = 2.0
"""W: how long the program waits in the global queue before its first LLM call is admitted."""
SLACK_S = 1.0
"""Container start and exec overhead on a loaded 2-core machine."""


async def admitted_after(seconds: float) -> float:
    """Stand-in for the scheduler: the program is admitted after ``seconds``."""
    await asyncio.sleep(seconds)
    return time.perf_counter()


async def timeline(m: SandboxManager, pid: str, ahead: bool) -> dict[str, float]:
    spec = {"setup": [f"sleep {SETUP_S}"]}
    t0 = time.perf_counter()
    if ahead:  # the sandbox is created when the program arrives
        info = await m.create(pid, spec)
        created = time.perf_counter()
        first_call = await admitted_after(ADMISSION_WAIT_S)
    else:  # the naive order: wait for admission, then set up the environment
        first_call = await admitted_after(ADMISSION_WAIT_S)
        info = await m.create(pid, spec)
        created = time.perf_counter()
    ready = await m.wait_ready(pid, info.id, 30)
    assert ready.status is SandboxStatus.READY, ready.error
    t_ready = time.perf_counter()
    return {"create": created - t0, "first_call": first_call - t0, "ready": t_ready - t0}


async def test_setup_overlaps_the_admission_wait(make_manager: ManagerFactory) -> None:
    m = await make_manager()
    ahead, naive = await asyncio.gather(timeline(m, "ahead", True), timeline(m, "naive", False))
    print(f"\n[prepare-ahead] S={SETUP_S}s W={ADMISSION_WAIT_S}s ahead={ahead} naive={naive}")
    # create answers at once: the first LLM call happens after W, not after S + W.
    assert ahead["create"] < 0.2
    assert ahead["first_call"] < ADMISSION_WAIT_S + 0.2
    # readiness comes at max(S, W) (+ container start), not S + W.
    assert ahead["ready"] < max(SETUP_S, ADMISSION_WAIT_S) + SLACK_S
    assert naive["ready"] >= SETUP_S + ADMISSION_WAIT_S
    assert naive["ready"] - ahead["ready"] > min(SETUP_S, ADMISSION_WAIT_S) - SLACK_S


async def test_a_paused_programs_stopped_container_is_restarted_before_it_is_restored(
    make_manager: ManagerFactory, docker_client: docker.DockerClient
) -> None:
    m = await make_manager()
    info = await m.create("p", {"setup": ["echo prepared > /tmp/state"]})
    info = await m.wait_ready("p", info.id, 30)
    assert info.handle is not None
    # Long paused: the router stops (does not remove) its containers.
    assert await m.stop_program("p") == 1
    assert not docker_client.api.inspect_container(info.handle)["State"]["Running"]
    assert m.get("p", info.id).status is SandboxStatus.STOPPED
    # Nearing the head of the queue: prepare ahead, then the program waits W more.
    t0 = time.perf_counter()
    assert await m.prepare_ahead("p") == 1
    await asyncio.sleep(3.0)          # the restore comes later than a docker start, even on a busy machine
    restored = m.get("p", info.id)
    assert restored.status is SandboxStatus.READY and restored.prepare_seconds is not None
    assert restored.prepare_seconds < 3.0 < time.perf_counter() - t0  # ready before restore
    assert docker_client.api.inspect_container(info.handle)["State"]["Running"]
    r = await m.exec("p", info.id, "cat /tmp/state", 10)
    assert r.stdout == "prepared\n"  # stopped, not removed: files survive


async def test_prepare_ahead_restarts_a_container_that_exited_behind_our_back(
    make_manager: ManagerFactory, docker_client: docker.DockerClient
) -> None:
    m = await make_manager()
    info = await m.wait_ready("p", (await m.create("p", {})).id, 30)
    assert info.handle is not None
    docker_client.api.kill(info.handle)
    assert await m.prepare_ahead("p", wait=True) == 1
    assert m.get("p", info.id).status is SandboxStatus.READY
    assert (await m.exec("p", info.id, "echo alive", 10)).stdout == "alive\n"
    docker_client.api.remove_container(info.handle, force=True)
    await m.prepare_ahead("p", wait=True)
    gone = m.get("p", info.id)
    assert gone.status is SandboxStatus.FAILED and gone.error == "the sandbox disappeared outside the router"
