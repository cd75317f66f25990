"""The sandbox routes in a small FastAPI app (local provider, fake program table): status
codes, OpenAI-shaped errors, and the tool-time hooks around exec."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from thunder_sgl.errors import NotFound, ThunderError
from thunder_sgl.gateway.routes_sandboxes import build_sandbox_router
from thunder_sgl.programs import ProgramTable
from thunder_sgl.sandboxes import SandboxManager
from thunder_sgl.sandboxes.hooks import TableHooks


class FakeHooks:
    """The router's side of ProgramHooks: a set of live programs and a log of tool events."""

    def __init__(self, *live: str) -> None:
        self.live = set(live)
        self.events: list[tuple[str, str, float]] = []

    def require_program(self, program_id: str) -> None:
        if program_id not in self.live:
            raise NotFound(f"unknown program {program_id!r}", param="program_id")

    def ensure_program(self, program_id: str) -> None:
        self.live.add(program_id)

    def tool_started(self, program_id: str) -> None:
        self.events.append(("started", program_id, time.perf_counter()))

    def tool_finished(self, program_id: str, seconds: float) -> None:
        self.events.append(("finished", program_id, seconds))


@pytest.fixture
def hooks() -> FakeHooks:
    return FakeHooks("p1", "p2")


@pytest.fixture
async def client(local_manager: SandboxManager, hooks: FakeHooks) -> AsyncIterator[httpx.AsyncClient]:
    app = FastAPI()

    @app.exception_handler(ThunderError)
    async def thunder_error(_: Request, err: ThunderError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status)

    app.include_router(build_sandbox_router(local_manager, hooks))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as c:
        yield c


async def ready_sandbox(client: httpx.AsyncClient, pid: str = "p1", spec: dict[str, Any] | None = None) -> str:
    r = await client.post(f"/programs/{pid}/sandboxes", json=spec or {})
    assert r.status_code == 202 and r.json()["status"] == "preparing", r.text
    sid = r.json()["id"]
    r = await client.get(f"/programs/{pid}/sandboxes/{sid}", params={"wait": 10})
    assert r.json()["status"] == "ready", r.text
    return str(sid)


def error(r: httpx.Response) -> dict[str, Any]:
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return dict(body["error"])


async def test_exec_marks_the_program_acting_for_exactly_the_reported_duration(client: httpx.AsyncClient, hooks: FakeHooks) -> None:
    sid = await ready_sandbox(client)
    r = await client.post(f"/programs/p1/sandboxes/{sid}/exec", json={"command": "sleep 0.3; echo done; exit 2"})
    assert r.status_code == 200
    body = r.json()
    assert (body["exit_code"], body["stdout"], body["stderr"], body["timed_out"]) == (2, "done\n", "", False)
    assert [e[:2] for e in hooks.events] == [("started", "p1"), ("finished", "p1")]
    assert hooks.events[1][2] == body["duration_seconds"] and 0.3 <= body["duration_seconds"] < 2


async def test_exec_timeout_is_a_result_and_still_finishes_the_tool(client: httpx.AsyncClient, hooks: FakeHooks) -> None:
    sid = await ready_sandbox(client)
    r = await client.post(f"/programs/p1/sandboxes/{sid}/exec", json={"command": ["sleep", "10"], "timeout": 0.3})
    body = r.json()
    assert r.status_code == 200 and body["timed_out"] and body["exit_code"] == 124
    assert hooks.events[-1][:2] == ("finished", "p1") and hooks.events[-1][2] == body["duration_seconds"]


@pytest.mark.parametrize(
    ("body", "status", "param", "fragment"),
    [
        ({"command": 5}, 400, "command", "command must be a string or a non-empty list of strings"),
        ({"command": "ls", "timeout": -1}, 400, "timeout", "timeout must be a number of seconds > 0"),
        ({"cmd": "ls"}, 400, "cmd", "unknown field(s) ['cmd'] in exec request"),
    ],
)
async def test_rejected_exec_never_touches_tool_time(
    client: httpx.AsyncClient, hooks: FakeHooks, body: dict[str, Any], status: int, param: str, fragment: str
) -> None:
    sid = await ready_sandbox(client)
    r = await client.post(f"/programs/p1/sandboxes/{sid}/exec", json=body)
    assert r.status_code == status
    err = error(r)
    assert err["param"] == param and fragment in err["message"] and err["type"] == "invalid_request_error"
    assert hooks.events == []


async def test_exec_on_a_preparing_sandbox_is_409(client: httpx.AsyncClient, hooks: FakeHooks) -> None:
    r = await client.post("/programs/p1/sandboxes", json={"setup": ["sleep 5"]})
    sid = r.json()["id"]
    r = await client.post(f"/programs/p1/sandboxes/{sid}/exec", json={"command": "true"})
    assert r.status_code == 409
    assert error(r)["code"] == "sandbox_preparing"
    assert error(r)["message"] == f"sandbox {sid} is preparing; exec needs status ready"
    assert hooks.events == []
    r = await client.get(f"/programs/p1/sandboxes/{sid}", params={"wait": 0.1})  # long-poll ends with the status
    assert r.status_code == 200 and r.json()["status"] == "preparing"


async def test_exec_on_a_released_program_is_404(client: httpx.AsyncClient, hooks: FakeHooks, local_manager: SandboxManager) -> None:
    sid = await ready_sandbox(client)
    await local_manager.release_program("p1")
    hooks.live.discard("p1")
    r = await client.post(f"/programs/p1/sandboxes/{sid}/exec", json={"command": "true"})
    assert r.status_code == 404 and error(r)["message"] == "unknown program 'p1'"
    # Even when the router still knows the program, the manager no longer knows the sandbox.
    hooks.live.add("p1")
    r = await client.post(f"/programs/p1/sandboxes/{sid}/exec", json={"command": "true"})
    assert r.status_code == 404 and error(r)["code"] == "sandbox_not_found"
    assert hooks.events == []


async def test_unknown_sandbox_and_another_programs_sandbox_are_404(client: httpx.AsyncClient) -> None:
    sid = await ready_sandbox(client, "p1")
    for url in ("/programs/p1/sandboxes/sb-nope", f"/programs/p2/sandboxes/{sid}"):
        r = await client.get(url)
        assert r.status_code == 404 and error(r)["type"] == "not_found_error"
    r = await client.delete(f"/programs/p2/sandboxes/{sid}")
    assert r.status_code == 404


@pytest.mark.parametrize(
    ("content", "param", "message"),
    [
        (b'{"network": "bridge"}', "network", "network 'bridge' is not allowed; allowed networks: ['none', 'host']"),
        (b'{"memory_mb": 999999}', "memory_mb", "memory_mb=999999 exceeds the configured maximum 8192 (sandboxes.max_memory_mb)"),
        (b'{"cpus": "lots"}', "cpus", "cpus must be a number, got 'lots'"),
        (b"[1, 2]", "spec", "sandbox spec must be a JSON object"),
        (b"{not json", "body", "request body is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
    ],
)
async def test_malformed_spec_is_400_in_openai_shape(client: httpx.AsyncClient, content: bytes, param: str, message: str) -> None:
    r = await client.post("/programs/p1/sandboxes", content=content, headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert error(r) == {"message": message, "type": "invalid_request_error", "param": param, "code": "invalid_request_error"}


async def test_create_with_empty_body_uses_defaults_and_lists(client: httpx.AsyncClient) -> None:
    r = await client.post("/programs/p1/sandboxes")
    assert r.status_code == 202 and r.json()["network"] == "none" and r.json()["provider"] == "local"
    r = await client.get("/programs/p1/sandboxes")
    assert r.status_code == 200 and [s["object"] for s in r.json()["data"]] == ["sandbox"]


async def test_unknown_program_is_404_on_every_route_but_create(client: httpx.AsyncClient, local_manager: SandboxManager) -> None:
    for method, path in (("GET", "/programs/ghost/sandboxes"), ("GET", "/programs/ghost/sandboxes/sb-1"),
                         ("POST", "/programs/ghost/sandboxes/sb-1/exec"), ("DELETE", "/programs/ghost/sandboxes/sb-1")):
        r = await client.request(method, path, json={"command": "true"} if method == "POST" else None)
        assert r.status_code == 404, (method, path)
    assert local_manager.programs() == []


async def test_create_registers_a_program_not_seen_yet(client: httpx.AsyncClient, hooks: FakeHooks) -> None:
    """An agent may create its sandbox before its first LLM call (preparation then overlaps
    the wait for admission)."""
    r = await client.post("/programs/early/sandboxes", json={})
    assert r.status_code == 202 and "early" in hooks.live


async def test_delete_answers_removed_and_then_exec_is_409(client: httpx.AsyncClient) -> None:
    sid = await ready_sandbox(client)
    r = await client.delete(f"/programs/p1/sandboxes/{sid}")
    assert r.status_code == 200 and r.json()["status"] == "removed"
    assert (await client.get(f"/programs/p1/sandboxes/{sid}")).json()["status"] == "removed"
    r = await client.post(f"/programs/p1/sandboxes/{sid}/exec", json={"command": "true"})
    assert r.status_code == 409 and error(r)["code"] == "sandbox_removed"


async def test_bad_wait_is_400(client: httpx.AsyncClient) -> None:
    sid = await ready_sandbox(client)
    for wait in ("soon", "-1", "3600"):
        r = await client.get(f"/programs/p1/sandboxes/{sid}", params={"wait": wait})
        assert r.status_code == 400 and error(r)["param"] == "wait"


async def test_register_a_port_then_another_program_cannot(client: httpx.AsyncClient, local_manager: SandboxManager) -> None:
    r = await client.post("/programs/p1/resources", json={"kind": "port", "port": 45123})
    assert r.status_code == 201 and r.json() == {"object": "resource", "program_id": "p1", "kind": "port", "port": 45123}
    r = await client.post("/programs/p2/resources", json={"kind": "port", "port": 45123})
    assert r.status_code == 409 and error(r)["code"] == "port_taken"
    assert local_manager.owned("p1")["ports"] == [45123]
    await local_manager.release_program("p1")
    r = await client.post("/programs/p2/resources", json={"kind": "port", "port": 45123})
    assert r.status_code == 201


async def test_register_a_container_without_docker_is_400(client: httpx.AsyncClient) -> None:
    r = await client.post("/programs/p1/resources", json={"kind": "container", "id": "abc123"})
    assert r.status_code == 400 and error(r)["param"] == "kind"
    r = await client.post("/programs/p1/resources", content=b"")
    assert r.status_code == 400 and error(r)["message"] == "request body must be a JSON object"


async def test_table_hooks_account_tool_time_on_the_program(local_manager: SandboxManager) -> None:
    table = ProgramTable()
    program = table.create("agent", now=0.0)
    app = FastAPI()

    @app.exception_handler(ThunderError)
    async def thunder_error(_: Request, err: ThunderError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status)

    app.include_router(build_sandbox_router(local_manager, TableHooks(table)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as c:
        sid = await ready_sandbox(c, "agent")
        r = await c.post(f"/programs/agent/sandboxes/{sid}/exec", json={"command": "sleep 0.2"})
        assert program.tool_running == 0 and program.last_tool_seconds == r.json()["duration_seconds"]
        assert program.total_tool_seconds == program.last_tool_seconds >= 0.2
        table.remove("agent", now=1.0)
        await local_manager.release_program("agent")
        r = await c.post(f"/programs/agent/sandboxes/{sid}/exec", json={"command": "true"})
        assert r.status_code == 404 and error(r)["code"] == "program_not_found"
