"""Pure extraction of token usage from worker responses, and the SSE usage tap.

OpenAI routes report ``usage.prompt_tokens``, ``usage.completion_tokens`` and, with
``--enable-cache-report``, ``usage.prompt_tokens_details.cached_tokens`` (per-tier detail under
``sglext.cached_tokens_details`` when asked). ``/generate`` reports ``meta_info.prompt_tokens``,
``completion_tokens``, ``cached_tokens`` and ``cached_tokens_details{device, host, storage}``.
Both say the engine's weight version (``metadata.weight_version``, ``meta_info.weight_version``).
"""

from __future__ import annotations

from typing import Any

import orjson

from thunder_sgl.control.conversations import StreamAnswer
from thunder_sgl.programs import Usage


def _int(v: Any) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


def _tiers(details: Any) -> tuple[int, int]:
    if not isinstance(details, dict):
        return 0, 0
    return _int(details.get("host")), _int(details.get("storage"))


def usage_from_openai(obj: Any) -> Usage | None:
    if not isinstance(obj, dict):
        return None
    u = obj.get("usage")
    if not isinstance(u, dict) or "prompt_tokens" not in u:
        return None
    details = u.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
    sglext = obj.get("sglext")
    host, storage = _tiers(sglext.get("cached_tokens_details") if isinstance(sglext, dict) else None)
    meta = obj.get("metadata")
    return Usage(_int(u.get("prompt_tokens")), _int(u.get("completion_tokens")), cached, host, storage,
                 _version(meta.get("weight_version") if isinstance(meta, dict) else None))


def _version(v: Any) -> str | None:
    return v if isinstance(v, str) and v else None


def usage_from_generate(obj: Any) -> Usage | None:
    if isinstance(obj, list):
        obj = obj[0] if obj else None
    if not isinstance(obj, dict):
        return None
    m = obj.get("meta_info")
    if not isinstance(m, dict) or "prompt_tokens" not in m:
        return None
    host, storage = _tiers(m.get("cached_tokens_details"))
    return Usage(_int(m.get("prompt_tokens")), _int(m.get("completion_tokens")), _int(m.get("cached_tokens")), host, storage,
                 _version(m.get("weight_version")))


def usage_from_body(route: str, body: bytes) -> Usage | None:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return usage_from_generate(obj) if route == "generate" else usage_from_openai(obj)


class SSETap:
    """Passes an SSE stream through while reading usage from it.

    OpenAI routes: the router always asks the worker for the usage chunk; when the client did
    not ask for it, that chunk (``choices: []`` + ``usage``) is dropped, and a ``usage`` field
    riding on a content chunk is removed. ``/generate``: every chunk carries cumulative
    ``meta_info``; the last one holds the final counts. Chunk boundaries need not align with
    events: incomplete events are buffered. ``collect``: also assemble the answer's assistant
    message (``answer``; every event is parsed then), for a program inferred from its messages.
    """

    def __init__(self, route: str, client_wants_usage: bool, collect: bool = False, drop_tiers: bool = False) -> None:
        self.route = route
        self.keep_usage = client_wants_usage or route == "generate"
        self.drop_tiers = drop_tiers
        """The router asked for ``return_cached_tokens_details``, the client did not: SGLang's
        ``sglext`` chunk (``choices: []``, ``usage: null``) is read and not passed on."""
        self._tiers: tuple[int, int] | None = None
        self.answer = StreamAnswer() if collect and route in ("chat", "completions") else None
        self.usage: Usage | None = None
        self.done = False
        self.tokens_seen = False
        self._buf = b""

    def feed(self, chunk: bytes) -> bytes:
        buf = self._buf + chunk if self._buf else chunk
        cut = buf.rfind(b"\n\n")
        if cut < 0:
            self._buf = buf
            return b""
        head, self._buf = buf[:cut], buf[cut + 2:]
        if self.route != "generate" and b'"usage"' not in head and b"[DONE]" not in head and self.answer is None:
            # content chunks only (most of a stream): passed through as they are, unparsed
            self.tokens_seen = self.tokens_seen or b"data:" in head
            return head + b"\n\n"
        out = []
        for event in head.split(b"\n\n"):
            kept = self._event(event)
            if kept is not None:
                out.append(kept + b"\n\n")
        return b"".join(out)

    def flush(self) -> bytes:
        rest, self._buf = self._buf, b""
        if not rest.strip():
            return b""
        kept = self._event(rest)
        return kept if kept is not None else b""

    def _event(self, event: bytes) -> bytes | None:
        data = event.strip()
        if not data.startswith(b"data:"):
            return event
        payload = data[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return event
        self.tokens_seen = True
        if self.route == "generate":
            if b'"meta_info"' in payload:
                try:
                    u = usage_from_generate(orjson.loads(payload))
                except orjson.JSONDecodeError:
                    u = None
                if u is not None:
                    self.usage = u
            return event
        if b'"usage"' not in payload and self.answer is None:
            return event
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return event
        if self.answer is not None:
            self.answer.feed(obj)
            if b'"usage"' not in payload:
                return event
        u = usage_from_openai(obj)
        if u is not None:
            self.usage = u
        ext = obj.get("sglext")
        if isinstance(ext, dict):  # SGLang streams the per-tier split in a chunk of its own
            self._tiers = _tiers(ext.get("cached_tokens_details"))
        if self._tiers is not None and self.usage is not None:
            self.usage.cached_host_tokens, self.usage.cached_storage_tokens = self._tiers
        if self.drop_tiers and ext is not None:
            if not obj.get("choices") and obj.get("usage") is None:
                return None
            obj.pop("sglext")
            if self.keep_usage or obj.get("usage") is None:
                return b"data: " + orjson.dumps(obj)
        if self.keep_usage or obj.get("usage") is None:
            return event
        if not obj.get("choices"):
            return None  # the usage-only chunk the client did not ask for
        obj.pop("usage", None)
        return b"data: " + orjson.dumps(obj)
