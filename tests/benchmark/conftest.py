"""A tiny OpenAI-compatible fake server for the driver and locust tests (fake at the HTTP seam).

It answers ``/v1/chat/completions`` and ``/v1/completions`` (stream or not) with
``prompt_tokens = ceil(characters of the prompt / 4)``, ``completion_tokens = max_tokens``, and
``cached_tokens`` = the previous call's prompt + completion tokens of the same ``program_id``
(capped at the prompt), as a perfect prefix cache would; it records every request and the
usage it returned. ``release_mode`` "thunder" answers ``/programs/{id}/release`` like the
thunder router, "stock" like ``sglang_router`` (404, empty body). ``fail`` can make any call
answer an error status.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web


@dataclass
class FakeCall:
    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    status: int
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reply: str = ""


@dataclass
class FakeOpenAI:
    release_mode: str = "thunder"
    delay_s: float = 0.0
    fail: Callable[[str, int], int | None] | None = None
    """(program_id, nth call of that program, 0-based) → error status to answer, or None."""
    calls: list[FakeCall] = field(default_factory=list)
    releases: Counter[str] = field(default_factory=Counter)
    in_flight: int = 0
    max_in_flight: int = 0
    live: set[str] = field(default_factory=set)
    max_live: int = 0
    _last: dict[str, int] = field(default_factory=dict)
    _n: Counter[str] = field(default_factory=Counter)
    url: str = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.complete)
        app.router.add_post("/v1/completions", self.complete)
        app.router.add_post("/programs/{pid}/release", self.release)
        app.router.add_get("/v1/models", self.models)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}
        )

    async def release(self, request: web.Request) -> web.Response:
        pid = request.match_info["pid"]
        self.releases[pid] += 1
        if self.release_mode == "stock":
            return web.Response(status=404)
        if pid not in self.live:
            return web.json_response(
                {"error": {"message": "unknown program", "type": "not_found_error"}}, status=404
            )
        self.live.discard(pid)
        return web.json_response({"program_id": pid, "released": True})

    async def complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        pid = body.get("program_id") or request.headers.get("X-Program-Id", "")
        call = FakeCall(request.path, body, dict(request.headers), 200)
        self.calls.append(call)
        n = self._n[pid]
        self._n[pid] += 1
        self.live.add(pid)
        self.max_live = max(self.max_live, len(self.live))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            status = self.fail(pid, n) if self.fail else None
            if status:
                call.status = status
                return web.json_response(
                    {"error": {"message": "injected", "type": "server_error"}}, status=status
                )
            return await self._answer(request, body, pid, call)
        finally:
            self.in_flight -= 1

    async def _answer(
        self, request: web.Request, body: dict[str, Any], pid: str, call: FakeCall
    ) -> web.StreamResponse:
        chat = request.path.endswith("chat/completions")
        chars = sum(len(m["content"]) for m in body["messages"]) if chat else len(body["prompt"])
        prompt = math.ceil(chars / 4)
        completion = int(body.get("max_tokens") or 16)
        cached = min(self._last.get(pid, 0), prompt)
        self._last[pid] = prompt + completion
        text = (f"[{pid} {self._n[pid]}] " + "ok go " * completion)[: 4 * completion]
        call.prompt_tokens, call.completion_tokens, call.cached_tokens, call.reply = (
            prompt,
            completion,
            cached,
            text,
        )
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        choice = {"index": 0, "finish_reason": "length"}
        choice.update(
            {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
        )
        if not body.get("stream"):
            return web.json_response(
                {"id": "x", "object": "chat.completion", "choices": [choice], "usage": usage}
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        half = len(text) // 2
        for piece in (text[:half], text[half:]):
            delta = (
                {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
            )
            await resp.write(f"data: {json.dumps({'choices': [delta]})}\n\n".encode())
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def program_calls(self, pid: str) -> list[FakeCall]:
        return [c for c in self.calls if c.body.get("program_id") == pid]

    @property
    def ok_calls(self) -> list[FakeCall]:
        return [c for c in self.calls if c.status == 200]


@pytest.fixture
async def fake_openai():
    """A factory: ``await fake_openai(**options)`` starts a FakeOpenAI on a free port."""
    runners: list[web.AppRunner] = []

    async def start(**kw: Any) -> FakeOpenAI:
        fake = FakeOpenAI(**kw)
        runner = web.AppRunner(fake.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        fake.url = f"http://{host}:{port}"
        runners.append(runner)
        return fake

    yield start
    for r in runners:
        await r.cleanup()
