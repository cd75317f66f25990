"""The worker client: auth and timeout on every call, one reply per worker, the summary status."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from thunder_sgl.gateway.workers_client import FanOut, WorkerReply, WorkersClient


def reply(status: int, body: object = None) -> WorkerReply:
    return WorkerReply(f"http://w{status}", status, body)


@pytest.mark.parametrize(("statuses", "want"), [
    ((200, 200), 200),
    ((400, 400), 400),          # every worker refused the same way: the caller's input
    ((400, 404), 502),
    ((200, 400), 502),          # partial
    ((0, 200), 502),            # one unreachable
    ((0,), 502),
])
def test_summary_status(statuses, want):
    assert FanOut(tuple(reply(s) for s in statuses)).status() == want


def test_reply_message_reads_sglang_and_openai_bodies():
    assert reply(400, {"object": "error", "message": "bad mode"}).message == "bad mode"
    assert reply(400, {"error": {"message": "nope"}}).message == "nope"
    assert reply(200, "Cache flushed.").message == "Cache flushed."
    assert WorkerReply("http://w", 0, error="worker http://w timed out").message.endswith("timed out")


async def test_calls_carry_the_upstream_key_and_time_out_per_worker():
    seen: list[str | None] = []

    async def pause(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        if request.query.get("slow"):
            await asyncio.sleep(2)
        return web.json_response({"message": "Generation paused successfully.", "status": "ok", "got": await request.json()})

    app = web.Application()
    app.router.add_post("/pause_generation", pause)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    async with aiohttp.ClientSession() as session:
        client = WorkersClient(lambda: session, {"Authorization": "Bearer up-key"}, timeout_seconds=0.5)
        fan = await client.fan_out([url, url, "http://127.0.0.1:9"], "POST", "/pause_generation", {"mode": "retract"})
        assert len(fan.replies) == 2  # one call per worker
        ok, dead = fan.replies
        assert ok.ok and ok.body["got"] == {"mode": "retract"} and seen == ["Bearer up-key"]
        assert dead.status == 0 and "Connect" in dead.message
        slow = await client.call(url, "POST", "/pause_generation?slow=1", {})
        assert slow.status == 0 and "timed out" in slow.message
    await runner.cleanup()
