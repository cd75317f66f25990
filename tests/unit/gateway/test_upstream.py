"""The inference path's HTTP client: framing, keep-alive reuse, errors before and after the
status line, timeouts, back pressure. Each test runs a raw asyncio server on port 0 that
answers exactly the bytes the case needs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from thunder_sgl.gateway import upstream
from thunder_sgl.gateway.upstream import Origin, Pool, UpstreamBodyError, UpstreamConnectError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    headers = {}
    for line in lines[1:]:
        if line:
            k, _, v = line.partition(b":")
            headers[k.strip().lower()] = v.strip()
    body = await reader.readexactly(int(headers.get(b"content-length", b"0")))
    return lines[0], headers, body


@contextlib.asynccontextmanager
async def serve(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A server on a free port; yields its URL and a list with one entry per connection."""
    conns: list[int] = []

    async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conns.append(1)
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", conns
    finally:
        server.close()


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body)


def replies_once(raw: bytes, hold: float = 0.0) -> Handler:
    """A handler that reads one request, writes ``raw``, keeps the connection ``hold`` seconds
    and closes it."""
    async def h(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        if raw:
            writer.write(raw)
            await writer.drain()
        await asyncio.sleep(hold)
    return h


async def echo_forever(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        line, headers, body = await read_request(reader)
        writer.write(ok(b'{"path": "' + line.split(b" ")[1] + b'", "got": ' + body + b"}"))
        await writer.drain()


def test_origin_parses_hosts_ports_and_prefixes():
    assert Origin.parse("http://10.0.0.1:30000") == Origin("http", "10.0.0.1", 30000, "10.0.0.1:30000", "")
    assert Origin.parse("http://w/api/").prefix == "/api" and Origin.parse("http://w/").port == 80
    assert Origin.parse("https://w").port == 443
    assert Origin.parse("http://[::1]:8000").host_header == "[::1]:8000"
    with pytest.raises(ValueError, match="expected http"):
        Origin.parse("unix:///tmp/sock")


async def test_keep_alive_connections_are_reused_and_bodies_read_whole():
    async with serve(echo_forever) as (url, conns):
        pool = Pool()
        for i in range(5):
            r = await pool.post(url, "/v1/chat/completions", b'{"n": %d}' % i, {"Content-Type": "application/json"})
            assert r.status == 200 and r.content_type == "application/json"
            assert await r.read() == b'{"path": "/v1/chat/completions", "got": {"n": %d}}' % i
            r.release()
        assert len(conns) == 1 and pool.idle_connections() == 1
        pool.close()


async def test_concurrent_requests_open_connections_and_the_pool_keeps_them():
    async with serve(echo_forever) as (url, conns):
        pool = Pool()

        async def one(i: int) -> bytes:
            r = await pool.post(url, "/x", b"%d" % i, {})
            try:
                return await r.read()
            finally:
                r.release()

        got = await asyncio.gather(*(one(i) for i in range(8)))
        assert got == [b'{"path": "/x", "got": %d}' % i for i in range(8)]
        assert len(conns) == 8 and pool.idle_connections() == 8
        await asyncio.gather(*(one(i) for i in range(8)))
        assert len(conns) == 8  # all reused
        pool.close()


async def test_a_prefix_in_the_worker_url_is_kept_and_headers_are_sent():
    seen: list[tuple[bytes, dict[bytes, bytes]]] = []

    async def h(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line, headers, _ = await read_request(reader)
        seen.append((line, headers))
        writer.write(ok(b"{}"))

    async with serve(h) as (url, _):
        pool = Pool()
        r = await pool.post(url + "/engine", "/generate", b"{}", {"X-SMG-Routing-Key": "p1", "Authorization": "Bearer k"})
        await r.read()
        r.release()
        line, headers = seen[0]
        assert line == b"POST /engine/generate HTTP/1.1"
        assert headers[b"x-smg-routing-key"] == b"p1" and headers[b"authorization"] == b"Bearer k"
        assert headers[b"host"] == url.removeprefix("http://").encode() and headers[b"content-length"] == b"2"
        assert headers[b"user-agent"].startswith(b"thunder-sgl/")
        pool.close()


async def test_chunked_streams_arrive_as_they_are_sent():
    gate = asyncio.Event()

    async def h(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(b"7\r\ndata: 1\r\n")
        await writer.drain()
        await gate.wait()
        writer.write(b"7\r\ndata: 2\r\n0\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    async with serve(h) as (url, conns):
        pool = Pool()
        r = await pool.post(url, "/s", b"{}", {})
        it = r.iter_any()
        assert await it.__anext__() == b"data: 1"  # before the rest exists
        gate.set()
        rest = [c async for c in it]
        assert b"".join(rest) == b"data: 2" and r.content_type == "text/event-stream"
        r.release()
        assert pool.idle_connections() == 1
        pool.close()


async def test_a_body_delimited_by_the_end_of_the_connection_is_whole_and_not_reused():
    async with serve(replies_once(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")) as (url, _):
        pool = Pool()
        r = await pool.post(url, "/x", b"", {})
        assert await r.read() == b"all of it"
        r.release()
        assert pool.idle_connections() == 0
        pool.close()


async def test_connection_refused_and_closed_before_the_status_line_are_connect_errors():
    async with serve(echo_forever) as (url, _):
        pass  # now closed: nothing listens there
    pool = Pool()
    with pytest.raises(UpstreamConnectError, match="cannot connect"):
        await pool.post(url, "/x", b"", {})

    async with serve(replies_once(b"")) as (url, _):  # reads the request, hangs up
        with pytest.raises(UpstreamConnectError, match="closed the connection"):
            await pool.post(url, "/x", b"", {})
    pool.close()


async def test_a_body_cut_short_is_a_body_error_read_whole_or_streamed():
    async with serve(replies_once(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")) as (url, _):
        pool = Pool()
        r = await pool.post(url, "/x", b"", {})
        with pytest.raises(UpstreamBodyError, match="closed the connection"):
            await r.read()
        r.release()
        r = await pool.post(url, "/x", b"", {})
        got = []
        with pytest.raises(UpstreamBodyError):
            async for c in r.iter_any():
                got.append(c)
        assert b"".join(got) == b"only this"
        r.close()
        assert pool.idle_connections() == 0
        pool.close()


async def test_garbage_instead_of_http_is_an_error_not_a_hang():
    async with serve(replies_once(b"SSH-2.0-OpenSSH\r\n\r\n", hold=5)) as (url, _):
        pool = Pool()
        with pytest.raises(UpstreamConnectError, match="unparseable"):
            await asyncio.wait_for(pool.post(url, "/x", b"", {}), 3)
        pool.close()


async def test_the_total_timeout_covers_the_wait_for_headers_and_the_body():
    slow_head = replies_once(b"", hold=5)
    slow_body = replies_once(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", hold=5)
    pool = Pool()
    async with serve(slow_head) as (url, _):
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(TimeoutError):
            await pool.post(url, "/x", b"", {}, total=0.3)
        assert loop.time() - t0 < 2
    async with serve(slow_body) as (url, _):
        r = await pool.post(url, "/x", b"", {}, total=0.3)
        with pytest.raises(TimeoutError):
            await r.read()
        r.release()
    assert pool.idle_connections() == 0
    pool.close()


async def test_grace_prolongs_the_total_timeout_while_it_grants_time():
    """A worker paused behind the router (``backends.pause``): the proxy's ``grace`` gives the
    time it was paused back to the request, and the request times out only once it gives none."""
    async def late(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(1.0)
        writer.write(ok(b"{}"))
        await writer.drain()
        await asyncio.sleep(1)

    grants = [0.2, 2.0]
    asked: list[float] = []

    def grace() -> float:
        asked.append(asyncio.get_running_loop().time())
        return grants.pop(0) if grants else 0.0

    pool = Pool()
    async with serve(late) as (url, _):
        r = await pool.post(url, "/x", b"", {}, total=0.3, grace=grace)  # 0.3 + 0.2 + 2 > 1
        assert await r.read() == b"{}"
        r.release()
        assert len(asked) == 2
    async with serve(late) as (url, _):
        grants[:] = [0.1]
        with pytest.raises(TimeoutError):  # 0.3 + 0.1 < 1
            await (await pool.post(url, "/x", b"", {}, total=0.3, grace=grace)).read()
    pool.close()


async def test_connections_the_worker_closed_or_idle_past_keepalive_are_not_reused():
    # the worker's keep-alive runs out 50 ms after its answer: it closes the idle connection
    async with serve(replies_once(ok(b"1"), hold=0.05)) as (url, conns):
        pool = Pool()
        for _ in range(3):
            r = await pool.post(url, "/x", b"", {})
            assert await r.read() == b"1"
            r.release()
            await asyncio.sleep(0.2)
        assert len(conns) == 3  # no request was sent on a closed connection
        pool.close()

    async with serve(echo_forever) as (url, conns):
        pool = Pool(keepalive=0.1)
        for _ in range(2):
            r = await pool.post(url, "/x", b"{}", {})
            await r.read()
            r.release()
            await asyncio.sleep(0.2)
        assert len(conns) == 2
        pool.close()


async def test_an_answer_left_unread_closes_its_connection():
    async def head_then_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.1)
            writer.write(b'{"path": ""}')
            await writer.drain()

    async with serve(head_then_body) as (url, conns):
        pool = Pool()
        r = await pool.post(url, "/x", b"{}", {})
        r.release()  # the body was not read: the connection cannot carry the next request
        r = await pool.post(url, "/x", b"{}", {})
        assert (await r.read()).startswith(b'{"path"')
        r.release()
        assert len(conns) == 2
        pool.close()


async def test_a_slow_reader_pauses_the_worker_socket(monkeypatch):
    monkeypatch.setattr(upstream, "HIGH_WATER", 64 * 1024)
    size = 4 * 1024 * 1024

    async def big(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % size)
        for _ in range(size // 65536):
            writer.write(b"x" * 65536)
            await writer.drain()

    async with serve(big) as (url, _):
        pool = Pool()
        r = await pool.post(url, "/x", b"", {})
        n, most = 0, 0
        async for c in r.iter_any():
            n += len(c)
            most = max(most, len(c))
            await asyncio.sleep(0.001)
        assert n == size
        assert most < 1024 * 1024  # never more than the high water mark and one socket read
        r.release()
        pool.close()


async def test_a_closed_pool_refuses_new_requests():
    pool = Pool()
    pool.close()
    with pytest.raises(UpstreamConnectError, match="shutting down"):
        await pool.post("http://127.0.0.1:9", "/x", b"", {})
