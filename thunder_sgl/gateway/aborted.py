"""The answer to a request aborted (``/abort_request``) while the router held it.

An engine answers a request aborted by ``/abort_request`` with a normal 200 body whose finish
reason is ``abort`` (SGLang 0.5.23, observed on a real CPU server); RL frameworks look for
exactly that. A request the router still holds — its program paused, or a weight-update
window open — never reached an engine, so the router answers in the same shape, with no
tokens generated and zero usage.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from starlette.responses import Response

from thunder_sgl.errors import ThunderError

MESSAGE = "Aborted by /abort_request while held by the router (never reached an engine)"


class RequestAborted(ThunderError):
    """Raised to a held request's waiter by ``/abort_request``; answered by ``aborted_response``."""

    status = 200
    type = "aborted"
    code = "request_aborted"


def aborted_body(route: str, rid: str, model: Any) -> dict[str, Any]:
    usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    if route == "generate":
        return {"text": "", "output_ids": [], "meta_info": {
            "id": rid, "finish_reason": {"type": "abort", "message": MESSAGE, "status_code": None, "err_type": None},
            "prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0}}
    base = {"id": rid, "created": int(time.time()), "model": model if isinstance(model, str) else "default"}
    if route == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": ""}, "logprobs": None,
                  "finish_reason": "abort", "matched_stop": None}
        return {**base, "object": "chat.completion", "choices": [choice], "usage": usage}
    choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": "abort", "matched_stop": None}
    return {**base, "object": "text_completion", "choices": [choice], "usage": usage}


def aborted_response(route: str, stream: bool, include_usage: bool, rid: str, model: Any) -> Response:
    body = aborted_body(route, rid, model)
    if not stream:
        return Response(orjson.dumps(body), media_type="application/json")
    if route == "generate":
        events = [body]
    else:
        chunk = {k: v for k, v in body.items() if k != "usage"}
        chunk["object"] = "chat.completion.chunk" if route == "chat" else "text_completion"
        c = dict(chunk["choices"][0])
        if route == "chat":
            c.pop("message")
            c["delta"] = {}
        chunk["choices"] = [c]
        events = [chunk]
        if include_usage:
            events.append({**chunk, "choices": [], "usage": body["usage"]})
    data = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    return Response(data, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
