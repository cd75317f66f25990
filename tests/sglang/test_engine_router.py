"""thunder in front of one real SGLang CPU server: registration, the monitor's readings, every
inference route through the OpenAI SDK and over HTTP, exact usage in the program table, a real
radix-cache hit, abort on disconnect, release and /flush_cache."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from conftest import idle, loads
from openai import OpenAI

from thunder_sgl.children import wait_until
from thunder_sgl.textgen import text

X = {"ignore_eos": True}  # random weights emit end-of-sequence early; SGLang's own field


@pytest.fixture(scope="module")
def engine(start_cluster):
    return start_cluster(1, max_total_tokens=16384)


@pytest.fixture
def thunder(engine, routers):
    return routers("thunder", engine.urls)


def backend_of(router_url: str) -> dict:
    return httpx.get(router_url + "/workers", timeout=10).json()["workers"][0]["backends"][0]


def test_registration_reads_the_engines_own_capacity(engine, thunder):
    info = httpx.get(engine.urls[0] + "/server_info", timeout=10).json()
    b = backend_of(thunder.url)
    assert b["hbm_tokens"] == info["max_total_num_tokens"] == 16384
    assert b["host_tokens"] == 0 and b["storage_tokens"] == 0


def test_monitor_readings_move_under_load_and_return_to_idle(engine, thunder):
    body = {"model": "default", "max_tokens": 400, "program_id": "loader",
            "messages": [{"role": "user", "content": text(3000, "load")}], **X}
    t = threading.Thread(target=lambda: httpx.post(thunder.url + "/v1/chat/completions", json=body, timeout=300))
    t.start()
    try:
        # The monitor polls /v1/loads every second: the running request and its KV show up.
        wait_until(lambda: backend_of(thunder.url)["running_reqs"] >= 1 and backend_of(thunder.url)["used_tokens"] > 2500,
                   60, "the monitor to see the running request")
    finally:
        t.join(300)
    wait_until(lambda: backend_of(thunder.url)["running_reqs"] == 0 and backend_of(thunder.url)["used_tokens"] == 0,
               30, "the monitor to see the engine idle again")


def test_openai_sdk_chat_completions_and_generate_with_program_id(engine, thunder):
    client = OpenAI(base_url=thunder.url + "/v1", api_key="none", max_retries=0, timeout=120)
    msgs = [{"role": "system", "content": text(600, "sys-sdk")}, {"role": "user", "content": text(300, "task-sdk")}]
    r1 = client.chat.completions.create(model="default", messages=msgs, max_tokens=16, extra_body={"program_id": "sdk", **X})
    assert r1.usage.completion_tokens == 16 and r1.usage.prompt_tokens > 800
    msgs += [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": text(100, "obs-sdk")}]
    stream = client.chat.completions.create(model="default", messages=msgs, max_tokens=16, stream=True,
                                            stream_options={"include_usage": True}, extra_body={"program_id": "sdk", **X})
    chunks = list(stream)
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 16
    # The second prompt starts with the first one: a real radix-cache hit on the engine.
    assert usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens - 2
    p = httpx.get(thunder.url + "/programs/sdk", timeout=10).json()
    assert p["steps"] == 2 and p["phase"] == "acting" and p["in_flight"] == 0
    cached = r1.usage.prompt_tokens_details.cached_tokens + usage.prompt_tokens_details.cached_tokens
    assert p["tokens"] == {"prompt": r1.usage.prompt_tokens + usage.prompt_tokens, "cached": cached,
                           "cached_by_tier": {"device": cached, "host": 0, "storage": 0},  # no HiCache here
                           "completion": 32}
    assert p["context_tokens"] == usage.prompt_tokens + usage.completion_tokens

    c = client.completions.create(model="default", prompt=text(200, "compl"), max_tokens=8, extra_body={"program_id": "compl", **X})
    assert c.usage.completion_tokens == 8
    g = httpx.post(thunder.url + "/generate", timeout=120, json={
        "text": text(200, "gen"), "program_id": "gen", "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}}).json()
    assert g["meta_info"]["completion_tokens"] == 8
    for pid, want in (("compl", 8), ("gen", 8)):
        p = httpx.get(f"{thunder.url}/programs/{pid}", timeout=10).json()
        assert p["steps"] == 1 and p["tokens"]["completion"] == want
    # Release drops the accounting; the engine keeps serving.
    for pid in ("sdk", "compl", "gen"):
        assert httpx.post(f"{thunder.url}/programs/{pid}/release", timeout=10).json()["released"] is True
        assert httpx.get(f"{thunder.url}/programs/{pid}", timeout=10).status_code == 404


@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_aborts_the_request_on_the_engine(engine, thunder, stream):
    body = {"model": "default", "stream": stream, "max_tokens": 3000, "program_id": f"quitter-{stream}",
            "messages": [{"role": "user", "content": text(2000, "quit")}], **X}
    if stream:
        with httpx.Client(timeout=120) as h, h.stream("POST", thunder.url + "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            for i, _ in enumerate(r.iter_lines()):
                if i > 4:
                    break
    else:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(thunder.url + "/v1/chat/completions", json=body, timeout=httpx.Timeout(120, read=3.0))
    # The engine drops the request (3000 tokens would take minutes here) and frees its KV.
    t0 = time.monotonic()
    wait_until(lambda: idle(engine.urls) and loads(engine.urls[0])["num_used_tokens"] == 0, 30, "the engine to abort it")
    assert time.monotonic() - t0 < 30
    p = httpx.get(f"{thunder.url}/programs/quitter-{stream}", timeout=10).json()
    assert p["in_flight"] == 0 and p["phase"] == "acting"


def test_flush_cache_through_the_router_empties_the_engines_cache(engine, thunder):
    prompt = text(1500, "flush")
    body = {"model": "default", "max_tokens": 4, "messages": [{"role": "user", "content": prompt}], **X}
    first = httpx.post(thunder.url + "/v1/chat/completions", json=body, timeout=120).json()["usage"]
    again = httpx.post(thunder.url + "/v1/chat/completions", json=body, timeout=120).json()["usage"]
    assert again["prompt_tokens_details"]["cached_tokens"] >= first["prompt_tokens"] - 2
    wait_until(lambda: idle(engine.urls), 30, "the engine idle")
    r = httpx.post(thunder.url + "/flush_cache", timeout=60)
    assert r.status_code == 200 and r.json()["workers_flushed"] == 1
    after = httpx.post(thunder.url + "/v1/chat/completions", json=body, timeout=120).json()["usage"]
    assert after["prompt_tokens_details"]["cached_tokens"] == 0
