"""The HTTP surface of a simulated worker, served in-process on a free port."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator

import aiohttp
import pytest
from simkit import prefill, tokens, unit_config

from thunder_sgl.sim import ManualClock, ScaledClock, SimConfig, SimWorker
from thunder_sgl.sim.server import RunningWorker, serve

approx = pytest.approx


class Sim:
    def __init__(self, rw: RunningWorker, http: aiohttp.ClientSession) -> None:
        self.rw, self.http, self.worker = rw, http, rw.worker


async def start(cfg: SimConfig, clock: object) -> tuple[RunningWorker, aiohttp.ClientSession]:
    rw = await serve(SimWorker(cfg), clock)  # type: ignore[arg-type]
    return rw, aiohttp.ClientSession(base_url=rw.url)


@pytest.fixture
async def sim() -> AsyncIterator[Sim]:
    rw, http = await start(unit_config(hicache__enabled=True), ScaledClock(1000.0))
    yield Sim(rw, http)
    await http.close()
    await rw.runner.cleanup()


def metric(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


async def sse_events(resp: aiohttp.ClientResponse) -> list[object]:
    body = (await resp.read()).decode()
    out: list[object] = []
    for block in body.split("\n\n"):
        if block.startswith("data: "):
            data = block[6:]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def test_loads_and_metrics_agree_with_engine_state() -> None:
    clock = ManualClock(0.0)
    cfg = unit_config(server__max_running_requests=1)
    rw, http = await start(cfg, clock)
    try:
        eng = rw.worker.engines[0]
        ta = asyncio.create_task(http.post("/generate", json={"input_ids": list(tokens(1000)), "sampling_params": {"max_new_tokens": 100}}))
        while not eng.reqs:
            await asyncio.sleep(0.001)
        tb = asyncio.create_task(http.post("/generate", json={"input_ids": list(tokens(500, 1 << 25)), "sampling_params": {"max_new_tokens": 100}}))
        while len(eng.reqs) < 2:
            await asyncio.sleep(0.001)
        # A's prefill iteration ends at t1 = t0 + prefill(1000); B waits (max_running_requests 1)
        clock.set(0.001 + prefill(1000) + 1e-12)  # (just after: the engine rounds differently)
        loads = await (await http.get("/v1/loads", params={"include": "all"})).json()
        text = await (await http.get("/metrics")).text()
        st = eng.stats()
        (ld,) = loads["loads"]
        expected = {
            "num_running_reqs": 1, "num_waiting_reqs": 1, "num_waiting_uncached_tokens": 500,
            "num_used_tokens": 1000, "num_total_tokens": 1000, "num_active_tokens": 1000,
            "max_total_num_tokens": 10_000, "token_usage": 0.1,
        }
        assert {k: ld[k] for k in expected} == expected
        assert ld["queues"]["waiting"] == 1 and ld["memory"]["token_capacity"] == 10_000
        assert (st.num_running_reqs, st.num_waiting_reqs, st.num_used_tokens) == (1, 1, 1000)
        for name, value in [
            ("sglang:num_running_reqs", 1), ("sglang:num_queue_reqs", 1), ("sglang:num_used_tokens", 1000),
            ("sglang:token_usage", 0.1), ("sglang:kv_available_tokens", 9000), ("sglang:kv_evictable_tokens", 0),
            ("sglang:generation_tokens_total", 1), ("sglang:prompt_tokens_total", 0),
            ("sglang:max_total_num_tokens", 10_000),
        ]:
            assert metric(text, name, dp_rank="0") == approx(value), name

        clock.set(100.0)  # both finish
        text = await (await http.get("/metrics")).text()
        ra, rb = await ta, await tb
        a, b = await ra.json(), await rb.json()
        assert a["meta_info"]["completion_tokens"] == b["meta_info"]["completion_tokens"] == 100
        ra.release()
        rb.release()
        loads = await (await http.get("/v1/loads")).json()
        (ld,) = loads["loads"]
        # cached: A 1000 + 99 and B 500 + 99 (prompt + output but its last token), nobody holds them
        assert (ld["num_used_tokens"], ld["num_total_tokens"], ld["num_running_reqs"]) == (0, 1698, 0)
        assert metric(text, "sglang:prompt_tokens_total") == 1500
        assert metric(text, "sglang:generation_tokens_total") == 200
        assert metric(text, "sglang:cached_tokens_total", cache_source="device") == 0
        assert metric(text, "sglang:kv_evictable_tokens") == 1698
        assert metric(text, "sglang:num_requests_total") == 2
        assert metric(text, "sglang:e2e_request_latency_seconds_count") == 2
    finally:
        await http.close()
        await rw.runner.cleanup()


CHAT = {"messages": [{"role": "system", "content": "You are a test."}, {"role": "user", "content": "List the files."}]}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions", "/generate"])
async def test_inference_routes_answer_and_report_cached_tokens(sim: Sim, route: str, stream: bool) -> None:
    w = sim.worker
    if route == "/v1/chat/completions":
        body = {**CHAT, "max_tokens": 8}
        n_prompt = len(w.template.render(CHAT["messages"]))
    elif route == "/v1/completions":
        body = {"prompt": "The quick brown fox jumps over the lazy dog.", "max_tokens": 8}
        n_prompt = len(w.tokenizer.encode(body["prompt"]))
    else:
        body = {"text": "The quick brown fox jumps over the lazy dog.", "sampling_params": {"max_new_tokens": 8}}
        n_prompt = len(w.tokenizer.encode(body["text"]))
    if stream:
        body["stream"] = True
        if route != "/generate":
            body["stream_options"] = {"include_usage": True}
    for attempt in range(2):
        async with sim.http.post(route, json=body) as resp:
            assert resp.status == 200
            if not stream:
                data = await resp.json()
                usage = data["usage"] if route != "/generate" else data["meta_info"]
                text = data["choices"][0].get("message", {}).get("content") if route == "/v1/chat/completions" else (
                    data["choices"][0]["text"] if route == "/v1/completions" else data["text"])
            else:
                events = await sse_events(resp)
                assert events[-1] == "[DONE]"
                if route == "/generate":
                    usage = events[-2]["meta_info"]
                    text = events[-2]["text"]
                    assert usage["finish_reason"] == {"type": "length", "length": 8}
                else:
                    usage = events[-2]["usage"]
                    assert events[-2]["choices"] == []
                    assert events[-3]["choices"][0]["finish_reason"] == "length"
                    chunks = events[:-3]
                    assert len(chunks) == 8  # one chunk per token
                    key = "delta" if route == "/v1/chat/completions" else None
                    text = "".join(c["choices"][0][key]["content"] if key else c["choices"][0]["text"] for c in chunks)
        assert len(w.tokenizer.encode(text)) == 8
        assert usage["prompt_tokens"] == n_prompt and usage["completion_tokens"] == 8
        cached = usage["cached_tokens"] if route == "/generate" else usage["prompt_tokens_details"]["cached_tokens"]
        assert cached == (0 if attempt == 0 else n_prompt - 1)
        if route == "/generate":
            assert usage["cached_tokens_details"] == {"device": cached, "host": 0}


async def test_stream_without_include_usage_has_no_usage_chunk(sim: Sim) -> None:
    async with sim.http.post("/v1/chat/completions", json={**CHAT, "max_tokens": 3, "stream": True}) as resp:
        events = await sse_events(resp)
    assert events[-1] == "[DONE]"
    assert all("usage" not in e for e in events[:-1])
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"


async def test_multi_turn_chat_hits_the_cache_token_for_token(sim: Sim) -> None:
    msgs = list(CHAT["messages"])
    prev = None
    for _ in range(3):
        data = await (await sim.http.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 20})).json()
        u = data["usage"]
        if prev is not None:  # previous prompt + previous answer but its last token
            assert u["prompt_tokens_details"]["cached_tokens"] == prev["prompt_tokens"] + prev["completion_tokens"] - 1
        prev = u
        msgs += [{"role": "assistant", "content": data["choices"][0]["message"]["content"]},
                 {"role": "user", "content": "Observation: ok."}]


async def test_info_routes_report_sglang_fields(sim: Sim) -> None:
    info = await (await sim.http.get("/server_info")).json()
    for k, v in {"max_total_num_tokens": 10_000, "dp_size": 1, "page_size": 1, "chunked_prefill_size": 8192,
                 "enable_hierarchical_cache": True, "hicache_ratio": 2.0, "hicache_write_policy": "write_through",
                 "hicache_storage_capacity_tokens": 0, "version": "0.5.23"}.items():
        assert info[k] == v, k
    assert (await (await sim.http.get("/get_server_info")).json())["max_total_num_tokens"] == 10_000
    model = await (await sim.http.get("/model_info")).json()
    assert model["model_path"] == "sim/tiny-model" and model["is_generation"]
    assert (await (await sim.http.get("/get_model_info")).json()) == model
    models = await (await sim.http.get("/v1/models")).json()
    assert models["data"][0]["owned_by"] == "sglang"
    text = await (await sim.http.get("/metrics")).text()
    assert metric(text, "sglang:hicache_host_total_tokens") == 20_000
    assert (await sim.http.get("/health")).status == 200
    assert (await sim.http.get("/health_generate")).status == 200
    assert (await sim.http.get("/get_load")).status == 404  # not a 0.5.23 route


async def test_flush_cache_refused_while_running_then_flushes(sim: Sim) -> None:
    task = asyncio.create_task(sim.http.post("/generate", json={"input_ids": list(tokens(50)), "sampling_params": {"max_new_tokens": 100_000}}))
    while not sim.worker.engines[0].reqs:
        await asyncio.sleep(0.001)
    assert (await sim.http.post("/flush_cache")).status == 400
    assert (await sim.http.post("/abort_request", json={"abort_all": True})).status == 200
    resp = await task
    data = await resp.json()
    resp.release()
    assert data["meta_info"]["finish_reason"]["type"] == "abort"
    assert (await sim.http.get("/flush_cache")).status == 200
    assert sim.worker.engines[0].cache.device_tokens == 0


async def test_client_disconnect_aborts_the_request(sim: Sim) -> None:
    task = asyncio.create_task(sim.http.post("/v1/completions", json={"prompt": "x" * 400, "max_tokens": 100_000}))
    while not sim.worker.engines[0].reqs:
        await asyncio.sleep(0.001)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(200):
        if not sim.worker.engines[0].reqs:
            break
        await asyncio.sleep(0.01)
    assert not sim.worker.engines[0].reqs
    assert sim.worker.counters.requests_aborted == 1


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"messages": []}, 400, "messages"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": "lots"}, 400, "integer"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2_000_000}, 400, "context length"),
        ({"messages": [{"role": "user", "content": "hi"}], "routed_dp_rank": 3}, 400, "dp rank"),
    ],
)
async def test_bad_requests_get_400_with_an_sglang_error_body(sim: Sim, body: dict, status: int, message: str) -> None:
    resp = await sim.http.post("/v1/chat/completions", json=body)
    data = await resp.json()
    assert resp.status == status and data["object"] == "error" and message in data["message"]


async def test_invalid_json_is_a_400(sim: Sim) -> None:
    resp = await sim.http.post("/generate", data=b"{not json")
    assert resp.status == 400
    resp.release()


def test_loads_and_metrics_name_every_dp_rank() -> None:
    w = SimWorker(unit_config(server__dp_size=2))
    ranks = [e["dp_rank"] for e in w.loads({"core"})["loads"]]
    assert ranks == [0, 1]
    assert re.search(r'sglang:num_running_reqs\{[^}]*dp_rank="1"\}', w.metrics_text())
