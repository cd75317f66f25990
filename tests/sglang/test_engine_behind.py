"""Engines controlled behind thunder's back, on real SGLang 0.5.23 CPU servers (issue 24):
agents send through thunder while the test, as an RL framework would, calls one engine
directly.

- Weights reloaded on one engine (``/update_weights_from_disk`` with a new ``weight_version``):
  thunder reads the version (answers, ``/model_info``) and resets the KV accounting of that
  engine's programs only, as after an update through it; every request is answered.
- One engine's cache dropped with no new version (a direct ``/flush_cache``, or
  ``/update_weights_from_disk`` without a ``weight_version``): thunder reads it from the
  answers (``control.kvdrop``: two programs in a row that stayed placed there find their
  prefix gone after the engine was idle) and resets that engine's programs only, once.
- One engine paused (``/pause_generation``): thunder reads it from the engine's ``/ready``
  (503 while paused, ``backends.pause``), shows it paused in ``GET /workers``, holds the
  requests of its programs — none fails, none times out although the pause outlasts thunder's
  held and upstream timeouts — keeps the programs there, and after ``/continue_generation``
  everything completes.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx
import pytest

from thunder_sgl.children import wait_until
from thunder_sgl.textgen import text

X = {"ignore_eos": True}
TIMEOUT_S = 20.0
"""thunder's held and upstream timeouts in the pause test; the pause lasts longer."""
PAUSE_S = 30.0


@pytest.fixture(scope="module")
def engines(start_cluster):
    return start_cluster(2, max_total_tokens=16384, threads=1)


def chat(pid: str, step: int, tokens: int) -> dict:
    msgs = [{"role": "system", "content": text(120, "behind-system")},
            {"role": "user", "content": text(150, f"behind-{pid}")}]
    for i in range(step):
        msgs += [{"role": "assistant", "content": text(20, f"{pid}-a{i}")}, {"role": "user", "content": text(30, f"{pid}-o{i}")}]
    return {"model": "default", "messages": msgs, "max_tokens": tokens, "program_id": pid, **X}


@dataclass
class Agents:
    """Agent programs stepping through thunder until stopped; what each answer said."""

    url: str
    tokens: int = 16
    tool_s: float = 0.2
    statuses: list[int] = field(default_factory=list)
    steps: dict[str, list[tuple[float, str | None]]] = field(default_factory=dict)
    """Per program: (time answered, the answer's weight version) of each step."""
    aborted: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, http: httpx.AsyncClient, pid: str) -> None:
        step = 0
        while not self.stop.is_set():
            r = await http.post(self.url + "/v1/chat/completions", json=chat(pid, step, self.tokens))
            self.statuses.append(r.status_code)
            assert r.status_code == 200, r.text
            body = r.json()
            if body["choices"][0]["finish_reason"] == "abort":
                self.aborted += 1  # an abort pause answered it: sent again, as RL frameworks do
                continue
            self.steps.setdefault(pid, []).append((time.monotonic(), (body.get("metadata") or {}).get("weight_version")))
            step += 1
            await asyncio.sleep(self.tool_s)

    def stepped_since(self, pid: str, t: float) -> bool:
        return any(at > t for at, _ in self.steps.get(pid, []))

    async def until(self, cond, timeout: float, what: str) -> None:  # noqa: ANN001
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {self.steps}"
            await asyncio.sleep(0.1)


async def with_agents(a: Agents, pids: list[str], main):  # noqa: ANN001, ANN201
    """Run ``a``'s agents ``pids`` while ``main(http)`` runs; stop them after, failing on any
    agent that raised."""
    async with httpx.AsyncClient(timeout=300) as http:
        tasks = [asyncio.create_task(a.run(http, p)) for p in pids]
        try:
            return await main(http)
        finally:
            a.stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            for t in tasks:
                assert t.exception() is None, t.exception()


async def program(http: httpx.AsyncClient, url: str, pid: str) -> dict:
    return (await http.get(f"{url}/programs/{pid}")).json()


async def worker(http: httpx.AsyncClient, url: str, engine_url: str) -> dict:
    return next(w for w in (await http.get(url + "/workers")).json()["workers"] if w["url"] == engine_url)


def metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


async def placed(http: httpx.AsyncClient, url: str, pids: list[str], e0: str) -> tuple[list[str], list[str]]:
    where = {p: (await program(http, url, p))["backend"] for p in pids}
    on0, on1 = [p for p in pids if where[p] == e0], [p for p in pids if where[p] != e0]
    assert on0 and on1, f"the programs did not spread over both engines: {where}"
    return on0, on1


def test_weights_reloaded_on_one_engine_behind_thunder_reset_only_its_programs(engines, routers):
    thunder = routers("thunder", engines.urls)
    u, e0 = thunder.url, engines.urls[0]
    a = Agents(u)
    pids = [f"w{i}" for i in range(4)]

    async def main(http: httpx.AsyncClient) -> tuple[list[str], list[str]]:
        await a.until(lambda: all(len(a.steps.get(p, [])) >= 2 for p in pids), 120, "two steps of each program")
        on0, on1 = await placed(http, u, pids, e0)
        # the framework reloads engine 0's weights itself, requests in flight or not
        r = await http.post(e0 + "/update_weights_from_disk",
                            json={"model_path": str(engines.opts.model), "weight_version": "behind-1"})
        assert r.status_code == 200 and r.json()["success"], r.text
        updated = time.monotonic()
        for _ in range(300):
            w = await worker(http, u, e0)
            if w["backends"][0]["weight_version"] == "behind-1":
                break
            await asyncio.sleep(0.1)
        assert w["backends"][0]["weight_version"] == "behind-1", w
        await a.until(lambda: all(a.stepped_since(p, updated) for p in pids), 120, "a step of each program after")
        return on0, on1

    on0, on1 = asyncio.run(with_agents(a, pids, main))
    assert set(a.statuses) == {200}  # nothing lost
    resets = {p: httpx.get(f"{u}/programs/{p}", timeout=10).json()["kv_resets"] for p in on0 + on1}
    assert all(resets[p] == 1 for p in on0) and all(resets[p] == 0 for p in on1), resets
    assert metric(u, "thunder_weight_changes_seen_total") == 1
    assert any(v == "behind-1" for p in pids for _, v in a.steps[p])  # answers of the new weights came back
    others = [w for w in httpx.get(u + "/workers", timeout=10).json()["workers"] if w["url"] != e0]
    assert others[0]["backends"][0]["weight_version"] != "behind-1"  # the other engine was not touched


@pytest.mark.parametrize("how", ["flush", "reload"])
def test_a_cache_dropped_on_one_engine_behind_thunder_with_no_new_version_resets_only_its_programs(engines, routers, how):
    thunder = routers("thunder", engines.urls)
    u, e0 = thunder.url, engines.urls[0]
    a = Agents(u)
    pids = [f"{how}{i}" for i in range(6)]

    async def main(http: httpx.AsyncClient) -> tuple[list[str], list[str]]:
        await a.until(lambda: all(len(a.steps.get(p, [])) >= 3 for p in pids), 180, "three steps of each program")
        on0, on1 = await placed(http, u, pids, e0)
        assert len(on0) >= 2, f"one program on engine 0: nothing to see a drop with ({on0})"
        assert metric(u, "thunder_kv_drops_seen_total") == 0  # steps that found their KV: no drop
        version = (await worker(http, u, e0))["backends"][0]["weight_version"]
        if how == "flush":  # SGLang flushes an idle engine only: it waits up to the timeout
            r = await http.post(e0 + "/flush_cache", params={"timeout": 60})
            assert r.status_code == 200, r.text
        else:  # the same weights again, no version label: the version stays, the cache goes
            r = await http.post(e0 + "/update_weights_from_disk", json={"model_path": str(engines.opts.model)})
            assert r.status_code == 200 and r.json()["success"], r.text
        dropped = time.monotonic()
        await a.until(lambda: all(sum(at > dropped for at, _ in a.steps.get(p, [])) >= 2 for p in pids), 180,
                      "two steps of each program after")
        assert (await worker(http, u, e0))["backends"][0]["weight_version"] == version
        return on0, on1

    on0, on1 = asyncio.run(with_agents(a, pids, main))
    assert set(a.statuses) == {200}  # nothing lost
    assert metric(u, "thunder_kv_drops_seen_total") == 1
    assert metric(u, "thunder_weight_changes_seen_total") == 0
    resets = {p: httpx.get(f"{u}/programs/{p}", timeout=10).json()["kv_resets"] for p in on0 + on1}
    assert all(resets[p] == 1 for p in on0) and all(resets[p] == 0 for p in on1), resets


@pytest.mark.parametrize("mode", ["in_place", "abort"])
def test_an_engine_paused_behind_thunder_holds_its_programs_until_it_continues(engines, routers, tmp_path, mode):
    cfg = tmp_path / "thunder.yaml"
    cfg.write_text(f"gateway:\n  held_timeout_seconds: {TIMEOUT_S}\n  upstream_timeout_seconds: {TIMEOUT_S}\n")
    thunder = routers("thunder", engines.urls, extra=["--thunder-config", str(cfg)])
    u, e0 = thunder.url, engines.urls[0]
    # long enough outputs that requests are in flight on engine 0 when it pauses
    a = Agents(u, tokens=200, tool_s=0.1)
    pids = [f"{mode}-{i}" for i in range(4)]
    held_answers: list[httpx.Response] = []

    async def main(http: httpx.AsyncClient) -> tuple[list[str], list[str], list[str]]:
        await a.until(lambda: all(len(a.steps.get(p, [])) >= 1 for p in pids), 120, "a step of each program")
        on0, on1 = await placed(http, u, pids, e0)
        idle: list[str] = []  # programs on engine 0 between steps: thunder holds their next request
        for i in range(10):
            pid = f"{mode}-idle-{i}"
            assert (await http.post(u + "/v1/chat/completions", json=chat(pid, 0, 4))).status_code == 200
            if (await program(http, u, pid))["backend"] == e0:
                idle.append(pid)
            if len(idle) == 2:
                break
        assert idle

        r = await http.post(e0 + "/pause_generation", json={"mode": mode})  # behind thunder's back
        assert r.status_code == 200, r.text
        for _ in range(300):
            w = await worker(http, u, e0)
            if w["paused"]:
                break
            await asyncio.sleep(0.1)
        assert w["paused"] and w["pause"]["held"] and w["is_healthy"] and not w["routable"], w
        held = [asyncio.create_task(http.post(u + "/v1/chat/completions", json=chat(p, 1, 4))) for p in idle]
        new = await http.post(u + "/v1/chat/completions", json=chat(f"{mode}-new", 0, 4))
        assert new.status_code == 200 and (await program(http, u, f"{mode}-new"))["backend"] != e0
        settle = time.monotonic()
        await asyncio.sleep(PAUSE_S)  # longer than thunder's held and upstream timeouts
        assert not any(a.stepped_since(p, settle) for p in on0)
        assert all(a.stepped_since(p, settle) for p in on1)  # the other engine works on
        assert not any(t.done() for t in held)
        for p in on0 + idle:  # kept on engine 0, the request held by thunder or frozen there
            d = await program(http, u, p)
            assert (d["state"], d["backend"], d["held_requests"] + d["in_flight"]) == ("active", e0, 1), d
        for p in idle:
            assert (await program(http, u, p))["held_requests"] == 1
        w = await worker(http, u, e0)
        assert w["paused"] and w["is_healthy"] and w["pause"]["since_seconds"] >= PAUSE_S - 5, w

        assert (await http.post(e0 + "/continue_generation", json={})).status_code == 200
        resumed = time.monotonic()
        for t in held:
            r = await t
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
            held_answers.append(r)
        await a.until(lambda: all(a.stepped_since(p, resumed) for p in pids), 120, "a step of each program after")
        assert not (await worker(http, u, e0))["paused"]
        return on0, on1, idle

    on0, on1, idle = asyncio.run(with_agents(a, pids, main))
    assert set(a.statuses) == {200} and len(held_answers) == len(idle)
    if mode == "in_place":
        assert a.aborted == 0  # frozen, then finished where they stopped
    for p in on0 + idle:  # never failed over
        assert httpx.get(f"{u}/programs/{p}", timeout=10).json()["backend"] == e0
    assert metric(u, "thunder_held_expired_total") == 0
    assert metric(u, "thunder_engine_pauses_seen_total") == 1
    assert metric(u, "thunder_engine_paused_held_total") >= len(idle)
    assert metric(u, "thunder_workers_paused") == 0
    wait_until(lambda: httpx.get(e0 + "/ready", timeout=10).status_code == 200, 10, "engine 0 ready")
