"""The inference path's HTTP/1.1 client to the workers: keep-alive connections, httptools.

The proxy sends one POST per inference request and reads back one answer, whole or as a
stream. aiohttp's client did that at about a third of the router's CPU per request (request
and payload objects, a timer, header multidicts, a stream reader; ``benchmark.overhead``), more
than the policy and the server side together. This client does only what that path needs:

- one connection pool per worker origin, keep-alive connections reused LIFO, dropped after
  ``keepalive`` seconds idle (below SGLang's 5 s server keep-alive: a POST sent on a
  connection the worker is closing fails before any byte, which the proxy takes for a dead
  worker) and whenever the worker closed them;
- the request written in one ``transport.write``; the response parsed by httptools (chunked
  and Content-Length bodies, and bodies ended by the connection closing);
- ``total`` seconds for the whole exchange, connection included (``asyncio.TimeoutError``),
  prolonged by what ``grace`` grants when it runs out (the time the worker was paused meanwhile,
  ``backends.pause``); ``connect`` seconds to connect;
- reading back pressure: the worker's socket is paused while more than ``HIGH_WATER``
  bytes of a stream wait for the client.

Errors: ``UpstreamConnectError`` (a ``ConnectionError``) when the exchange fails before the
status line arrived (connection refused or reset, the worker closed the connection), a
``TimeoutError`` when the timeout hits, ``UpstreamBodyError`` when the body breaks after
the status line. The other calls to the workers (health polls, engine control, aborts) use
aiohttp: they are rare, and gain nothing from this.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

from thunder_sgl import __version__

HIGH_WATER = 1 << 20
"""Bytes of a response buffered for a slow reader before the worker's socket is paused."""


_USER_AGENT = f"User-Agent: thunder-sgl/{__version__}\r\n"


class UpstreamConnectError(ConnectionError):
    """The exchange failed before the worker's status line arrived."""


class UpstreamBodyError(Exception):
    """The worker's answer broke after its status line (reset, closed early, bad framing)."""


@dataclass(frozen=True)
class Origin:
    scheme: str
    host: str
    port: int
    host_header: str
    prefix: str

    @classmethod
    def parse(cls, url: str) -> Origin:
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"worker URL {url!r}: expected http://host[:port][/prefix]")
        port = u.port or (443 if u.scheme == "https" else 80)
        host = f"[{u.hostname}]" if ":" in u.hostname else u.hostname
        return cls(u.scheme, u.hostname, port, f"{host}:{port}", u.path.rstrip("/"))


class _Conn(asyncio.Protocol):
    """One connection and the parse of the response now being read on it."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.resp: Response | None = None
        self.parser = httptools.HttpResponseParser(self)

    # ---- asyncio.Protocol -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        r = self.resp
        if r is None:  # bytes on an idle connection: nothing sane can follow on it
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            r._fail(f"unparseable answer from the worker: {e}")
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        r = self.resp
        if r is not None and not r._complete:
            if r._headers_done and r._until_eof:
                r._finish()  # a body delimited by the end of the connection
            else:
                r._fail(f"the worker closed the connection{f' ({exc})' if exc else ''}")

    # ---- httptools callbacks ----------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        r = self.resp
        assert r is not None
        r._raw_headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        r = self.resp
        assert r is not None
        r.status = self.parser.get_status_code()
        names = {k for k, _ in r._raw_headers}
        r._until_eof = b"content-length" not in names and b"transfer-encoding" not in names
        r._headers_done = True
        r._wake()

    def on_body(self, body: bytes) -> None:
        r = self.resp
        assert r is not None
        r._feed(body)

    def on_message_complete(self) -> None:
        r = self.resp
        assert r is not None
        r._keep = self.parser.should_keep_alive()
        r._finish()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Response:
    """The worker's answer: ``status`` and ``content_type`` once returned by ``Pool.post``, then the
    body, with ``read()`` (whole) or ``iter_any()`` (as it arrives). ``release()`` gives the
    connection back to the pool if the answer was read to its end, else closes it;
    ``close()`` always closes it."""

    def __init__(self, pool: Pool, origin: Origin, conn: _Conn) -> None:
        self._pool = pool
        self._origin = origin
        self._conn: _Conn | None = conn
        self.status = 0
        self._raw_headers: list[tuple[bytes, bytes]] = []
        self._headers_done = False
        self._until_eof = False
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._paused = False
        self._streaming = False  # set by iter_any: only a reader taking chunks pauses the socket
        self._waiter: asyncio.Future[None] | None = None
        self._complete = False
        self._keep = False
        self._error: str | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timed_out = False
        self._grace: Callable[[], float] | None = None

    # ---- what the proxy reads ---------------------------------------------------------
    @property
    def content_type(self) -> str:
        for k, v in self._raw_headers:
            if k == b"content-type":
                return v.decode("latin-1").split(";", 1)[0].strip()
        return "application/octet-stream"

    async def read(self) -> bytes:
        while not self._complete:  # a failure completes it too
            await self._wait()
        self._raise_error()
        data = b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        return data

    async def iter_any(self) -> AsyncIterator[bytes]:
        self._streaming = True
        while True:
            if self._chunks:
                data = b"".join(self._chunks)
                self._chunks.clear()
                self._buffered = 0
                if self._paused and self._conn is not None and self._conn.transport is not None:
                    self._paused = False
                    self._conn.transport.resume_reading()
                yield data
                continue
            if self._complete:
                self._raise_error()
                return
            await self._wait()

    def release(self) -> None:
        conn, self._conn = self._conn, None
        self._cancel_timer()
        if conn is None:
            return
        conn.resp = None
        if self._complete and self._error is None and self._keep and not conn.closed:
            self._pool._put(self._origin, conn)
        else:
            conn.close()

    def close(self) -> None:
        conn, self._conn = self._conn, None
        self._cancel_timer()
        if conn is not None:
            conn.resp = None
            conn.close()

    # ---- fed by the connection --------------------------------------------------------
    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._streaming and self._buffered > HIGH_WATER and not self._paused and self._conn is not None and self._conn.transport is not None:
            self._paused = True
            self._conn.transport.pause_reading()
        self._wake()

    def _finish(self) -> None:
        self._complete = True
        self._cancel_timer()
        self._wake()

    def _fail(self, message: str) -> None:
        if self._error is None:
            self._error = message
        self._complete = True
        self._cancel_timer()
        self._wake()

    def _on_timeout(self) -> None:
        self._timer = None
        if self._grace is not None and not self._complete:
            more = self._grace()
            if more > 0:
                self._timer = asyncio.get_running_loop().call_later(more, self._on_timeout)
                return
        self._timed_out = True
        self._fail("timed out")
        if self._conn is not None:
            self._conn.close()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _raise_error(self) -> None:
        if self._error is None:
            return
        if self._timed_out:
            raise TimeoutError(f"the worker's answer timed out ({self._origin.host_header})")
        if not self._headers_done:
            raise UpstreamConnectError(self._error)
        raise UpstreamBodyError(self._error)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class Pool:
    """Keep-alive connections to the workers, per origin."""

    def __init__(self, keepalive: float = 4.0, connect_timeout: float = 5.0) -> None:
        self.keepalive = keepalive
        self.connect_timeout = connect_timeout
        self._idle: dict[Origin, list[_Conn]] = {}
        self._origins: dict[str, Origin] = {}
        self._ssl: ssl.SSLContext | None = None
        self._swept = time.monotonic()
        self._closed = False

    def origin(self, base_url: str) -> Origin:
        o = self._origins.get(base_url)
        if o is None:
            o = self._origins[base_url] = Origin.parse(base_url)
        return o

    async def post(self, base_url: str, path: str, body: bytes, headers: Mapping[str, str],
                   total: float | None = None, grace: Callable[[], float] | None = None) -> Response:
        """POST ``body`` to ``base_url + path``; returns once the status line and headers are
        in. ``total`` bounds the whole exchange, the body's read included; when it runs out,
        ``grace()`` seconds more are given while it grants any."""
        if self._closed:
            raise UpstreamConnectError("the router is shutting down")
        o = self.origin(base_url)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + total if total else None
        conn = self._take(o)
        if conn is None:
            conn = await self._connect(o, deadline)
        r = Response(self, o, conn)
        r._grace = grace
        conn.resp = r
        if deadline is not None:
            r._timer = loop.call_at(deadline, r._on_timeout)
        head = [f"POST {o.prefix}{path} HTTP/1.1\r\nHost: {o.host_header}\r\n{_USER_AGENT}Content-Length: {len(body)}\r\n"]
        for k, v in headers.items():
            head.append(f"{k}: {v}\r\n")
        head.append("\r\n")
        assert conn.transport is not None
        conn.transport.write("".join(head).encode("latin-1") + body)
        try:
            while not r._headers_done:
                r._raise_error()
                await r._wait()
        except BaseException:
            r.close()
            raise
        return r

    async def _connect(self, o: Origin, deadline: float | None) -> _Conn:
        loop = asyncio.get_running_loop()
        timeout = self.connect_timeout
        if deadline is not None:
            timeout = min(timeout, max(0.0, deadline - loop.time()))
        ctx = None
        if o.scheme == "https":
            ctx = self._ssl = self._ssl or ssl.create_default_context()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(_Conn, o.host, o.port, ssl=ctx), timeout)
        except TimeoutError:
            raise TimeoutError(f"connecting to {o.host_header} timed out after {timeout:.1f}s") from None
        except OSError as e:
            raise UpstreamConnectError(f"cannot connect to {o.host_header}: {e}") from None
        return conn

    def _take(self, o: Origin) -> _Conn | None:
        idle = self._idle.get(o)
        if not idle:
            return None
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self.keepalive:
                return conn
            conn.close()
        return None

    def _put(self, o: Origin, conn: _Conn) -> None:
        if self._closed:
            conn.close()
            return
        now = time.monotonic()
        conn.idle_since = now
        self._idle.setdefault(o, []).append(conn)
        if now - self._swept > self.keepalive:
            self._sweep(now)

    def _sweep(self, now: float) -> None:
        """Close the connections idle past ``keepalive`` (the oldest are at the front)."""
        self._swept = now
        for idle in self._idle.values():
            stale = 0
            while stale < len(idle) and (idle[stale].closed or now - idle[stale].idle_since >= self.keepalive):
                idle[stale].close()
                stale += 1
            del idle[:stale]

    def idle_connections(self) -> int:
        return sum(len(v) for v in self._idle.values())

    def close(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
