"""The stock routers route every inference route, stream and non-stream, to simulated workers.

Real processes: two simulated workers (``python -m thunder_sgl.sim --workers 2``), then
``python -m sglang_router.launch_router`` (0.3.2) and ``python -m smg.launch_router`` (1.13.0)
with ``--policy cache_aware`` in front of them. Routers register workers asynchronously
(sglang-surface.md §3.7): the test polls ``/readiness`` first.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

REPO = Path(__file__).resolve().parents[2]
MODEL = "sim/tiny-qwen3-8b"
ROUTERS = {
    "sglang_router": [sys.executable, "-m", "sglang_router.launch_router"],
    "smg": [sys.executable, "-m", "smg.launch_router", "--shutdown-grace-period-secs", "1"],
}
MESSAGES = [{"role": "system", "content": "You are a careful agent."}, {"role": "user", "content": "Fix the failing test."}]
CASES = [
    ("/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "max_tokens": 6}),
    ("/v1/chat/completions", {"model": MODEL, "messages": MESSAGES, "max_tokens": 6, "stream": True, "stream_options": {"include_usage": True}}),
    ("/v1/completions", {"model": MODEL, "prompt": "def add(a, b):", "max_tokens": 6}),
    ("/v1/completions", {"model": MODEL, "prompt": "def add(a, b):", "max_tokens": 6, "stream": True}),
    ("/generate", {"text": "def add(a, b):", "sampling_params": {"max_new_tokens": 6}}),
    ("/generate", {"text": "def add(a, b):", "sampling_params": {"max_new_tokens": 6}, "stream": True}),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    tmp = tmp_path_factory.mktemp("sim")
    ready = tmp / "ready.json"
    log = open(tmp / "workers.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "thunder_sgl.sim", "--config", "tiny", "--workers", "2", "--port", "0",
         "--time-scale", "50", "--ready-file", str(ready)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL, stderr=log,
    )
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp / "workers.log").read_text()
            time.sleep(0.05)
        yield json.loads(ready.read_text())["urls"]
    finally:
        stop(proc)
        log.close()


async def requests_served(http: aiohttp.ClientSession, urls: list[str]) -> float:
    total = 0.0
    for url in urls:
        for line in (await (await http.get(url + "/metrics")).text()).splitlines():
            if line.startswith("sglang:num_requests_total{"):
                total += float(line.rsplit(" ", 1)[1])
    return total


async def check_response(resp: aiohttp.ClientResponse, route: str, stream: bool) -> None:
    assert resp.status == 200, await resp.text()
    if not stream:
        data = await resp.json()
        if route == "/generate":
            assert data["meta_info"]["completion_tokens"] == 6 and data["text"]
        else:
            assert data["usage"]["completion_tokens"] == 6 and data["usage"]["prompt_tokens"] > 0
            choice = data["choices"][0]
            assert (choice["message"]["content"] if route.endswith("chat/completions") else choice["text"])
        return
    events = [b[6:] for b in (await resp.read()).decode().split("\n\n") if b.startswith("data: ")]
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    if route == "/generate":
        assert last["meta_info"]["finish_reason"]["type"] == "length"
    elif route.endswith("chat/completions"):
        assert last["usage"]["completion_tokens"] == 6  # include_usage chunk
    else:
        assert last["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("router", list(ROUTERS))
async def test_stock_router_routes_every_inference_route_to_sim_workers(router: str, workers: list[str], tmp_path: Path) -> None:
    port = free_port()
    cmd = ROUTERS[router] + [
        "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers, "--policy", "cache_aware",
        "--log-level", "warn", "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
    ]
    log = open(tmp_path / "router.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
            deadline = time.monotonic() + 40
            while True:
                assert proc.poll() is None, (tmp_path / "router.log").read_text()
                try:
                    async with http.get(base + "/readiness") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                assert time.monotonic() < deadline, "router never became ready:\n" + (tmp_path / "router.log").read_text()
                await asyncio.sleep(0.25)
            before = await requests_served(http, workers)
            for route, body in CASES:
                async with http.post(base + route, json=body) as resp:
                    await check_response(resp, route, bool(body.get("stream")))
            assert await requests_served(http, workers) - before == len(CASES)
    finally:
        stop(proc)  # type: ignore[arg-type]
        log.close()
