"""The simulator's engine control routes (RL weight updates), served in-process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
from simkit import unit_config

from thunder_sgl.sim import ScaledClock, SimWorker
from thunder_sgl.sim.server import RunningWorker, serve

PROMPT = "x" * 2000  # 500 tokens of the simulator's tokenizer


class Sim:
    def __init__(self, rw: RunningWorker, http: aiohttp.ClientSession) -> None:
        self.rw, self.http, self.worker = rw, http, rw.worker
        self.engine = rw.worker.engines[0]

    async def until(self, pred, what: str, timeout: float = 10.0) -> None:  # noqa: ANN001
        for _ in range(int(timeout / 0.005)):
            self.rw.server.sync()
            if pred():
                return
            await asyncio.sleep(0.005)
        raise AssertionError(f"timed out waiting for {what}")

    def generate(self, tokens: int, rid: str) -> asyncio.Task:
        body = {"rid": rid, "text": PROMPT + rid, "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}

        async def go() -> dict:
            async with self.http.post("/generate", json=body) as r:
                assert r.status == 200
                return await r.json()

        return asyncio.create_task(go())


@pytest.fixture
async def sim() -> AsyncIterator[Sim]:
    # 50 virtual seconds per real second: one decode step of the unit model (~2.2 ms) takes ~44 µs.
    cfg = unit_config(control__weight_update_seconds=5.0, server__max_total_num_tokens=500_000)
    rw = await serve(SimWorker(cfg), ScaledClock(50.0))
    http = aiohttp.ClientSession(base_url=rw.url)
    yield Sim(rw, http)
    await http.close()
    await rw.runner.cleanup()


async def post(sim: Sim, path: str, body: object = None) -> tuple[int, object]:
    async with sim.http.post(path, json=body) as r:
        return r.status, await r.json(content_type=None)


async def test_pause_abort_answers_every_request_with_abort_and_holds_new_ones(sim: Sim) -> None:
    running = sim.generate(200_000, "long")
    await sim.until(lambda: sim.engine.running, "the request to run")
    status, body = await post(sim, "/pause_generation", {"mode": "abort"})
    assert status == 200 and body == {"message": "Generation paused successfully.", "status": "ok"}
    out = await running
    assert out["meta_info"]["finish_reason"]["type"] == "abort" and 0 < out["meta_info"]["completion_tokens"] < 200_000
    late = sim.generate(5, "late")
    await asyncio.sleep(0.1)
    assert not late.done() and not sim.engine.reqs  # waits at the front door
    async with sim.http.get("/ready") as r:  # SGLang's only sign of a pause (backends.pause)
        assert r.status == 503
    assert (await post(sim, "/continue_generation"))[0] == 200
    assert (await late)["meta_info"]["completion_tokens"] == 5
    async with sim.http.get("/ready") as r:
        assert r.status == 200


async def test_pause_in_place_keeps_requests_and_kv_then_resumes_them(sim: Sim) -> None:
    task = sim.generate(20_000, "kept")
    await sim.until(lambda: (sim.engine.visible_tokens("kept") or 0) > 10, "decode")
    assert (await post(sim, "/pause_generation", {"mode": "in_place"}))[0] == 200
    sim.rw.server.sync()
    r = sim.engine.running[0]
    n, kv = r.n_out, r.kv_len
    await asyncio.sleep(0.2)  # 10 virtual seconds
    sim.rw.server.sync()
    assert sim.engine.running == [r] and (r.n_out, r.kv_len) == (n, kv)  # frozen, KV held
    # In place, the cache cannot be flushed: a weight update says so (and still happens).
    status, body = await post(sim, "/update_weights_from_disk", {"model_path": sim.worker.cfg.model.model_path,
                                                                  "weight_version": "v2"})
    assert status == 400 and body["success"] is False and "not flushed" in body["message"]
    assert sim.worker.weight_version == "v2"
    assert (await post(sim, "/continue_generation"))[0] == 200
    out = await task
    assert out["meta_info"]["finish_reason"]["type"] == "length" and out["meta_info"]["completion_tokens"] == 20_000
    assert r.retractions == 0


async def test_pause_retract_releases_kv_and_recomputes_after_continue(sim: Sim) -> None:
    task = sim.generate(20_000, "back")
    await sim.until(lambda: (sim.engine.visible_tokens("back") or 0) > 10, "decode")
    assert (await post(sim, "/pause_generation", {"mode": "retract"}))[0] == 200
    r = sim.engine.waiting[0]
    assert not sim.engine.running and r.kv_len == 0 and sim.engine._private == 0
    # Retracted, the engine is idle enough for new weights and a flush.
    status, body = await post(sim, "/update_weights_from_disk", {"model_path": sim.worker.cfg.model.model_path})
    assert status == 200 and body["success"] is True
    assert sim.engine.cache.device_tokens == 0
    assert (await post(sim, "/continue_generation"))[0] == 200
    out = await task
    assert out["meta_info"]["completion_tokens"] == 20_000 and out["meta_info"]["finish_reason"]["type"] == "length"


async def test_update_without_pause_waits_for_requests_in_flight_and_takes_its_duration(sim: Sim) -> None:
    busy = sim.generate(10_000, "busy")
    await sim.until(lambda: sim.engine.running, "the request to run")
    t0 = sim.rw.server.clock.now()
    status, body = await post(sim, "/update_weights_from_disk",
                              {"model_path": sim.worker.cfg.model.model_path, "weight_version": "step-1"})
    elapsed = sim.rw.server.clock.now() - t0
    assert busy.done() and (await busy)["meta_info"]["finish_reason"]["type"] == "length"
    assert status == 200 and body == {"success": True, "num_paused_requests": 0,
                                      "message": "Succeeded to update model weights. Weight version updated to step-1."}
    assert elapsed >= 5.0  # control.weight_update_seconds of virtual time
    info = await (await sim.http.get("/model_info")).json()
    assert info["weight_version"] == "step-1"
    # The cache was flushed: the same prompt again is a full prefill, under the new version.
    again = await sim.generate(4, "busy")
    assert again["meta_info"]["cached_tokens"] == 0 and again["meta_info"]["weight_version"] == "step-1"


@pytest.mark.parametrize(("path", "body", "message"), [
    ("/pause_generation", {"mode": "bogus"}, "Input should be"),
    ("/update_weights_from_disk", {}, "model_path"),
    ("/update_weights_from_disk", {"model_path": "/no/such/checkpoint"}, "no checkpoint"),
    ("/release_memory_occupation", {"tags": ["gpu"]}, "unknown memory tags"),
    ("/resume_memory_occupation", {"tags": ["kv_cache"]}, "not released"),
])
async def test_bad_control_calls_are_400_and_change_nothing(sim: Sim, path: str, body: dict, message: str) -> None:
    status, out = await post(sim, path, body)
    assert status == 400 and message in str(out)
    w = sim.worker
    assert (w.paused, w.updating, w.released, w.weight_version, w.weight_updates) == (None, False, set(), "default", 0)
    assert (await sim.generate(3, "after"))["meta_info"]["completion_tokens"] == 3


async def test_release_memory_holds_requests_and_drops_the_cache_until_resumed(sim: Sim) -> None:
    await sim.generate(4, "warm")
    assert sim.engine.cache.device_tokens > 0
    status, body = await post(sim, "/release_memory_occupation", {"tags": ["kv_cache", "weights"]})
    assert (status, body) == (200, None) and sim.engine.cache.device_tokens == 0
    held = sim.generate(4, "held")
    await asyncio.sleep(0.1)
    assert not held.done()
    assert (await post(sim, "/resume_memory_occupation", {"tags": ["weights"]}))[0] == 200
    await asyncio.sleep(0.05)
    assert not held.done()  # kv_cache still released
    assert (await post(sim, "/resume_memory_occupation", {"tags": ["kv_cache"]}))[0] == 200
    assert (await held)["meta_info"]["completion_tokens"] == 4


async def test_release_of_a_busy_engine_is_refused(sim: Sim) -> None:
    task = sim.generate(200_000, "busy")
    await sim.until(lambda: sim.engine.running, "the request to run")
    status, out = await post(sim, "/release_memory_occupation")
    assert status == 400 and "idle" in str(out) and not sim.worker.released
    await post(sim, "/abort_request", {"rid": "busy"})
    assert (await task)["meta_info"]["finish_reason"]["type"] == "abort"


def test_a_retract_pause_during_a_prefill_sends_that_request_back_too() -> None:
    """Regression: a request being prefilled when a retract pause came is neither running nor
    queued; it was dropped (never answered) and its prefix stayed locked, so the weight update
    that follows could not flush the cache."""
    from simkit import drain, tokens

    from thunder_sgl.sim import SimRequest, control

    w = SimWorker(unit_config())
    e = w.engines[0]
    w.submit(SimRequest("a", tokens(4000), 10), 0.0)
    assert w.advance(0.0) == []
    assert e.next_event_time() is not None and e.next_event_time() > 0.001  # one prefill iteration
    control.pause(w, "retract", 0.001)  # in the middle of it
    assert [r.rid for r in e.waiting] == ["a"] and e.cache.protected == 0
    ok, _ = control.update_weights(w, "v2", flush=True)
    assert ok and w.weight_version == "v2"
    control.resume_generation(w, 0.002)
    (done,) = drain(e)
    assert done.rid == "a" and done.error is None and done.completion_tokens == 10
