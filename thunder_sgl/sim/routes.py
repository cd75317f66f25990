"""Route handlers of the simulated worker (sglang-surface.md §1.1).

Inference routes parse with ``protocol``, submit to the worker and either wait for the
completion or stream one SSE event per generated token as the virtual clock reaches it. A
client that disconnects aborts its request, as SGLang does: quietly (no error logged, whether
aiohttp cancels the handler or a write finds the connection closing) and counted in
``sim:client_disconnects_total``.
"""

from __future__ import annotations

import asyncio
import codecs
import dataclasses
import os
import time
import uuid
from typing import Any

from aiohttp import web

from thunder_sgl.errors import ConfigError
from thunder_sgl.sim import protocol as P
from thunder_sgl.sim.exposition import front_end_text
from thunder_sgl.sim.request import SimRequest, SimRequestError
from thunder_sgl.sim.server import SIM, Pending, SimServer, error_response, json_response
from thunder_sgl.sim.tokenizer import EOS, Tokenizer


async def _body(request: web.Request) -> Any:
    return P.loads_json(await request.read())


def _to_sim(p: P.Parsed) -> SimRequest:
    return SimRequest(p.rid, p.input_ids, p.max_new_tokens, p.dp_rank, p.routing_key, p.ignore_eos,
                      session_id=p.session_id, sampled=p.sampled)


async def _infer(request: web.Request, kind: str) -> web.StreamResponse:
    srv = request.app[SIM]
    w, cfg = srv.worker, srv.worker.cfg
    try:
        body = await _body(request)
        if not isinstance(body, dict):
            raise SimRequestError("the body must be a JSON object")
        h = request.headers
        if kind == "chat":
            parsed = P.parse_chat(body, h, cfg, w.template, uuid.uuid4().hex)
        elif kind == "completions":
            parsed = P.parse_completions(body, h, cfg, w.tokenizer, uuid.uuid4().hex)
        else:
            parsed = P.parse_generate(body, h, cfg, w.tokenizer, uuid.uuid4().hex)
    except SimRequestError as e:
        return error_response(str(e), e.status)
    await srv.admitted()  # generation paused, weights loading or memory released: wait, as SGLang
    parsed.weight_version = w.weight_version
    try:
        pend = srv.submit(_to_sim(parsed), parsed.stream)
    except SimRequestError as e:
        return error_response(str(e), e.status)
    try:
        if parsed.stream:
            return await _stream(request, srv, parsed, pend)
        while pend.event is None:
            await pend.wait()
        ev = pend.event
        text = w.tokenizer.decode(ev.output_ids)
        build = {"chat": P.chat_response, "completions": P.completions_response, "generate": P.generate_response}[kind]
        return json_response(build(parsed, ev, text, cfg))
    except asyncio.CancelledError:  # the client left (aiohttp cancels its handler)
        srv.client_left(parsed.rid)
        raise


async def _stream(request: web.Request, srv: SimServer, p: P.Parsed, pend: Pending) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    try:
        return await _stream_events(request, srv, p, pend, resp)
    except ConnectionError:  # a write found the client gone (before aiohttp cancelled the handler)
        srv.client_left(p.rid)
        return resp  # aiohttp's end of the response meets the closed connection quietly


async def _stream_events(request: web.Request, srv: SimServer, p: P.Parsed, pend: Pending,
                         resp: web.StreamResponse) -> web.StreamResponse:
    w, cfg = srv.worker, srv.worker.cfg
    await resp.prepare(request)
    die = w.faults.take_die_mid_stream(len(pend.answer))
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    tb = Tokenizer.token_bytes
    sent = 0
    text_so_far: list[str] = []
    # The answer taken at submission, never a lookup in the engine: the request may already
    # have left its table (see ``Pending``). Counts are bounded by it, so no read goes past it.
    ids = pend.answer
    while True:
        ev = pend.event
        visible = min(ev.completion_tokens if ev is not None else pend.visible, len(ids))
        if visible > sent:
            chunks: list[bytes] = []
            for i in range(sent, visible):
                if die is not None and i >= die[0]:
                    await resp.write(b"".join(chunks))
                    return await _die(request, srv, p.rid, die[1], resp)
                piece = decoder.decode(tb(ids[i]))
                if p.kind == "generate":
                    text_so_far.append(piece)
                    chunks.append(P.sse({"text": "".join(text_so_far), "output_ids": list(ids[: i + 1]),
                                         "meta_info": P.generate_meta(p, None, i + 1, cfg)}))
                else:
                    chunks.append(P.sse(P.stream_delta(p, piece, cfg, first=(i == 0))))
            sent = visible
            await resp.write(b"".join(chunks))
        if ev is not None:
            break
        await pend.wait()
    if p.kind == "generate":
        final = {"text": "".join(text_so_far), "output_ids": list(ev.output_ids), "meta_info": P.generate_meta(p, ev, ev.completion_tokens, cfg)}
        await resp.write(P.sse(final) + P.SSE_DONE)
    else:
        await resp.write(b"".join(P.sse(c) for c in P.stream_final(p, ev, cfg)) + P.SSE_DONE)
    await resp.write_eof()
    return resp


async def _die(request: web.Request, srv: SimServer, rid: str, mode: str, resp: web.StreamResponse) -> web.StreamResponse:
    if mode == "exit":  # a real crash: no cleanup, no goodbye
        os._exit(1)
    srv.abort(rid)
    if request.transport is not None:
        request.transport.abort()
    return resp


async def chat(request: web.Request) -> web.StreamResponse:
    return await _infer(request, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _infer(request, "completions")


async def generate(request: web.Request) -> web.StreamResponse:
    return await _infer(request, "generate")


async def _generate_one_token(srv: SimServer) -> bool:
    rid = f"HEALTH_CHECK_{uuid.uuid4().hex}"
    pend = srv.submit(SimRequest(rid, [EOS], 1), stream=False)
    try:
        while pend.event is None:
            await pend.wait()
    except asyncio.CancelledError:
        srv.abort(rid)
        raise
    return pend.event.finish_reason != "abort"


async def health(request: web.Request) -> web.Response:
    srv = request.app[SIM]
    if srv.worker.cfg.http.health_generates and not await _generate_one_token(srv):
        return web.Response(status=503)
    return web.Response(status=200)


async def health_generate(request: web.Request) -> web.Response:
    ok = await _generate_one_token(request.app[SIM])
    return web.Response(status=200 if ok else 503)


async def ready(request: web.Request) -> web.Response:
    """SGLang 0.5.23's ``/ready``: 503 while generation is paused (``is_pause``; weight
    loads and released memory do not count there), else 200."""
    if request.app[SIM].worker.paused is not None:
        return json_response({"status": "paused"}, status=503)
    return json_response({"status": "ready"})


async def server_info(request: web.Request) -> web.Response:
    srv = request.app[SIM]
    srv.sync()
    return json_response(srv.worker.server_info())


async def model_info(request: web.Request) -> web.Response:
    return json_response(request.app[SIM].worker.model_info())


async def models(request: web.Request) -> web.Response:
    m = request.app[SIM].worker.cfg.model
    card = {"id": m.name, "object": "model", "created": int(time.time()), "owned_by": "sglang", "root": m.model_path, "max_model_len": m.context_length}
    return json_response({"object": "list", "data": [card]})


async def loads(request: web.Request) -> web.Response:
    srv = request.app[SIM]
    srv.sync()
    q = request.query
    include = {x.strip() for x in q.get("include", "core").split(",") if x.strip()}
    rank = None
    if q.get("dp_rank"):
        try:
            rank = int(q["dp_rank"])
        except ValueError:
            return error_response("dp_rank must be an integer", 400)
    data = srv.worker.loads(include, rank)
    if q.get("format") == "prometheus":
        lines = []
        for e in data["loads"]:
            for k, v in e.items():
                if isinstance(v, (int, float)) and k != "dp_rank":
                    lines.append(f'sglang:load_{k}{{dp_rank="{e["dp_rank"]}"}} {float(v)!r}')
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")
    return json_response(data)


async def metrics(request: web.Request) -> web.Response:
    srv = request.app[SIM]
    srv.sync()
    text = srv.worker.metrics_text() + front_end_text(srv.worker.cfg, srv.client_disconnects)
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


async def flush_cache(request: web.Request) -> web.Response:
    srv = request.app[SIM]
    try:  # SGLang's ?timeout=: seconds to wait for the worker to go idle (0: refuse at once if busy)
        timeout = float(request.query.get("timeout", "0"))
    except ValueError:
        timeout = -1.0
    if not timeout >= 0:
        return error_response("timeout: Input should be a number greater than or equal to 0", 422)
    deadline = time.monotonic() + timeout
    srv.sync()
    while not srv.worker.flush_cache():
        if time.monotonic() >= deadline:
            text = "Timed out waiting for idle state." if timeout else "Cache not flushed. Please check the queue or running requests."
            return web.Response(status=400, text=text)
        await asyncio.sleep(0.01)
        srv.sync()
    return web.Response(text="Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n")


async def abort_request(request: web.Request) -> web.Response:
    srv = request.app[SIM]
    try:
        body = await _body(request)
    except SimRequestError as e:
        return error_response(str(e), 400)
    body = body if isinstance(body, dict) else {}
    if body.get("abort_all"):
        srv.worker.abort_all(srv.clock.now())
    elif isinstance(body.get("rid"), str):
        srv.worker.abort(body["rid"], srv.clock.now())
    srv.kick()
    return web.Response(status=200)


async def close_session(request: web.Request) -> web.Response:
    """``{"session_id": ...}``: drop the session's references to its KV (SGLang answers 200
    with an empty body, whether or not the session held any)."""
    srv = request.app[SIM]
    try:
        body = await _body(request)
    except SimRequestError as e:
        return error_response(str(e), 400)
    sid = body.get("session_id") if isinstance(body, dict) else None
    if not isinstance(sid, str) or not sid:
        return error_response("session_id must be a non-empty string", 400)
    srv.worker.close_session(sid)
    return web.Response(status=200)


async def get_faults(request: web.Request) -> web.Response:
    return json_response(request.app[SIM].worker.faults.state.to_dict())


async def post_faults(request: web.Request) -> web.Response:
    srv = request.app[SIM]
    try:
        body = await _body(request)
        if not isinstance(body, dict):
            raise ConfigError("the body must be a JSON object of fault fields")
        srv.worker.faults.state.update(body)
    except (ConfigError, SimRequestError) as e:
        return error_response(str(e), 400)
    return json_response(srv.worker.faults.state.to_dict())


async def sim_state(request: web.Request) -> web.Response:
    srv = request.app[SIM]
    srv.sync()
    ranks = [dataclasses.asdict(s) for s in srv.worker.stats()]
    w = srv.worker
    return json_response({"worker_id": w.worker_id, "config": w.cfg.name, "ranks": ranks,
                          "weight_groups": w.weight_groups, "lora_adapters": w.lora_adapters,
                          "weight_version": w.weight_version, "weight_updates": w.weight_updates})


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/health", health)
    r.add_get("/health_generate", health_generate)
    r.add_get("/ready", ready)
    for path in ("/server_info", "/get_server_info"):
        r.add_get(path, server_info)
    for path in ("/model_info", "/get_model_info"):
        r.add_get(path, model_info)
    r.add_get("/v1/models", models)
    r.add_post("/generate", generate)
    r.add_post("/v1/chat/completions", chat)
    r.add_post("/v1/completions", completions)
    r.add_get("/v1/loads", loads)
    r.add_get("/metrics", metrics)
    r.add_get("/flush_cache", flush_cache)
    r.add_post("/flush_cache", flush_cache)
    r.add_post("/abort_request", abort_request)
    r.add_post("/close_session", close_session)
    from thunder_sgl.sim.routes_control import add_control_routes

    add_control_routes(r)
    r.add_get("/sim/faults", get_faults)
    r.add_post("/sim/faults", post_faults)
    r.add_get("/sim/state", sim_state)

