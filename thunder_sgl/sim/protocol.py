"""Request parsing and response bodies of the three inference routes, shaped as SGLang 0.5.23's.

Pure functions: ``parse_*`` turn a JSON body (and headers) into a ``Parsed`` request,
``*_response`` / ``*_chunk`` build the non-stream bodies and the SSE events of a stream.
Usage carries ``prompt_tokens_details.cached_tokens`` when cache reporting is on (SGLang's
``--enable-cache-report``) and ``sglext.cached_tokens_details`` when the request asks for
``return_cached_tokens_details``; ``/generate`` always reports ``meta_info.cached_tokens`` and,
with HiCache, ``cached_tokens_details`` split by device / host (/ storage).
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from thunder_sgl.sim.config import SimConfig
from thunder_sgl.sim.request import Completion, SimRequestError
from thunder_sgl.sim.tokenizer import ChatTemplate, Tokenizer


@dataclass(slots=True)
class Parsed:
    kind: str
    """chat | completions | generate"""
    rid: str
    input_ids: array
    max_new_tokens: int
    stream: bool
    include_usage: bool
    ignore_eos: bool
    dp_rank: int | None
    routing_key: str | None
    details: bool
    """Return per-tier cached token details (OpenAI routes)."""
    created: int
    session_id: str | None = None
    """Top-level ``session_id`` (SGLang 0.5.23: all three routes)."""
    weight_version: str = "default"
    """The worker's weight version when the request entered the engine."""
    sampled: bool = False
    """An explicit temperature > 0: the answer is drawn per request, not per prompt."""


def _sampled(params: Mapping[str, Any]) -> bool:
    t = params.get("temperature")
    return isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0


def _int(v: Any, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise SimRequestError(f"{name} must be an integer")
    return v


def _common(body: Mapping[str, Any], headers: Mapping[str, str], new_rid: str) -> tuple[str, int | None, str | None]:
    rid = body.get("rid") or headers.get("x-override-rid") or new_rid
    if not isinstance(rid, str):
        raise SimRequestError("rid must be a string (batched requests are not supported)")
    rank = body.get("routed_dp_rank", body.get("data_parallel_rank"))
    hdr = headers.get("x-data-parallel-rank") or headers.get("x-override-routed-dp-rank")
    if rank is None and hdr is not None:
        try:
            rank = int(hdr)
        except ValueError as e:
            raise SimRequestError("X-Data-Parallel-Rank must be an integer") from e
    if rank is not None:
        rank = _int(rank, "routed_dp_rank")
    return rid, rank, headers.get("x-smg-routing-key")


def _session(body: Mapping[str, Any]) -> str | None:
    sid = body.get("session_id")
    if sid is None:
        return None
    if not isinstance(sid, str) or not sid:
        raise SimRequestError("session_id must be a non-empty string")
    if body.get("session_params") is not None:
        raise SimRequestError("session_id and session_params cannot both be set.")
    return sid


def parse_chat(body: Mapping[str, Any], headers: Mapping[str, str], cfg: SimConfig, template: ChatTemplate, new_rid: str) -> Parsed:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise SimRequestError("messages must be a non-empty list")
    if body.get("n", 1) != 1:
        raise SimRequestError("only n=1 is supported")
    try:
        ids = template.render(msgs, body.get("tools"), add_generation_prompt=True)
    except ValueError as e:
        raise SimRequestError(str(e)) from e
    mt = body.get("max_completion_tokens", body.get("max_tokens"))
    rid, rank, key = _common(body, headers, new_rid)
    return Parsed(
        "chat", rid, ids, cfg.output.default_max_tokens_chat if mt is None else _int(mt, "max_tokens"),
        bool(body.get("stream", False)), _include_usage(body), bool(body.get("ignore_eos", False)),
        rank, key, bool(body.get("return_cached_tokens_details", False)), int(time.time()), _session(body),
        sampled=_sampled(body),
    )


def parse_completions(body: Mapping[str, Any], headers: Mapping[str, str], cfg: SimConfig, tok: Tokenizer, new_rid: str) -> Parsed:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = tok.encode(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = array("I", prompt)
    else:
        raise SimRequestError("prompt must be a string or a list of token ids (batches are not supported)")
    if body.get("n", 1) != 1:
        raise SimRequestError("only n=1 is supported")
    mt = body.get("max_tokens")
    rid, rank, key = _common(body, headers, new_rid)
    return Parsed(
        "completions", rid, ids, cfg.output.default_max_tokens_completions if mt is None else _int(mt, "max_tokens"),
        bool(body.get("stream", False)), _include_usage(body), bool(body.get("ignore_eos", False)),
        rank, key, bool(body.get("return_cached_tokens_details", False)), int(time.time()), _session(body),
        sampled=_sampled(body),
    )


def parse_generate(body: Mapping[str, Any], headers: Mapping[str, str], cfg: SimConfig, tok: Tokenizer, new_rid: str) -> Parsed:
    text, input_ids = body.get("text"), body.get("input_ids")
    if isinstance(text, str):
        ids = tok.encode(text)
    elif isinstance(input_ids, list) and input_ids and all(isinstance(t, int) and not isinstance(t, bool) for t in input_ids):
        ids = array("I", input_ids)
    else:
        raise SimRequestError("give text (a string) or input_ids (a list of ints); batches are not supported")
    sp = body.get("sampling_params") or {}
    if not isinstance(sp, dict):
        raise SimRequestError("sampling_params must be an object")
    mt = sp.get("max_new_tokens")
    rid, rank, key = _common(body, headers, new_rid)
    return Parsed(
        "generate", rid, ids, cfg.output.default_max_new_tokens_generate if mt is None else _int(mt, "max_new_tokens"),
        bool(body.get("stream", False)), False, bool(sp.get("ignore_eos", False)),
        rank, key, True, int(time.time()), _session(body), sampled=_sampled(sp),
    )


def _include_usage(body: Mapping[str, Any]) -> bool:
    so = body.get("stream_options")
    return isinstance(so, dict) and bool(so.get("include_usage"))


def _details(ev: Completion, cfg: SimConfig) -> dict[str, int]:
    d = {"device": ev.cached_device, "host": ev.cached_host}
    if cfg.hicache.storage_backend is not None:
        d["storage"] = ev.cached_storage
    return d


def usage(ev: Completion, cfg: SimConfig) -> dict[str, Any]:
    u: dict[str, Any] = {
        "prompt_tokens": ev.prompt_tokens,
        "completion_tokens": ev.completion_tokens,
        "total_tokens": ev.prompt_tokens + ev.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": ev.cached_tokens} if cfg.server.enable_cache_report else None,
    }
    return u


def finish_reason(ev: Completion) -> str:
    return ev.finish_reason


def weight_metadata(p: Parsed, completion_tokens: int) -> dict[str, Any]:
    """SGLang 0.5.23's ``metadata`` of an OpenAI answer (and the same two keys of ``/generate``'s
    ``meta_info``): the weight version, and the spans of the output each version produced
    (``sglang.srt.utils.weight_versions``); here one span, the version at the request's entry."""
    return {"weight_version": p.weight_version,
            "weight_versions": [{"version": p.weight_version, "start": 0, "end": completion_tokens}]}


def chat_response(p: Parsed, ev: Completion, text: str, cfg: SimConfig) -> dict[str, Any]:
    out = {
        "id": p.rid,
        "object": "chat.completion",
        "created": p.created,
        "model": cfg.model.name,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": None},
            "logprobs": None,
            "finish_reason": finish_reason(ev),
            "matched_stop": None,
        }],
        "usage": usage(ev, cfg),
        "metadata": weight_metadata(p, ev.completion_tokens),
    }
    if p.details:
        out["sglext"] = {"cached_tokens_details": _details(ev, cfg)}
    return out


def completions_response(p: Parsed, ev: Completion, text: str, cfg: SimConfig) -> dict[str, Any]:
    out = {
        "id": p.rid,
        "object": "text_completion",
        "created": p.created,
        "model": cfg.model.name,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason(ev), "matched_stop": None}],
        "usage": usage(ev, cfg),
        "metadata": weight_metadata(p, ev.completion_tokens),
    }
    if p.details:
        out["sglext"] = {"cached_tokens_details": _details(ev, cfg)}
    return out


def generate_meta(p: Parsed, ev: Completion | None, completion_tokens: int, cfg: SimConfig) -> dict[str, Any]:
    meta: dict[str, Any] = {"id": p.rid, "finish_reason": None, "prompt_tokens": len(p.input_ids),
                            **weight_metadata(p, completion_tokens), "completion_tokens": completion_tokens}
    if ev is not None:
        if ev.finish_reason == "length":
            meta["finish_reason"] = {"type": "length", "length": ev.completion_tokens}
        elif ev.finish_reason == "stop":
            meta["finish_reason"] = {"type": "stop", "matched": 3}
        else:
            meta["finish_reason"] = {"type": "abort", "message": ev.error or "Abort request"}
        meta["cached_tokens"] = ev.cached_tokens
        if cfg.hicache.enabled:
            meta["cached_tokens_details"] = _details(ev, cfg)
        meta["e2e_latency"] = ev.latency
    return meta


def generate_response(p: Parsed, ev: Completion, text: str, cfg: SimConfig) -> dict[str, Any]:
    return {"text": text, "output_ids": list(ev.output_ids), "meta_info": generate_meta(p, ev, ev.completion_tokens, cfg)}


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def stream_delta(p: Parsed, text: str, cfg: SimConfig, first: bool = False) -> dict[str, Any]:
    """One content chunk of an OpenAI stream."""
    if p.kind == "chat":
        delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None}
        obj = "text_completion"
    return {"id": p.rid, "object": obj, "created": p.created, "model": cfg.model.name, "choices": [choice]}


def stream_final(p: Parsed, ev: Completion, cfg: SimConfig) -> list[dict[str, Any]]:
    """The finish chunk, then the ``sglext`` chunk when the details were asked, then the usage
    chunk when include_usage was asked (tests/data/sglang-0.5.23-cpu-hicache-chat-stream.sse)."""
    fin = stream_delta(p, "", cfg)
    choice = fin["choices"][0]
    choice["finish_reason"] = finish_reason(ev)
    choice["matched_stop"] = None
    if p.kind == "chat":
        choice["delta"] = {}
    out = [fin]
    if p.details:  # SGLang 0.5.23 sends the per-tier split in a chunk of its own, asked usage or not
        x = stream_delta(p, "", cfg)
        x["choices"] = []
        x["usage"] = None
        x["sglext"] = {"cached_tokens_details": _details(ev, cfg)}
        out.append(x)
    if p.include_usage:
        u = stream_delta(p, "", cfg)
        u["choices"] = []
        u["usage"] = usage(ev, cfg)
        out.append(u)
    return out


def error_body(message: str, status: int, kind: str = "BadRequestError") -> dict[str, Any]:
    """SGLang's ErrorResponse (OpenAI routes) — also accepted by /generate clients."""
    return {"object": "error", "message": message, "type": kind, "param": None, "code": status}


def loads_json(obj: Any) -> Any:
    try:
        return orjson.loads(obj)
    except orjson.JSONDecodeError as e:
        raise SimRequestError(f"invalid JSON body: {e}") from e
