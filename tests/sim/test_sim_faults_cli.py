"""Fault knobs (config and ``/sim/faults``) and the ``python -m thunder_sgl.sim`` command line."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from simkit import unit_config

from thunder_sgl.sim import ScaledClock, SimWorker
from thunder_sgl.sim.server import RunningWorker, serve

REPO = Path(__file__).resolve().parents[2]
CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 10}


@pytest.fixture
async def served() -> AsyncIterator[tuple[RunningWorker, aiohttp.ClientSession]]:
    rw = await serve(SimWorker(unit_config()), ScaledClock(1000.0))
    http = aiohttp.ClientSession(base_url=rw.url)
    yield rw, http
    await http.close()
    await rw.runner.cleanup()


async def set_faults(http: aiohttp.ClientSession, **kw: object) -> dict:
    resp = await http.post("/sim/faults", json=kw)
    assert resp.status == 200
    return await resp.json()


async def test_failure_rate_one_answers_500_with_an_error_body(served: tuple[RunningWorker, aiohttp.ClientSession]) -> None:
    _, http = served
    await set_faults(http, failure_rate=1.0)
    resp = await http.post("/v1/chat/completions", json=CHAT)
    body = await resp.json()
    assert resp.status == 500 and body["type"] == "InternalServerError" and body["object"] == "error"
    assert (await http.get("/health")).status == 200  # only inference routes fail
    await set_faults(http, failure_rate=0.0)
    assert (await http.post("/v1/chat/completions", json=CHAT)).status == 200


async def test_added_latency_delays_inference_responses(served: tuple[RunningWorker, aiohttp.ClientSession]) -> None:
    _, http = served
    await set_faults(http, added_latency_ms=250)
    t0 = time.monotonic()
    assert (await http.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 1}})).status == 200
    assert time.monotonic() - t0 >= 0.25


async def test_stop_answering_holds_every_route_until_cleared(served: tuple[RunningWorker, aiohttp.ClientSession]) -> None:
    _, http = served
    await set_faults(http, stop_answering=True)
    with pytest.raises(asyncio.TimeoutError):
        await http.get("/health", timeout=aiohttp.ClientTimeout(total=0.3))
    assert (await http.get("/sim/faults")).status == 200  # the admin route still answers
    pending = asyncio.create_task(http.get("/health"))
    await asyncio.sleep(0.1)
    assert not pending.done()
    await set_faults(http, stop_answering=False)
    assert (await pending).status == 200


async def test_die_mid_stream_drop_cuts_the_connection_after_k_chunks(served: tuple[RunningWorker, aiohttp.ClientSession]) -> None:
    rw, http = served
    state = await set_faults(http, die_mid_stream_after_tokens=3, die_mid_stream_mode="drop")
    assert state["die_mid_stream_after_tokens"] == 3
    chunks = 0
    with pytest.raises(aiohttp.ClientPayloadError):
        async with http.post("/v1/chat/completions", json={**CHAT, "stream": True}) as resp:
            async for line in resp.content:
                chunks += line.startswith(b"data: ")
    assert chunks == 3
    assert (await (await http.get("/sim/faults")).json())["die_mid_stream_after_tokens"] is None  # one-shot
    async with http.post("/v1/chat/completions", json={**CHAT, "stream": True}) as resp:
        assert (await resp.read()).endswith(b"data: [DONE]\n\n")
    for _ in range(100):
        if not rw.worker.engines[0].reqs:
            break
        await asyncio.sleep(0.01)
    assert not rw.worker.engines[0].reqs  # the cut request was aborted (or had finished)


async def test_break_streams_rate_cuts_that_fraction_of_streams_at_every_point(served: tuple[RunningWorker, aiohttp.ClientSession]) -> None:
    rw, http = served
    await set_faults(http, break_streams_rate=0.5)
    cut_after: list[int] = []
    for _ in range(80):
        chunks = 0
        try:
            async with http.post("/v1/chat/completions", json={**CHAT, "stream": True}) as resp:
                async for line in resp.content:
                    chunks += line.startswith(b"data: ") and b'"content"' in line
        except aiohttp.ClientPayloadError:
            cut_after.append(chunks)
    assert 20 <= len(cut_after) <= 60
    assert min(cut_after) == 0 and max(cut_after) >= 7 and max(cut_after) < 10  # before the first event and late
    async with http.post("/v1/chat/completions", json=CHAT) as resp:
        assert resp.status == 200  # non-stream answers are untouched
    await set_faults(http, break_streams_rate=0.0)
    async with http.post("/v1/chat/completions", json={**CHAT, "stream": True}) as resp:
        assert (await resp.read()).endswith(b"data: [DONE]\n\n")


async def test_startup_delay_answers_503_until_started() -> None:
    rw = await serve(SimWorker(unit_config(faults__startup_delay_s=0.3)), ScaledClock(1.0))
    try:
        async with aiohttp.ClientSession(base_url=rw.url) as http:
            assert (await http.get("/health")).status == 503
            await asyncio.sleep(0.35)
            assert (await http.get("/health")).status == 200
    finally:
        await rw.runner.cleanup()


@pytest.mark.parametrize("body", [{"failure_rate": 2.0}, {"break_streams_rate": -0.1}, {"nope": 1}, {"die_mid_stream_mode": "explode"}, [1, 2]])
async def test_invalid_fault_settings_are_refused(served: tuple[RunningWorker, aiohttp.ClientSession], body: object) -> None:
    _, http = served
    resp = await http.post("/sim/faults", json=body)
    assert resp.status == 400
    resp.release()


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], list[str], Path]]:
    ready = tmp_path / "ready.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "thunder_sgl.sim", "--config", "tiny", "--port", "0", "--workers", "2",
         "--time-scale", "50", "--ready-file", str(ready)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    urls = []
    try:
        for _ in range(2):
            line = proc.stdout.readline()  # type: ignore[union-attr]
            assert line.startswith("thunder_sgl.sim: worker "), line + proc.stderr.read()  # type: ignore[union-attr]
            urls.append(line.split(" ready at ")[1].strip())
        yield proc, urls, ready
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]


async def test_cli_starts_workers_on_free_ports_and_stops_cleanly_on_sigterm(cli: tuple[subprocess.Popen[str], list[str], Path]) -> None:
    proc, urls, ready = cli
    assert json.loads(ready.read_text())["urls"] == urls
    async with aiohttp.ClientSession() as http:
        for url in urls:
            assert (await http.get(url + "/health")).status == 200
            info = await (await http.get(url + "/server_info")).json()
            assert info["max_total_num_tokens"] == 32768 and info["enable_hierarchical_cache"]
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(proc.wait, 10) == 0


async def test_die_mid_stream_exit_kills_the_worker_process(cli: tuple[subprocess.Popen[str], list[str], Path]) -> None:
    proc, urls, _ = cli
    async with aiohttp.ClientSession() as http:
        await http.post(urls[0] + "/sim/faults", json={"die_mid_stream_after_tokens": 2, "die_mid_stream_mode": "exit"})
        with pytest.raises(aiohttp.ClientError):
            async with http.post(urls[0] + "/v1/chat/completions", json={**CHAT, "stream": True}) as resp:
                await resp.read()
    assert await asyncio.to_thread(proc.wait, 10) == 1
