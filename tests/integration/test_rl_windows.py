"""RL rollouts through thunder on simulated workers (real processes): weight updates during a
run lose nothing, held requests are answered after the window, control calls fan out, aborts
reach the right worker, bad control input is a clear 4xx and nothing accepted is lost."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

TS = 10.0
MODEL_PATH = "sim/tiny-qwen3-8b"  # the tiny config's model: what /update_weights_from_disk reloads


@pytest.fixture
def rl_cluster(spawn):
    sim = spawn("sim", "tiny", workers=2, time_scale=TS)
    router = spawn("thunder", sim.urls, time_scale=TS)
    return sim, router


def chat(pid: str, step: int, max_tokens: int = 16, **extra) -> dict:
    msgs = [{"role": "system", "content": "You are a rollout agent. " * 40},
            {"role": "user", "content": f"task of {pid}: " + "solve it " * 60}]
    for i in range(step):
        msgs += [{"role": "assistant", "content": f"step {i} of {pid} " * 8}, {"role": "user", "content": "observation " * 30}]
    return {"model": "tiny", "messages": msgs, "max_tokens": max_tokens, "program_id": pid, **extra}


def metric_values(text: str) -> dict[str, float]:
    return {k: float(v) for k, _, v in (line.rpartition(" ") for line in text.splitlines())
            if k.startswith("thunder_") and "{" not in k}


def assert_openai_error(r: httpx.Response, status: int, code: str | None = None) -> None:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "code", "param"} and err["message"]
    if code is not None:
        assert err["code"] == code, err


async def test_weight_updates_during_a_run_lose_no_request(rl_cluster):
    """12 programs step on while the trainer runs three windows the way three RL frameworks
    do (SkyRL: begin, pause retract, update, continue, end; slime: pause abort, update,
    continue; in-place pause with an update that keeps the cache). Every request is answered
    200; one aborted by the abort pause is sent again, as RL frameworks do; a request sent
    while a window was open is answered only after it closed."""
    _, router = rl_cluster
    u = router.url
    windows: list[tuple[float, float]] = []
    sent: list[tuple[float, float, int, dict]] = []
    statuses: list[int] = []

    trained = asyncio.Event()

    async def agent(http: httpx.AsyncClient, pid: str) -> None:
        step = answered = after = 0
        while after < 2:  # until two steps after the last window
            t0 = time.monotonic()
            r = await http.post(u + "/v1/chat/completions", json=chat(pid, step))
            statuses.append(r.status_code)
            assert r.status_code == 200, r.text
            body = r.json()
            answered += 1
            sent.append((t0, time.monotonic(), step, body))
            if body["choices"][0]["finish_reason"] != "abort":
                step += 1
                after += trained.is_set()
            await asyncio.sleep(0.1)  # the tool
        p = (await http.get(f"{u}/programs/{pid}")).json()
        # Every answer, aborted ones too, was accounted to the program (usage of what was generated).
        assert (p["steps"], p["in_flight"], p["held_requests"], p["phase"]) == (answered, 0, 0, "acting")
        assert (await http.post(f"{u}/programs/{pid}/release")).status_code == 200

    async def trainer(http: httpx.AsyncClient) -> None:
        async def call(path: str, body: dict | None = None) -> dict:
            r = await http.post(u + path, json=body or {})
            assert r.status_code == 200, f"{path}: {r.text}"
            return r.json()

        cycles = [
            [("/weight_sync/begin", None), ("/pause_generation", {"mode": "retract"}),
             ("/update_weights_from_disk", {"model_path": MODEL_PATH, "weight_version": "v1"}),
             ("/continue_generation", None), ("/weight_sync/end", None)],
            [("/pause_generation", {"mode": "abort"}),
             ("/update_weights_from_disk", {"model_path": MODEL_PATH, "weight_version": "v2"}),
             ("/continue_generation", None)],
            [("/pause_generation", {"mode": "in_place"}),
             ("/update_weights_from_disk", {"model_path": MODEL_PATH, "weight_version": "v3", "flush_cache": False}),
             ("/continue_generation", None)],
        ]
        for cycle in cycles:
            await asyncio.sleep(0.4)
            opened = None
            for path, body in cycle[:-1]:
                await call(path, body)
                opened = opened or time.monotonic()
            await asyncio.sleep(0.3)  # requests arrive meanwhile and are held
            closing = time.monotonic()
            await call(*cycle[-1])
            windows.append((opened, closing))
            assert (await http.get(u + "/weight_sync")).json()["open"] is False
        trained.set()

    async with httpx.AsyncClient(timeout=120) as http:
        await asyncio.gather(trainer(http), *(agent(http, f"rl-{i}") for i in range(12)))
        metrics = (await http.get(u + "/metrics")).text
        programs = (await http.get(u + "/programs")).json()

    assert statuses and set(statuses) == {200}
    held_in_window = 0
    for t_sent, t_done, _, _ in sent:
        for opened, closing in windows:
            if opened < t_sent < closing:
                held_in_window += 1
                assert t_done >= closing, "a request sent during a window was answered before it closed"
    assert held_in_window > 0  # the run did send requests into the windows
    last = [b for t, _, _, b in sent if t > windows[-1][1]]
    assert last and all(b["metadata"]["weight_version"] == "v3" for b in last)
    m = metric_values(metrics)
    assert (m["thunder_held_expired_total"], m["thunder_windows_opened_total"], m["thunder_window_open"]) == (0, 3, 0)
    assert m["thunder_kv_resets_total"] >= 12 and programs["count"] == 0  # two windows flushed every program's KV


async def test_bad_control_input_is_a_clear_4xx_and_the_held_request_survives(rl_cluster):
    _, router = rl_cluster
    u = router.url
    async with httpx.AsyncClient(timeout=60) as http:
        assert (await http.post(u + "/weight_sync/begin")).status_code == 200
        held = asyncio.create_task(http.post(u + "/v1/chat/completions", json=chat("keep", 0)))
        for _ in range(100):
            p = await http.get(u + "/programs/keep")
            if p.status_code == 200 and p.json()["held_requests"] == 1:
                break
            await asyncio.sleep(0.05)
        bad = [
            ("/weight_sync/begin", {}, 409, "window_already_open"),
            ("/abort_request", {"rid": "no-such-rid"}, 404, "rid_not_found"),
            ("/abort_request", {}, 400, "missing_rid"),
            ("/abort_request", {"rid": 7}, 400, None),
            ("/pause_generation", {"mode": "sideways"}, 400, "invalid_pause_mode"),
            ("/update_weights_from_disk", {"weight_version": "v9"}, 400, None),
            ("/update_weights_from_disk", {"model_path": MODEL_PATH, "flush_cache": "yes"}, 400, None),
            ("/release_memory_occupation", {"tags": ["gpu"]}, 400, "invalid_memory_tag"),
            ("/resume_memory_occupation", {}, 409, "nothing_released"),
        ]
        for path, body, status, code in bad:
            assert_openai_error(await http.post(u + path, json=body), status, code)
        for path in ("/pause_generation", "/weight_sync/end", "/abort_request"):
            assert_openai_error(await http.post(u + path, content=b"{not json"), 400, "invalid_json")
        # A weight update the workers refuse: their 4xx, in the OpenAI shape, SGLang's fields kept.
        r = await http.post(u + "/update_weights_from_disk", json={"model_path": "/no/such/checkpoint"})
        assert_openai_error(r, 400)
        assert r.json()["success"] is False and r.json()["workers_updated"] == 0
        assert not held.done()
        assert (await http.get(u + "/programs/keep")).json()["held_requests"] == 1
        assert (await http.post(u + "/weight_sync/end")).status_code == 200
        assert_openai_error(await http.post(u + "/weight_sync/end"), 409, "no_window_open")
        r = await held
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 16


async def test_abort_by_rid_reaches_the_worker_that_holds_it_and_held_ones_are_withdrawn(rl_cluster):
    _, router = rl_cluster
    u = router.url
    async with httpx.AsyncClient(timeout=120) as http:
        for pid in ("left", "right"):  # one program per worker (least-loaded admission)
            assert (await http.post(u + "/v1/chat/completions", json=chat(pid, 0, 4))).status_code == 200
        where = {pid: (await http.get(f"{u}/programs/{pid}")).json()["backend"] for pid in ("left", "right")}
        assert where["left"] != where["right"]
        long_left = asyncio.create_task(http.post(u + "/v1/chat/completions", json=chat("left", 1, 20_000, rid="long-left")))
        long_right = asyncio.create_task(http.post(u + "/v1/chat/completions", json=chat("right", 1, 300, rid="long-right")))
        await asyncio.sleep(1.0)
        r = await http.post(u + "/abort_request", json={"rid": "long-left"})
        assert r.status_code == 200 and r.json()["where"] == "worker" and r.json()["worker"] == where["left"]
        left = (await long_left).json()
        assert left["choices"][0]["finish_reason"] == "abort" and 0 < left["usage"]["completion_tokens"] < 20_000
        right = (await long_right).json()
        assert right["choices"][0]["finish_reason"] == "length" and right["usage"]["completion_tokens"] == 300
        p = (await http.get(u + "/programs/left")).json()
        assert p["phase"] == "acting" and p["in_flight"] == 0 and p["tokens"]["completion"] == 4 + left["usage"]["completion_tokens"]

        # Held by a window: withdrawn by rid, answered as SGLang answers an aborted request.
        assert (await http.post(u + "/weight_sync/begin")).status_code == 200
        held = asyncio.create_task(http.post(u + "/v1/chat/completions", json=chat("left", 2, 16, rid="held-left", stream=True)))
        others = [asyncio.create_task(http.post(u + "/generate", json={"text": "x" * 400, "rid": f"g{i}",
                                                                       "sampling_params": {"max_new_tokens": 4}}))
                  for i in range(2)]
        await asyncio.sleep(0.5)
        r = await http.post(u + "/abort_request", json={"rid": "held-left"})
        assert r.status_code == 200 and r.json()["where"] == "held"
        events = [line for line in (await held).text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and '"finish_reason":"abort"' in events[0]
        assert (await http.get(u + "/programs/left")).json()["held_requests"] == 0
        r = await http.post(u + "/abort_request", json={"abort_all": True})
        assert r.status_code == 200 and r.json()["aborted_held"] == 2 and len(r.json()["workers"]) == 2
        for t in others:
            g = (await t).json()
            assert g["meta_info"]["finish_reason"]["type"] == "abort" and g["meta_info"]["completion_tokens"] == 0
        assert (await http.post(u + "/weight_sync/end")).status_code == 200
        assert (await http.post(u + "/v1/chat/completions", json=chat("left", 2, 4))).status_code == 200


async def test_memory_release_holds_requests_until_resumed_and_refuses_what_would_crash_sglang(rl_cluster):
    _, router = rl_cluster
    u = router.url
    async with httpx.AsyncClient(timeout=120) as http:
        busy = asyncio.create_task(http.post(u + "/v1/chat/completions", json=chat("busy", 0, 2000)))
        await asyncio.sleep(0.5)
        assert_openai_error(await http.post(u + "/release_memory_occupation", json={}), 409, "workers_busy")
        assert (await busy).status_code == 200
        r = await http.post(u + "/release_memory_occupation", json={"tags": ["kv_cache", "weights"]})
        assert r.status_code == 200 and all(set(t) == {"kv_cache", "weights"} for t in r.json()["released"].values())
        held = asyncio.create_task(http.post(u + "/v1/chat/completions", json=chat("busy", 1, 8)))
        await asyncio.sleep(0.5)
        assert not held.done()
        r = await http.post(u + "/resume_memory_occupation", json={"tags": ["weights"]})
        assert r.status_code == 200 and r.json()["window"]["open"] is True
        await asyncio.sleep(0.3)
        assert not held.done()
        r = await http.post(u + "/resume_memory_occupation", json={})
        assert r.status_code == 200 and r.json()["released"] == {} and r.json()["window"]["open"] is False
        assert (await held).status_code == 200
        p = (await http.get(u + "/programs/busy")).json()
        assert p["kv_resets"] >= 1 and p["steps"] == 2
        assert_openai_error(await http.post(u + "/resume_memory_occupation", json={}), 409, "nothing_released")


async def test_control_routes_need_the_admin_key(spawn):
    sim = spawn("sim", "tiny", workers=1, time_scale=TS)
    router = spawn("thunder", sim.urls, time_scale=TS, extra=["--thunder-admin-api-key", "sekret"])
    async with httpx.AsyncClient(timeout=30) as http:
        for path in ("/weight_sync/begin", "/pause_generation", "/abort_request", "/update_weights_from_disk",
                     "/release_memory_occupation", "/flush_cache"):
            assert_openai_error(await http.post(router.url + path, json={}), 401)
        assert (await http.get(router.url + "/weight_sync")).json()["open"] is False
        ok = await http.post(router.url + "/weight_sync/begin", headers={"Authorization": "Bearer sekret"})
        assert ok.status_code == 200


def test_weights_updated_behind_the_routers_back_reset_the_kv_accounting(spawn):
    """A framework that updates an engine directly (not through thunder): the next answer
    from that engine names the new version, and without any answer the monitor reads it from
    /model_info; either way the engine's programs' KV accounting is reset, once per change."""
    sim = spawn("sim", "tiny", workers=1, time_scale=TS)
    router = spawn("thunder", sim.urls, time_scale=TS)
    u, w = router.url, sim.urls[0]

    def resets(pid: str) -> int:
        return httpx.get(f"{u}/programs/{pid}").json()["kv_resets"]

    def seen() -> float:
        return metric_values(httpx.get(u + "/metrics").text)["thunder_weight_changes_seen_total"]

    for pid in ("a", "b"):
        assert httpx.post(u + "/v1/chat/completions", json=chat(pid, 0), timeout=60).status_code == 200
    from thunder_sgl.children import wait_until

    def version() -> str | None:
        return httpx.get(u + "/workers").json()["workers"][0]["backends"][0]["weight_version"]

    wait_until(lambda: version() == "default", 10, "thunder to read the engine's version")
    # behind the router: new weights, the cache flushed; the next answer says so
    r = httpx.post(w + "/update_weights_from_disk", json={"model_path": MODEL_PATH, "weight_version": "v2"}, timeout=60)
    assert r.json()["success"], r.text
    assert httpx.post(u + "/v1/chat/completions", json=chat("a", 1), timeout=60).status_code == 200
    wait_until(lambda: resets("b") == 1, 10, "the idle program's accounting to be reset")
    assert version() == "v2" and seen() == 1
    # b runs again on that engine (reset and waiting, nothing of it is cached anywhere, so a
    # second change would have nothing of b's to reset: whether a tick re-admitted it in
    # between was a race, lost on a busy CI machine)
    assert httpx.post(u + "/v1/chat/completions", json=chat("b", 1), timeout=60).status_code == 200
    # only the label, and no request at all: the monitor's /model_info read finds it
    assert httpx.post(w + "/update_weight_version", json={"new_version": "v3"}, timeout=30).json()["success"]
    wait_until(lambda: version() == "v3", 10, "the monitor to read the new version")
    assert resets("b") == 2 and seen() == 2
    assert httpx.post(u + "/v1/chat/completions", json=chat("b", 2), timeout=60).status_code == 200
    # an update through the router is not taken for one behind its back
    r = httpx.post(u + "/update_weights_from_disk", json={"model_path": MODEL_PATH, "weight_version": "v4"}, timeout=60)
    assert r.status_code == 200, r.text
    assert httpx.post(u + "/v1/chat/completions", json=chat("a", 2), timeout=60).status_code == 200
    time.sleep(1.0)
    assert version() == "v4" and seen() == 2 and resets("b") == 3  # the router's own reset, once


async def test_a_flush_sent_while_a_request_runs_waits_for_it_and_timeout_is_sglangs(rl_cluster):
    """SGLang refuses ``/flush_cache`` (400) while a request runs or waits. Through thunder a
    flush waits for the workers to go idle (up to ``FLUSH_BUSY_WAIT_S``), so one sent as the
    traffic stops succeeds; with SGLang's own ``?timeout=`` the engine decides, and
    ``timeout=0`` refuses at once, as SGLang does."""
    sim, router = rl_cluster
    u = router.url
    async with httpx.AsyncClient(timeout=60) as http:
        async def running() -> bool:
            p = await http.get(u + "/programs/busy")
            return p.status_code == 200 and p.json()["in_flight"] == 1

        async def start() -> asyncio.Task:
            task = asyncio.create_task(http.post(u + "/v1/chat/completions", json=chat("busy", 0, max_tokens=600)))
            for _ in range(400):
                if await running():
                    return task
                await asyncio.sleep(0.01)
            raise AssertionError("the request never ran")

        task = await start()
        r = await http.post(u + "/flush_cache?timeout=0")
        assert r.status_code == 502 and r.json()["status"] == "partial", r.text
        assert {f["status"] for f in r.json()["failed"]} == {400}
        assert not task.done()
        r = await http.post(u + "/flush_cache")
        assert r.status_code == 200 and r.json()["workers_flushed"] == 2, r.text
        assert task.done() and (await task).status_code == 200  # answered, not aborted
        assert (await task).json()["usage"]["completion_tokens"] == 600
        for bad in ("-1", "soon", "nan", ""):
            assert_openai_error(await http.post(u + f"/flush_cache?timeout={bad}"), 400)
