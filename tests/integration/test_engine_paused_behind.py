"""An engine paused behind the router's back (``backends.pause``), on simulated workers (real
processes): a framework calls one worker's ``/pause_generation`` directly while agents send
through thunder. thunder reports the worker paused in ``GET /workers``, holds its programs'
requests (none fails, none times out, though the pause outlasts both timeouts), keeps the
programs on their worker, sends new programs elsewhere, and after the worker's
``/continue_generation`` everything completes."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

TS = 10.0
TIMEOUT_S = 30.0
"""The router's held and upstream timeouts (3 s real at ×10): the pause below lasts longer."""
PAUSE_S = 7.0
"""Real seconds the worker stays paused."""


def chat(pid: str, step: int, max_tokens: int) -> dict:
    msgs = [{"role": "system", "content": "You are an agent. " * 40},
            {"role": "user", "content": f"task of {pid}: " + "work " * 80}]
    for i in range(step):
        msgs += [{"role": "assistant", "content": f"step {i} of {pid} " * 6}, {"role": "user", "content": "obs " * 30}]
    return {"model": "tiny", "messages": msgs, "max_tokens": max_tokens, "program_id": pid}


def metric_values(text: str) -> dict[str, float]:
    return {k: float(v) for k, _, v in (line.rpartition(" ") for line in text.splitlines())
            if k.startswith("thunder_") and "{" not in k}


@pytest.fixture
def cluster(spawn, tmp_path):
    cfg = tmp_path / "thunder.yaml"
    cfg.write_text(f"gateway:\n  held_timeout_seconds: {TIMEOUT_S}\n  upstream_timeout_seconds: {TIMEOUT_S}\n")
    sim = spawn("sim", "tiny", workers=2, time_scale=TS)
    router = spawn("thunder", sim.urls, time_scale=TS, extra=["--thunder-config", str(cfg)])
    return sim, router


@pytest.mark.parametrize("mode", ["in_place", "abort"])
async def test_a_worker_paused_directly_holds_its_programs_and_loses_nothing(cluster, mode):
    sim, router = cluster
    u, w0 = router.url, sim.urls[0]
    statuses: list[int] = []
    steps: dict[str, list[float]] = {}
    aborted: list[str] = []
    stop = asyncio.Event()

    async def agent(http: httpx.AsyncClient, pid: str, max_tokens: int) -> None:
        step = 0
        while not stop.is_set():
            r = await http.post(u + "/v1/chat/completions", json=chat(pid, step, max_tokens))
            statuses.append(r.status_code)
            assert r.status_code == 200, r.text
            if r.json()["choices"][0]["finish_reason"] == "abort":
                aborted.append(pid)  # the abort pause answered it: sent again, as RL frameworks do
                continue
            steps.setdefault(pid, []).append(time.monotonic())
            step += 1
            await asyncio.sleep(0.05)  # the tool

    async def worker0(http: httpx.AsyncClient) -> dict:
        items = (await http.get(u + "/workers")).json()["workers"]
        return next(w for w in items if w["url"] == w0)

    async with httpx.AsyncClient(timeout=120) as http:
        pids = [f"{mode}-{i}" for i in range(6)]
        tasks = [asyncio.create_task(agent(http, pid, 600)) for pid in pids]
        try:
            for _ in range(600):  # every program has stepped: placed on both workers
                if all(len(steps.get(p, [])) >= 1 for p in pids):
                    break
                await asyncio.sleep(0.05)
            where = {p: (await http.get(f"{u}/programs/{p}")).json()["backend"] for p in pids}
            on_w0 = [p for p in pids if where[p] == w0]
            on_w1 = [p for p in pids if where[p] != w0]
            assert on_w0 and on_w1, where

            # idle programs on the paused worker: their next request is held by thunder
            idle: list[str] = []
            for i in range(12):
                pid = f"{mode}-idle-{i}"
                assert (await http.post(u + "/v1/chat/completions", json=chat(pid, 0, 4))).status_code == 200
                if (await http.get(f"{u}/programs/{pid}")).json()["backend"] == w0:
                    idle.append(pid)
                if len(idle) == 2:
                    break
            assert idle

            r = await http.post(w0 + "/pause_generation", json={"mode": mode})  # behind thunder's back
            assert r.status_code == 200, r.text
            paused_at = time.monotonic()
            for _ in range(200):
                if (await worker0(http))["paused"]:
                    break
                await asyncio.sleep(0.05)
            w = await worker0(http)
            assert w["paused"] and w["pause"]["held"] and w["is_healthy"] and not w["routable"], w
            assert w["backends"][0]["engine_paused"]
            # a program that starts now goes to the other worker
            assert (await http.post(u + "/v1/chat/completions", json=chat(f"{mode}-new", 0, 4))).status_code == 200
            assert (await http.get(f"{u}/programs/{mode}-new")).json()["backend"] != w0
            held = [asyncio.create_task(http.post(u + "/v1/chat/completions", json=chat(p, 1, 4))) for p in idle]
            # the pause outlasts the held and the upstream timeouts; worker 1's programs step on
            settle = time.monotonic()
            await asyncio.sleep(PAUSE_S)
            assert any(t > settle for p in on_w1 for t in steps[p])
            assert not any(t > settle for p in on_w0 for t in steps.get(p, []))  # nothing from the paused worker
            w = await worker0(http)
            assert w["paused"] and w["is_healthy"] and w["pause"]["since_seconds"] >= PAUSE_S - 1
            for p in on_w0:  # kept where they are, their request held or frozen in the engine
                d = (await http.get(f"{u}/programs/{p}")).json()
                assert (d["state"], d["backend"], d["held_requests"] + d["in_flight"]) == ("active", w0, 1), d
            for p in idle:  # held by thunder
                d = (await http.get(f"{u}/programs/{p}")).json()
                assert (d["state"], d["backend"], d["held_requests"], d["in_flight"]) == ("active", w0, 1, 0), d
            assert not any(t.done() for t in held)
            m = metric_values((await http.get(u + "/metrics")).text)
            assert m["thunder_workers_paused"] == 1 and m["thunder_engine_pauses_seen_total"] == 1
            assert m["thunder_engine_paused_held_total"] >= len(idle)

            assert (await http.post(w0 + "/continue_generation", json={})).status_code == 200
            resumed = time.monotonic()
            for _ in range(200):
                if not (await worker0(http))["paused"]:
                    break
                await asyncio.sleep(0.05)
            for t in held:  # the held requests went out and were answered
                r = await t
                assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length", r.text
            # every program steps again, those of the paused worker on it
            for _ in range(600):
                if all(any(t > resumed for t in steps.get(p, [])) for p in pids):
                    break
                await asyncio.sleep(0.05)
            assert all(any(t > resumed for t in steps.get(p, [])) for p in pids), steps
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
        for t in tasks:
            assert t.exception() is None, t.exception()
        assert statuses and set(statuses) == {200}
        for p in on_w0 + idle:
            assert (await http.get(f"{u}/programs/{p}")).json()["backend"] == w0  # never failed over
        m = metric_values((await http.get(u + "/metrics")).text)
        assert m["thunder_held_expired_total"] == 0 and m["thunder_workers_paused"] == 0
        errors = [line for line in (await http.get(u + "/metrics")).text.splitlines()
                  if line.startswith("thunder_upstream_errors_total")]
        assert all(line.endswith(" 0.0") for line in errors), errors
        assert time.monotonic() - paused_at > PAUSE_S
        if mode == "in_place":
            assert not aborted
