"""One client for the calls the router makes to its workers outside the inference path:
engine control (pause, continue, abort, weight updates, memory, cache flush), fanned out to
several workers at once and answered with one summary.

Every call carries the upstream key (``Authorization: Bearer <--api-key>``, the key the
workers were started with) and a total timeout, so no route repeats either. A worker that
cannot be reached, times out or answers with an error is one entry of the summary, never an
exception: the caller decides what a partial result means (``FanOut``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

CALL_ERRORS = (asyncio.TimeoutError, aiohttp.ClientError, OSError)
BODY_CHARS = 2000
"""Characters of a worker's answer kept in a summary (SGLang's errors carry tracebacks)."""


@dataclass(frozen=True)
class WorkerReply:
    """One worker's answer. ``status`` 0: no HTTP answer at all (``error`` says why)."""

    worker: str
    status: int
    body: Any = None
    """The answer as JSON when it is JSON, else its text (cut at ``BODY_CHARS``)."""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def message(self) -> str:
        """A human-readable line for the summary."""
        if self.error is not None:
            return self.error
        b = self.body
        if isinstance(b, dict):
            err = b.get("error")
            inner: dict[str, Any] = err if isinstance(err, dict) else b
            if "message" in inner:
                return str(inner["message"])[:BODY_CHARS]
        return "" if b is None else str(b)[:BODY_CHARS]

    def describe(self) -> dict[str, Any]:
        return {"worker": self.worker, "status": self.status, "ok": self.ok, "message": self.message,
                "body": self.body if isinstance(self.body, (dict, list)) else None}


@dataclass(frozen=True)
class FanOut:
    """The replies of one call made to several workers."""

    replies: tuple[WorkerReply, ...]

    @property
    def ok(self) -> list[WorkerReply]:
        return [r for r in self.replies if r.ok]

    @property
    def failed(self) -> list[WorkerReply]:
        return [r for r in self.replies if not r.ok]

    @property
    def all_ok(self) -> bool:
        return bool(self.replies) and not self.failed

    def status(self) -> int:
        """200 when every worker succeeded; the workers' own 4xx when they all refused the
        same way (bad input is the caller's); else 502 (some failed or could not be reached)."""
        if self.all_ok:
            return 200
        codes = {r.status for r in self.replies}
        if not self.ok and len(codes) == 1 and 400 <= next(iter(codes)) < 500:
            return next(iter(codes))
        return 502

    def describe(self) -> list[dict[str, Any]]:
        return [r.describe() for r in self.replies]


class WorkersClient:
    """Calls to workers with the router's upstream auth and a timeout on every call."""

    def __init__(self, session: Callable[[], aiohttp.ClientSession | None], headers: dict[str, str],
                 timeout_seconds: float) -> None:
        """``session``: returns the gateway's pooled session (made when the app starts)."""
        self._session = session
        self._headers = headers
        self.timeout_seconds = timeout_seconds

    async def call(self, worker: str, method: str, path: str, body: Any = None,
                   timeout: float | None = None) -> WorkerReply:
        session = self._session()
        if session is None:
            return WorkerReply(worker, 0, error="router is not started")
        headers = dict(self._headers)
        data = None
        if body is not None:
            data = orjson.dumps(body)
            headers["Content-Type"] = "application/json"
        t = aiohttp.ClientTimeout(total=timeout or self.timeout_seconds, sock_connect=5)
        try:
            async with session.request(method, worker + path, data=data, headers=headers, timeout=t) as r:
                raw = await r.read()
                return WorkerReply(worker, r.status, _decode(raw))
        except CALL_ERRORS as e:
            what = "timed out" if isinstance(e, asyncio.TimeoutError) else f"{type(e).__name__}: {e}"
            return WorkerReply(worker, 0, error=f"worker {worker} {what}")

    async def fan_out(self, workers: Iterable[str], method: str, path: str, body: Any = None,
                      timeout: float | None = None, bodies: dict[str, Any] | None = None) -> FanOut:
        """The same call to every worker at once (``bodies``: a body of its own per worker)."""
        urls = list(dict.fromkeys(workers))
        calls = (self.call(u, method, path, bodies[u] if bodies and u in bodies else body, timeout) for u in urls)
        return FanOut(tuple(await asyncio.gather(*calls)))


def _decode(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw[:BODY_CHARS].decode(errors="replace")
