"""Secure defaults, checked with docker inspect, and the routes' 4xx answers on docker."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import docker
import httpx
import pytest
from docker_helpers import ManagerFactory
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from thunder_sgl.errors import NotFound, ThunderError
from thunder_sgl.gateway.routes_sandboxes import build_sandbox_router
from thunder_sgl.sandboxes import SandboxManager, SandboxStatus
from thunder_sgl.sandboxes.config import SandboxConfig


async def test_containers_get_secure_defaults(make_manager: ManagerFactory, docker_client: docker.DockerClient, instance_id: str) -> None:
    m = await make_manager()
    info = await m.wait_ready("p", (await m.create("p", {"ports": 1})).id, 30)
    assert info.handle is not None
    c = docker_client.api.inspect_container(info.handle)
    host = c["HostConfig"]
    assert host["CapDrop"] == ["ALL"] and not host["CapAdd"]
    assert host["Privileged"] is False
    assert host["NetworkMode"] == "none"
    assert "no-new-privileges" in host["SecurityOpt"]
    assert host["Memory"] == 512 * 2**20 and host["MemorySwap"] == 512 * 2**20
    assert host["NanoCpus"] == 10**9
    assert host["PidsLimit"] == 256
    assert c["Config"]["Labels"] == {
        "thunder_sgl.program": "p", "thunder_sgl.instance": instance_id, "thunder_sgl.sandbox": info.id,
    }
    assert f"THUNDER_PORTS={info.ports[0]}" in c["Config"]["Env"]
    # From the inside: no capability at all, no network but loopback.
    status = (await m.exec("p", info.id, "grep -E '^Cap(Eff|Bnd)' /proc/self/status", 10)).stdout
    assert status.split() == ["CapEff:", "0000000000000000", "CapBnd:", "0000000000000000"]
    links = (await m.exec("p", info.id, "ls /sys/class/net", 10)).stdout.split()
    assert links == ["lo"]


async def test_spec_limits_and_host_network_reach_the_container(make_manager: ManagerFactory, docker_client: docker.DockerClient) -> None:
    m = await make_manager()
    spec = {"memory_mb": 128, "cpus": 0.5, "pids": 64, "network": "host", "read_only": True, "workdir": "/tmp/w"}
    info = await m.wait_ready("p", (await m.create("p", spec)).id, 30)
    assert info.status is SandboxStatus.READY and info.handle is not None, info.error
    host = docker_client.api.inspect_container(info.handle)["HostConfig"]
    assert (host["Memory"], host["NanoCpus"], host["PidsLimit"], host["NetworkMode"], host["ReadonlyRootfs"]) == (
        128 * 2**20, 5 * 10**8, 64, "host", True)
    r = await m.exec("p", info.id, "touch /bin/x; echo $?; touch ok && pwd", 10)
    assert r.stdout.split() == ["1", "/tmp/w"]


async def test_pids_limit_is_enforced(make_manager: ManagerFactory) -> None:
    m = await make_manager()
    info = await m.wait_ready("p", (await m.create("p", {"pids": 8})).id, 30)
    r = await m.exec("p", info.id, "for i in 1 2 3 4 5 6 7 8 9 10 11 12; do sleep 5 & done; wait", 20)
    assert "can't fork" in r.stderr or "Resource temporarily unavailable" in r.stderr, r


async def test_a_missing_image_fails_the_sandbox_with_a_clear_error(make_manager: ManagerFactory) -> None:
    m = await make_manager()
    info = await m.wait_ready("p", (await m.create("p", {"image": "no-such-image:1", "ports": 1})).id, 30)
    assert info.status is SandboxStatus.FAILED
    assert info.error == "image 'no-such-image:1' is not on the docker host (images are never pulled; build or import it)"
    assert m.ports.owned("p") == []


class Hooks:
    def __init__(self) -> None:
        self.live = {"p"}
        self.tool: list[tuple[str, float]] = []

    def require_program(self, program_id: str) -> None:
        if program_id not in self.live:
            raise NotFound(f"unknown program {program_id!r}")

    def ensure_program(self, program_id: str) -> None:
        self.live.add(program_id)

    def tool_started(self, program_id: str) -> None:
        self.tool.append(("started", time.perf_counter()))

    def tool_finished(self, program_id: str, seconds: float) -> None:
        self.tool.append(("finished", seconds))


@pytest.fixture
async def routed(make_manager: ManagerFactory) -> AsyncIterator[tuple[httpx.AsyncClient, Hooks, SandboxManager]]:
    m = await make_manager(SandboxConfig(provider="docker", max_memory_mb=1024))
    hooks = Hooks()
    app = FastAPI()

    @app.exception_handler(ThunderError)
    async def thunder_error(_: Request, err: ThunderError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status)

    app.include_router(build_sandbox_router(m, hooks))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as c:
        yield c, hooks, m


@pytest.mark.parametrize(
    ("spec", "param", "message"),
    [
        ({"network": "bridge"}, "network", "network 'bridge' is not allowed; allowed networks: ['none', 'host']"),
        ({"network": "container:abc"}, "network", "network 'container:abc' is not allowed; allowed networks: ['none', 'host']"),
        ({"memory_mb": 2048}, "memory_mb", "memory_mb=2048 exceeds the configured maximum 1024 (sandboxes.max_memory_mb)"),
        ({"privileged": True}, "privileged", "unknown field(s) ['privileged'] in sandbox spec; valid fields: "
         "['command', 'cpus', 'env', 'image', 'memory_mb', 'network', 'pids', 'ports', 'read_only', 'setup', 'workdir']"),
    ],
    ids=["bridge", "container-network", "memory", "privileged"],
)
async def test_specs_asking_for_more_are_400(routed: Any, spec: dict[str, Any], param: str, message: str) -> None:
    client, _, m = routed
    r = await client.post("/programs/p/sandboxes", json=spec)
    assert r.status_code == 400
    assert r.json() == {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": "invalid_request_error"}}
    assert m.programs() == []


async def test_exec_through_the_routes_and_after_release(routed: Any) -> None:
    client, hooks, m = routed
    sid = (await client.post("/programs/p/sandboxes", json={})).json()["id"]
    assert (await client.get(f"/programs/p/sandboxes/{sid}", params={"wait": 30})).json()["status"] == "ready"
    r = await client.post(f"/programs/p/sandboxes/{sid}/exec", json={"command": ["sh", "-c", "sleep 0.2; echo hi"]})
    assert r.status_code == 200 and r.json()["stdout"] == "hi\n"
    assert [t[0] for t in hooks.tool] == ["started", "finished"] and hooks.tool[1][1] == r.json()["duration_seconds"]
    await m.release_program("p")
    hooks.live.discard("p")
    r = await client.post(f"/programs/p/sandboxes/{sid}/exec", json={"command": "true"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
