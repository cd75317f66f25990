"""RL engine control through thunder on a real SGLang 0.5.23 CPU server: the three pause modes,
a weight reload from disk (the tiny GPT-2's own directory), abort by rid, and the example
rollout. What SGLang serves on the CPU is tested here; what it does not is refused by the
router before it reaches the engine:

- ``/release_memory_occupation`` crashes the CPU server (its scheduler calls
  ``torch.cuda.synchronize()``: "Found no NVIDIA driver"); ``/resume_memory_occupation`` of
  a tag never released crashes any server (``KeyError`` in the scheduler). The router sends a
  resume only for what it released, so here a resume is a 409 and the engine lives on.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import time
from pathlib import Path

import httpx
import pytest

from thunder_sgl.children import wait_until
from thunder_sgl.textgen import text

X = {"ignore_eos": True}  # random weights stop early otherwise
FIRST = 1000
"""Tokens of the request a pause interrupts: long enough that it is still running when the
pause reaches the engine on a busy machine (with 120 it had finished there: 'length', not 'abort';
with 80, the in-place pause found nothing to keep and the update flushed: 200, not 400)."""
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rl_rollout.py"


@pytest.fixture(scope="module")
def engine(start_cluster):
    return start_cluster(1, max_total_tokens=16384)


@pytest.fixture
def thunder(engine, routers):
    return routers("thunder", engine.urls)


def chat(pid: str, tokens: int, salt: str = "", rid: str | None = None) -> dict:
    body = {"model": "default", "max_tokens": tokens, "program_id": pid,
            "messages": [{"role": "user", "content": text(400, f"rl-{pid}{salt}")}], **X}
    return {**body, "rid": rid} if rid else body


async def running(engine) -> None:  # noqa: ANN001
    async with httpx.AsyncClient(timeout=10) as h:
        for _ in range(600):
            d = (await h.get(engine.urls[0] + "/v1/loads")).json()["loads"][0]
            if d["num_running_reqs"] >= 1:
                return
            await asyncio.sleep(0.05)
    raise AssertionError("the request never ran")


@pytest.mark.parametrize("mode", ["retract", "in_place", "abort"])
def test_pause_modes_through_the_router(engine, thunder, mode):
    """A request runs, the router pauses the engine (mode), a second program's request arrives
    and is held, generation continues: the held one is answered after, the first one finishes
    (retract, in_place) or comes back aborted with the usage of what it generated (abort)."""
    u = thunder.url

    async def main() -> None:
        async with httpx.AsyncClient(timeout=300) as h:
            first = asyncio.create_task(h.post(u + "/v1/chat/completions", json=chat(f"a-{mode}", FIRST)))
            await running(engine)
            r = await h.post(u + "/pause_generation", json={"mode": mode})
            assert r.status_code == 200 and r.json()["status"] == "ok", r.text
            held = asyncio.create_task(h.post(u + "/v1/chat/completions", json=chat(f"b-{mode}", 4)))
            await asyncio.sleep(1.0)
            assert not held.done() and (await h.get(u + "/weight_sync")).json()["reasons"] == ["paused"]
            if mode != "abort":
                assert not first.done()
            closed_at = time.monotonic()
            assert (await h.post(u + "/continue_generation")).status_code == 200
            a, b = (await first).json(), (await held).json()
            assert b["usage"]["completion_tokens"] == 4 and time.monotonic() >= closed_at
            if mode == "abort":
                assert a["choices"][0]["finish_reason"] == "abort" and a["usage"]["completion_tokens"] < FIRST
            else:
                assert a["choices"][0]["finish_reason"] == "length" and a["usage"]["completion_tokens"] == FIRST
            p = (await h.get(f"{u}/programs/a-{mode}")).json()
            assert (p["phase"], p["in_flight"], p["tokens"]["completion"]) == ("acting", 0, a["usage"]["completion_tokens"])

    asyncio.run(main())


def test_update_weights_from_disk_reloads_the_model_and_resets_the_kv_accounting(engine, thunder):
    u = thunder.url
    model_dir = str(engine.opts.model)
    body = chat("w", 4, "-same")
    first = httpx.post(u + "/v1/chat/completions", json=body, timeout=120).json()
    again = httpx.post(u + "/v1/chat/completions", json=body, timeout=120).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= first["usage"]["prompt_tokens"] - 2
    wait_until(lambda: httpx.get(engine.urls[0] + "/v1/loads", timeout=10).json()["loads"][0]["num_running_reqs"] == 0,
               30, "the engine idle")
    r = httpx.post(u + "/update_weights_from_disk", json={"model_path": model_dir, "weight_version": "step-1"}, timeout=300)
    assert r.status_code == 200 and r.json()["success"] is True and r.json()["workers_updated"] == 1, r.text
    assert httpx.get(engine.urls[0] + "/model_info", timeout=10).json()["weight_version"] == "step-1"
    p = httpx.get(u + "/programs/w", timeout=10).json()
    assert p["kv_resets"] == 1 and p["state"] == "active"  # requeued and restored (no backend preferred)
    after = httpx.post(u + "/v1/chat/completions", json=body, timeout=120).json()
    assert after["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # the cache went with the old weights
    assert after["metadata"]["weight_version"] == "step-1"
    # A path SGLang cannot load: its 400, in the OpenAI shape, SGLang's own fields kept.
    bad = httpx.post(u + "/update_weights_from_disk", json={"model_path": "/no/such/checkpoint"}, timeout=300)
    assert bad.status_code == 400 and bad.json()["success"] is False and bad.json()["error"]["message"]
    assert httpx.post(u + "/v1/chat/completions", json=chat("w2", 4), timeout=120).status_code == 200


def test_an_in_place_pause_keeps_the_cache_and_the_update_says_so(engine, thunder):
    u = thunder.url

    async def main() -> None:
        async with httpx.AsyncClient(timeout=300) as h:
            run = asyncio.create_task(h.post(u + "/v1/chat/completions", json=chat("ip", FIRST)))
            await running(engine)
            assert (await h.post(u + "/pause_generation", json={"mode": "in_place"})).status_code == 200
            r = await h.post(u + "/update_weights_from_disk", json={"model_path": str(engine.opts.model),
                                                                   "weight_version": "step-2"})
            assert r.status_code == 400 and "not flushed" in r.json()["message"] and r.json()["error"]["message"]
            assert (await h.get(u + "/programs/ip")).json()["kv_resets"] == 0  # the engine kept its KV
            assert (await h.post(u + "/continue_generation")).status_code == 200
            out = (await run).json()
            assert out["usage"]["completion_tokens"] == FIRST
            spans = out["metadata"]["weight_versions"]  # SGLang reports which tokens each version made
            assert spans[-1]["version"] == "step-2"

    asyncio.run(main())


def test_abort_by_rid_through_the_router_frees_the_engine(engine, thunder):
    u = thunder.url

    async def main() -> None:
        async with httpx.AsyncClient(timeout=300) as h:
            run = asyncio.create_task(h.post(u + "/v1/chat/completions", json=chat("ab", 3000, rid="rl-abort-1")))
            await running(engine)
            r = await h.post(u + "/abort_request", json={"rid": "rl-abort-1"})
            assert r.status_code == 200 and r.json()["where"] == "worker" and r.json()["worker"] == engine.urls[0]
            out = (await run).json()
            assert out["choices"][0]["finish_reason"] == "abort" and out["usage"]["completion_tokens"] < 3000
            missing = await h.post(u + "/abort_request", json={"rid": "rl-abort-1"})
            assert missing.status_code == 404 and missing.json()["error"]["code"] == "rid_not_found"

    asyncio.run(main())
    wait_until(lambda: httpx.get(engine.urls[0] + "/v1/loads", timeout=10).json()["loads"][0]["num_used_tokens"] == 0,
               30, "the engine to free the aborted request's KV")


def test_memory_resume_is_refused_before_it_can_crash_the_engine(engine, thunder):
    r = httpx.post(thunder.url + "/resume_memory_occupation", json={"tags": ["kv_cache"]}, timeout=30)
    assert r.status_code == 409 and r.json()["error"]["code"] == "nothing_released"
    assert httpx.get(engine.urls[0] + "/health", timeout=60).status_code == 200


def test_the_rl_example_runs_against_a_real_engine(engine, thunder, capsys):
    spec = importlib.util.spec_from_file_location("rl_rollout", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    rc = mod.main(["--router", thunder.url, "--model", "default", "--ignore-eos", "--programs", "3",
                   "--steps", "3", "--max-tokens", "8", "--updates", "2", "--model-path", str(engine.opts.model)])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["failed"] == [] and out["weight_updates"] == 2, out
    assert out["router_weight_version"] == "step-2" and out["programs_left"] == 0


def test_a_weight_version_changed_on_the_engine_behind_thunder_resets_its_kv_accounting(engine, thunder):
    """A framework relabels (or reloads) the engine directly: thunder reads the new version
    from the engine's /model_info (or its next answer) and resets the KV accounting of the
    engine's programs, as after an update through the router."""
    def version() -> str | None:
        return httpx.get(thunder.url + "/workers", timeout=10).json()["workers"][0]["backends"][0]["weight_version"]

    assert httpx.post(thunder.url + "/v1/chat/completions", json=chat("behind", 8), timeout=120).status_code == 200
    wait_until(lambda: version() is not None, 15, "thunder to read the engine's weight version")
    before = version()
    r = httpx.post(engine.urls[0] + "/update_weight_version", json={"new_version": f"{before}-behind"}, timeout=30)
    assert r.json()["success"], r.text
    wait_until(lambda: version() == f"{before}-behind", 15, "thunder to see the new version")
    p = httpx.get(thunder.url + "/programs/behind", timeout=10).json()
    assert p["kv_resets"] == 1
    assert httpx.post(thunder.url + "/v1/chat/completions", json=chat("behind", 8, "-2"), timeout=120).status_code == 200
    m = httpx.get(thunder.url + "/metrics", timeout=10).text
    assert "thunder_weight_changes_seen_total 1.0" in m
