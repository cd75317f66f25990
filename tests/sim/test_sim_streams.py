"""Streams of a simulated worker under every interleaving of completion, abort and the loop.

A stream handler learns of new tokens from the driving loop and writes them when it next
runs; by then its request may have finished (inside another request's submit or abort, which
step the engine) and left the engine's table. These tests pin that window down by hand, then
drive many concurrent streams at a high time scale.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import random
from collections.abc import AsyncIterator

import aiohttp
import pytest
from simkit import tokens, unit_config

from thunder_sgl.sim import ManualClock, ScaledClock, SimRequest, SimWorker
from thunder_sgl.sim.config import load_sim_config
from thunder_sgl.sim.server import RunningWorker, serve

ABANDON = 0.125
CHAT = {"messages": [{"role": "system", "content": "You are a test."}, {"role": "user", "content": "List the files."}]}


def parse_sse(body: bytes) -> list[object]:
    """Events of a complete SSE body; fails on anything malformed or cut short."""
    text = body.decode()
    assert text.endswith("data: [DONE]\n\n"), f"stream cut short: {text[-200:]!r}"
    out: list[object] = []
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        data = block[6:]
        out.append(data if data == "[DONE]" else json.loads(data))
    assert out.count("[DONE]") == 1
    return out


def check_openai_stream(events: list[object], route: str, n_tokens: int, with_usage: bool) -> None:
    """Role first (chat), one chunk per token, the finish chunk, the usage chunk if asked, [DONE]."""
    tail = 3 if with_usage else 2
    chunks, fin = events[:-tail], events[-tail]
    assert len(chunks) == n_tokens
    assert isinstance(fin, dict) and fin["choices"][0]["finish_reason"] == "length"
    if route == "/v1/chat/completions":
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"  # type: ignore[index]
        assert all("role" not in c["choices"][0]["delta"] for c in chunks[1:])  # type: ignore[index]
    if with_usage:
        usage = events[-2]["usage"]  # type: ignore[index]
        assert usage["completion_tokens"] == n_tokens


@pytest.fixture
async def manual() -> AsyncIterator[tuple[RunningWorker, aiohttp.ClientSession, ManualClock]]:
    clock = ManualClock(0.0)
    rw = await serve(SimWorker(unit_config()), clock)
    http = aiohttp.ClientSession(base_url=rw.url)
    yield rw, http, clock
    await http.close()
    await rw.runner.cleanup()


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/generate"])
async def test_a_stream_whose_request_finished_inside_another_submit_still_completes(
        manual: tuple[RunningWorker, aiohttp.ClientSession, ManualClock], route: str) -> None:
    rw, http, clock = manual
    srv = rw.server
    body = {**CHAT, "max_tokens": 8, "stream": True} if route != "/generate" else {
        "text": "The quick brown fox.", "sampling_params": {"max_new_tokens": 8}, "stream": True}
    resp = await http.post(route, json=body)
    assert resp.status == 200
    for _ in range(5):  # let the handler reach its wait for tokens
        await asyncio.sleep(0)
    (pend,) = srv.streams.values()
    # Without yielding to the loop: the loop tells the stream that tokens are visible...
    t = 0.0
    while pend.visible == 0:
        t += 1e-4
        clock.set(t)
        srv.sync()
    assert pend.event is None and pend.visible < 8
    # ...then another request arrives after the stream's request ended: its submit steps the
    # engine, which finishes the stream's request and drops it from its table before the
    # stream handler has run.
    clock.set(t + 10.0)
    srv.submit(SimRequest("other", tokens(10, 1 << 26), 1), stream=False)
    assert rw.worker.output_ids(pend.rid) is None and pend.event is None
    events = parse_sse(await resp.read())
    if route == "/generate":
        assert len(events[-2]["output_ids"]) == 8 and events[-2]["meta_info"]["completion_tokens"] == 8  # type: ignore[index]
        assert [len(e["output_ids"]) for e in events[:-2]] == list(range(1, 9))  # type: ignore[index]
    else:
        check_openai_stream(events, route, 8, with_usage=False)


async def _stress(rw: RunningWorker, clients: int, per_client: int, seed: int) -> tuple[int, int]:
    """``clients`` connections, each ``per_client`` streams of random length on random routes;
    about one in eight is abandoned mid-way (the client disconnects: an abort). Returns
    (complete streams, abandoned streams); fails on any malformed or short body."""
    rng = random.Random(seed)
    done = abandoned = 0
    async with aiohttp.ClientSession(base_url=rw.url, connector=aiohttp.TCPConnector(limit=0)) as http:

        async def client(i: int) -> None:
            nonlocal done, abandoned
            for j in range(per_client):
                route = rng.choice(["/v1/chat/completions", "/v1/completions", "/generate"])
                n = rng.randint(1, 24)
                usage = rng.random() < 0.5
                prompt = f"client {i} turn {j} " * rng.randint(1, 20)
                if route == "/generate":
                    body = {"text": prompt, "sampling_params": {"max_new_tokens": n}, "stream": True}
                elif route == "/v1/completions":
                    body = {"prompt": prompt, "max_tokens": n, "stream": True}
                else:
                    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": n, "stream": True}
                if usage and route != "/generate":
                    body["stream_options"] = {"include_usage": True}
                async with http.post(route, json=body) as resp:
                    assert resp.status == 200
                    if rng.random() < ABANDON:
                        await resp.content.readany()
                        resp.close()  # abandon it: the worker aborts the request
                        abandoned += 1
                        continue
                    events = parse_sse(await resp.read())
                if route == "/generate":
                    assert events[-2]["meta_info"]["completion_tokens"] == n  # type: ignore[index]
                    assert len(events[-2]["output_ids"]) == n  # type: ignore[index]
                else:
                    check_openai_stream(events, route, n, with_usage=usage)
                done += 1

        await asyncio.gather(*(client(i) for i in range(clients)))
    return done, abandoned


async def _arrivals(rw: RunningWorker, stop: asyncio.Event) -> None:
    """A request arrives at every turn of the event loop (at most 32 of these in flight), as
    at a high request rate: each submit steps the engine between the loop's token pushes
    and the stream handlers that act on them, which is where the race lives."""
    srv, k, inflight = rw.server, 0, []
    while not stop.is_set():
        inflight = [p for p in inflight if p.event is None]
        if len(inflight) < 32:
            inflight.append(srv.submit(SimRequest(f"arrival-{k}", tokens(4, 1 << 27), 1), stream=False))
            k += 1
        await asyncio.sleep(0)


@pytest.mark.parametrize("time_scale", [30.0, 300.0, 3000.0])
async def test_many_concurrent_streams_at_a_high_time_scale_all_complete_without_server_errors(
        caplog: pytest.LogCaptureFixture, time_scale: float) -> None:
    gc.collect()  # what earlier tests left unclosed is finalised now, not under this test's log capture
    rw = await serve(SimWorker(load_sim_config("tiny")), ScaledClock(time_scale))
    stop = asyncio.Event()
    arrivals = asyncio.create_task(_arrivals(rw, stop))
    try:
        with caplog.at_level(logging.ERROR):
            done, abandoned = await _stress(rw, clients=48, per_client=12, seed=int(time_scale))
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert not errors, errors[0].getMessage() + "\n" + (errors[0].exc_text or "")
        assert done + abandoned == 48 * 12 and done > 400
        stop.set()
        await arrivals
        for _ in range(300):  # abandoned streams are aborted: nothing stays in the engine
            if not rw.worker.engines[0].reqs and not rw.server.pending:
                break
            await asyncio.sleep(0.01)
        assert not rw.worker.engines[0].reqs and not rw.server.pending
    finally:
        stop.set()
        await arrivals
        await rw.runner.cleanup()


def _gauge(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


@pytest.mark.parametrize("how", ["handler_cancelled", "write_to_closing_transport"])
async def test_a_client_that_leaves_mid_stream_is_aborted_quietly_counted_and_its_kv_released(
        manual: tuple[RunningWorker, aiohttp.ClientSession, ManualClock], caplog: pytest.LogCaptureFixture,
        how: str) -> None:
    """A client that leaves is ordinary traffic. Either way aiohttp learns of it (the handler
    cancelled at the connection's loss, or a token write that finds the transport closing
    first, as on a busy machine) the request is aborted in the engine, its KV released, the
    disconnect counted in ``sim:client_disconnects_total``, and nothing logged as an error."""
    gc.collect()  # what earlier tests left unclosed is finalised now, not under this test's log capture
    rw, http, clock = manual
    srv = rw.server
    before = await (await http.get("/metrics")).text()
    assert _gauge(before, "sim:client_disconnects_total") == 0
    used0 = _gauge(before, "sglang:num_used_tokens")
    with caplog.at_level(logging.DEBUG):
        resp = await http.post("/v1/chat/completions", json={**CHAT, "max_tokens": 5000, "stream": True})
        assert resp.status == 200
        t = 0.0
        while not srv.streams or next(iter(srv.streams.values())).visible < 3:  # a few tokens out
            await asyncio.sleep(0)
            t += 1e-3
            clock.set(t)
            srv.kick()
        assert b"data: " in await resp.content.readany()
        (pend,) = srv.streams.values()
        assert rw.worker.engines[0].reqs and pend.event is None
        during = await (await http.get("/metrics")).text()
        assert _gauge(during, "sglang:num_used_tokens") > used0 and _gauge(during, "sglang:num_running_reqs") == 1
        if how == "handler_cancelled":
            resp.close()
        else:  # the stream handler is woken for new tokens, then the server's transport closes
            (conn,) = [c for c in rw.runner.server.connections if c.transport is not None and c._current_request]  # type: ignore[union-attr]
            clock.set(t + 0.05)
            srv.sync()  # the stream is told of new tokens: its handler runs first...
            assert pend._waiter is not None and pend._waiter.done()
            conn.transport.close()  # ...and finds the connection closing
            resp.close()
        for _ in range(1000):  # aiohttp notices within a loop turn or two; bounded all the same
            if srv.client_disconnects:
                break
            await asyncio.sleep(0.01)
        clock.set(t + 1.0)  # the abort takes effect at the end of the engine's iteration in flight
        srv.sync()
        after = await (await http.get("/metrics")).text()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors[0].getMessage() + "\n" + (errors[0].exc_text or "")
    assert _gauge(after, "sim:client_disconnects_total") == 1
    assert _gauge(after, "sglang:num_aborted_requests_total") == _gauge(before, "sglang:num_aborted_requests_total") + 1
    assert not rw.worker.engines[0].reqs and not srv.pending and not srv.streams
    assert _gauge(after, "sglang:num_running_reqs") == 0
    assert _gauge(after, "sglang:num_used_tokens") == used0  # the KV it held is free again
    if how == "write_to_closing_transport":
        assert any("client left" in r.getMessage() for r in caplog.records if r.name == "thunder_sgl.sim")
