"""The server's write coalescing: a response's head leaves with what follows it in the same
turn of the event loop, other writes at once, and nothing is lost at close."""

from __future__ import annotations

import asyncio

import aiohttp

from thunder_sgl.gateway.serving import CoalescingTransport


class Recorder:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        assert not self.closing
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


async def test_a_head_and_its_body_written_in_one_turn_leave_in_one_write():
    raw = Recorder()
    t = CoalescingTransport(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
    t.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    t.write(b"{}")
    assert raw.writes == [] and t.get_write_buffer_size() == 40
    await asyncio.sleep(0)
    assert raw.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]


async def test_stream_chunks_go_at_once_and_in_order():
    raw = Recorder()
    t = CoalescingTransport(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
    t.write(b"HTTP/1.1 200 OK\r\n\r\n")
    await asyncio.sleep(0)
    t.write(b"5\r\ndata1\r\n")
    assert raw.writes[-1] == b"5\r\ndata1\r\n"  # not held for the end of the turn
    t.write(b"HTTP/1.1 200 OK\r\n\r\n")  # the next response on the connection
    t.write(b"x")
    t.write(b"y")
    await asyncio.sleep(0)
    assert raw.writes == [b"HTTP/1.1 200 OK\r\n\r\n", b"5\r\ndata1\r\n", b"HTTP/1.1 200 OK\r\n\r\nxy"]
    assert t.get_extra_info("peername") == "info:peername"


async def test_close_sends_what_is_held_and_a_closed_transport_gets_nothing():
    raw = Recorder()
    t = CoalescingTransport(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
    t.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    t.close()
    assert raw.writes == [b"HTTP/1.1 400 Bad Request\r\n\r\n"] and raw.closing
    await asyncio.sleep(0)  # the scheduled flush finds nothing
    raw2 = Recorder()
    t2 = CoalescingTransport(raw2, asyncio.get_running_loop())  # type: ignore[arg-type]
    t2.write(b"HTTP/1.1 200 OK\r\n\r\n")
    raw2.closing = True  # the peer went away before the end of the turn
    await asyncio.sleep(0)
    assert raw2.writes == []


async def test_uvicorn_serves_through_the_coalescing_protocol():
    """uvicorn with the protocol class: keep-alive answers, one after the other, whole."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from thunder_sgl.gateway.serving import CoalescingHttpToolsProtocol

    async def hello(request):  # noqa: ANN001, ANN202
        return JSONResponse({"n": int(request.query_params["n"])})

    app = Starlette(routes=[Route("/", hello)])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, http=CoalescingHttpToolsProtocol,
                                           log_level="warning", lifespan="off"))
    task = asyncio.ensure_future(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        async with aiohttp.ClientSession() as s:
            for n in range(20):
                async with s.get(f"http://127.0.0.1:{port}/?n={n}") as r:
                    assert r.status == 200 and await r.json() == {"n": n}
    finally:
        server.should_exit = True
        await task
