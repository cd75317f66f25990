"""What the harness asks the simulated cluster over HTTP, beside the workload itself.

- ``NodeSampler``: per-node HBM used/capacity from every worker's ``/v1/loads`` at a fixed
  interval (node imbalance, the memory-over-time plot); a node with several DP ranks reports
  Σ used / Σ capacity.
- ``scrape``: Prometheus text of a router or worker (``None`` when it does not answer).
- ``clean_cluster``: wait until no request runs or waits, ``POST /flush_cache`` on every worker,
  and check that ``/v1/loads`` shows nothing used — the state every run starts from.

Everything is bounded by timeouts; nothing here raises on a slow or dead peer except
``clean_cluster``, whose caller must not start a run on a dirty cluster.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

_SHORT = aiohttp.ClientTimeout(total=5)


async def get_json(session: aiohttp.ClientSession, url: str) -> Any:
    try:
        async with session.get(url, timeout=_SHORT) as r:
            if r.status != 200:
                return None
            return await r.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return None


async def scrape(session: aiohttp.ClientSession, url: str) -> str | None:
    """``GET url/metrics`` as text, or None."""
    try:
        async with session.get(url.rstrip("/") + "/metrics", timeout=_SHORT) as r:
            return await r.text() if r.status == 200 else None
    except (TimeoutError, aiohttp.ClientError, UnicodeDecodeError):
        return None


async def loads(session: aiohttp.ClientSession, url: str) -> list[dict[str, Any]] | None:
    """The per-rank entries of a worker's ``/v1/loads``, or None."""
    doc = await get_json(session, url.rstrip("/") + "/v1/loads")
    if not isinstance(doc, dict) or not isinstance(doc.get("loads"), list):
        return None
    return doc["loads"]


def used_fraction(entries: list[dict[str, Any]]) -> float:
    """Σ num_used_tokens / Σ max_total_num_tokens over a worker's ranks."""
    cap = sum(int(e.get("max_total_num_tokens") or 0) for e in entries)
    used = sum(int(e.get("num_used_tokens") or 0) for e in entries)
    return used / cap if cap else 0.0


class NodeSampler:
    """Samples per-node HBM use every ``every_s`` wall seconds until cancelled.

    ``samples`` holds ``(simulated seconds since t0, [fraction per node])``; a node that does
    not answer repeats its last value (a dead node shows as a flat line, not a gap)."""

    def __init__(self, session: aiohttp.ClientSession, urls: list[str], every_s: float,
                 time_scale: float, t0: float | None = None) -> None:
        self.session = session
        self.urls = list(urls)
        self.every_s = max(0.05, every_s)
        self.time_scale = time_scale
        self.t0 = time.monotonic() if t0 is None else t0
        self.samples: list[tuple[float, list[float]]] = []
        self._last = [0.0] * len(self.urls)

    def sim_now(self) -> float:
        return (time.monotonic() - self.t0) * self.time_scale

    async def sample(self) -> None:
        t = self.sim_now()
        got = await asyncio.gather(*(loads(self.session, u) for u in self.urls))
        for i, entries in enumerate(got):
            if entries:
                self._last[i] = used_fraction(entries)
        self.samples.append((t, list(self._last)))

    async def run(self) -> None:
        nxt = time.monotonic()
        while True:
            await self.sample()
            nxt += self.every_s
            await asyncio.sleep(max(0.0, nxt - time.monotonic()))


async def post_ok(session: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with session.post(url, timeout=_SHORT) as r:
            await r.read()
            return r.status == 200
    except (TimeoutError, aiohttp.ClientError):
        return False


async def clean_cluster(session: aiohttp.ClientSession, urls: list[str], timeout_s: float = 60.0) -> None:
    """Once every worker is idle, flush every cache and verify that nothing is used.

    Raises ``TimeoutError`` naming the workers that stayed busy or dirty."""
    deadline = time.monotonic() + timeout_s
    dirty: list[str] = list(urls)
    while time.monotonic() < deadline:
        states = await asyncio.gather(*(loads(session, u) for u in urls))
        busy = [u for u, e in zip(urls, states, strict=True)
                if e is None or any(x.get("num_running_reqs") or x.get("num_waiting_reqs") for x in e)]
        if not busy:
            flushed = await asyncio.gather(*(post_ok(session, u.rstrip("/") + "/flush_cache") for u in urls))
            after = await asyncio.gather(*(loads(session, u) for u in urls))
            dirty = [u for u, ok, e in zip(urls, flushed, after, strict=True)
                     if not ok or e is None or any(_used(x) for x in e)]
            if not dirty:
                return
        else:
            dirty = busy
        await asyncio.sleep(0.2)
    raise TimeoutError(f"workers not idle and clean after {timeout_s:.0f} s: {', '.join(dirty)}")


def _used(entry: dict[str, Any]) -> int:
    return int(entry.get("num_used_tokens") or 0) + int(entry.get("num_running_reqs") or 0) \
        + int(entry.get("num_total_tokens") or 0)
