"""Pure parsing of inference requests: validate, find the program id, size the prompt.

Takes the raw body bytes and headers of ``/v1/chat/completions``, ``/v1/completions`` or
``/generate``; returns an ``Inbound`` with the body to forward (``program_id`` and ``group_id``
stripped), the program id, its group (body field ``group_id``, header ``X-Group-Id``, or derived
from the program id by ``programs.group_id_pattern``), the prompt size and the shared-prefix
identity — or raises ``BadRequest`` naming the offending field. Only what routing needs is checked here; the worker validates the rest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from thunder_sgl.control.tickets import prefix_key_of
from thunder_sgl.errors import BadRequest

PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "generate": "/generate"}
"""The inference routes and their paths, the same at the router and at the worker."""
PROGRAM_ID_RE = re.compile(r"^[A-Za-z0-9._:@/+=-]{1,256}$")
PROGRAM_HEADERS = ("x-program-id", "x-smg-routing-key")
GROUP_HEADER = "x-group-id"
PREFIX_PROBE_CHARS = 1024


@dataclass
class Inbound:
    route: str
    """"chat", "completions" or "generate" (``PATHS``)."""
    body: dict[str, Any]
    program_id: str | None
    stream: bool
    include_usage: bool
    """The client asked for the usage chunk at the end of the stream."""
    prompt_chars: int
    prompt_tokens: int | None
    prefix_key: str | None
    prefix_chars: int
    group_id: str | None = None
    group_chars: int = 0
    """Characters of the task prompt a group shares beyond the system prompt (chat: the first
    user message; 0 where unknown, then learned from the engine's cached tokens)."""
    max_output: int | None = None
    """The most tokens the request may generate (``max_completion_tokens`` or ``max_tokens``;
    ``sampling_params.max_new_tokens`` on /generate); None when not given."""


def check_program_id(value: Any, where: str, field: str = "program_id") -> str:
    """A program (or group: ``field="group_id"``) id: 1-256 characters of a safe set."""
    code = f"invalid_{field}"
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise BadRequest(f"{where} must be a string", param=field, code=code)
    pid = str(value)
    if not PROGRAM_ID_RE.match(pid):
        raise BadRequest(
            f"{where} must be 1-256 characters of letters, digits and ._:@/+=- (got {pid[:40]!r})",
            param=field,
            code=code,
        )
    return pid


def group_of(body: dict[str, Any], headers: dict[str, str], pid: str | None,
             pattern: re.Pattern[str] | None) -> str | None:
    """The request's group: body ``group_id`` (removed from the body), else header
    ``X-Group-Id``, else derived from the program id by ``pattern``. A group needs a program."""
    gid: str | None = None
    if "group_id" in body:
        raw = body.pop("group_id")
        if raw is not None:
            gid = check_program_id(raw, "'group_id'", "group_id")
    if gid is None and headers.get(GROUP_HEADER):
        gid = check_program_id(headers[GROUP_HEADER], f"header {GROUP_HEADER}", "group_id")
    if gid is not None and pid is None:
        raise BadRequest("a group_id needs a program_id: a group is made of programs", param="group_id",
                         code="invalid_group_id")
    if gid is None and pid is not None and pattern is not None:
        m = pattern.match(pid)
        if m is not None:
            derived = m.group(1) if pattern.groups else m.group(0)
            gid = derived if derived and PROGRAM_ID_RE.match(derived) else None
    return gid


def _content_chars(content: Any, where: str) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        n = 0
        for part in content:
            if isinstance(part, dict):
                text = part.get("text")
                n += len(text) if isinstance(text, str) else 0
            elif isinstance(part, str):
                n += len(part)
            else:
                raise BadRequest(f"{where} parts must be objects", param=where)
        return n
    raise BadRequest(f"{where} must be a string, a list of parts or null", param=where)


def _check_common(body: dict[str, Any], route: str) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean", param="stream")
    opts = body.get("stream_options")
    include_usage = False
    if opts is not None:
        if not isinstance(opts, dict):
            raise BadRequest("'stream_options' must be an object", param="stream_options")
        if not stream:
            raise BadRequest("'stream_options' is only allowed when 'stream' is true", param="stream_options")
        iu = opts.get("include_usage", False)
        if not isinstance(iu, bool):
            raise BadRequest("'stream_options.include_usage' must be a boolean", param="stream_options.include_usage")
        include_usage = iu
    for key in ("max_tokens", "max_completion_tokens", "n"):
        v = body.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise BadRequest(f"'{key}' must be a non-negative integer", param=key)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string", param="model")
    return stream, include_usage


def parse_inbound(route: str, raw: bytes, headers: dict[str, str],
                  group_pattern: re.Pattern[str] | None = None) -> Inbound:
    """Validate and size one inference request. ``headers`` keys must be lower-case;
    ``group_pattern``: ``programs.group_id_pattern``, compiled."""
    if not raw.strip():
        raise BadRequest("request body is empty; expected a JSON object", code="invalid_json")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")

    pid: str | None = None
    if "program_id" in body:
        raw_pid = body.pop("program_id")
        if raw_pid is not None:
            pid = check_program_id(raw_pid, "'program_id'")
    if pid is None:
        for h in PROGRAM_HEADERS:
            if headers.get(h):
                pid = check_program_id(headers[h], f"header {h}")
                break
    gid = group_of(body, headers, pid, group_pattern)
    group_chars = 0

    prompt_tokens: int | None = None
    prefix_key, prefix_chars = None, 0
    if route == "chat":
        stream, include_usage = _check_common(body, route)
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise BadRequest("'messages' must be a non-empty list", param="messages")
        chars = 0
        for i, m in enumerate(msgs):
            if not isinstance(m, dict):
                raise BadRequest(f"'messages[{i}]' must be an object", param=f"messages[{i}]")
            if not isinstance(m.get("role"), str):
                raise BadRequest(f"'messages[{i}].role' must be a string", param=f"messages[{i}].role")
            chars += _content_chars(m.get("content"), f"messages[{i}].content")
        first = msgs[0]
        if first.get("role") in ("system", "developer") and isinstance(first.get("content"), str):
            prefix_key, prefix_chars = prefix_key_of(first["content"]), len(first["content"])
        if gid is not None:
            task = next((m for m in msgs if m.get("role") == "user"), None)
            group_chars = _content_chars(task.get("content"), "messages") if task is not None else 0
    elif route == "completions":
        stream, include_usage = _check_common(body, route)
        prompt = body.get("prompt")
        chars, prompt_tokens, head = _prompt_size(prompt, "prompt")
        if head:
            prefix_key = prefix_key_of(head)
    elif route == "generate":
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise BadRequest("'stream' must be a boolean", param="stream")
        include_usage = False
        sp = body.get("sampling_params")
        if sp is not None and not isinstance(sp, dict):
            raise BadRequest("'sampling_params' must be an object", param="sampling_params")
        if body.get("text") is None and body.get("input_ids") is None:
            raise BadRequest("one of 'text' or 'input_ids' is required", param="text")
        if body.get("text") is not None:
            chars, prompt_tokens, head = _prompt_size(body["text"], "text")
        else:
            chars, prompt_tokens, head = _prompt_size(body["input_ids"], "input_ids")
        if head:
            prefix_key = prefix_key_of(head)
    else:  # pragma: no cover - routes are fixed
        raise ValueError(route)
    return Inbound(route, body, pid, stream, include_usage, chars, prompt_tokens, prefix_key, prefix_chars,
                   gid, group_chars, _max_output(route, body))


def _max_output(route: str, body: dict[str, Any]) -> int | None:
    """The request's own bound on its output (validated by ``_check_common``; on /generate
    a bad value is the engine's to refuse, so only a positive integer is read)."""
    if route == "generate":
        sp = body.get("sampling_params")
        v = sp.get("max_new_tokens") if isinstance(sp, dict) else None
    else:
        v = body.get("max_completion_tokens")
        if v is None:
            v = body.get("max_tokens")
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _prompt_size(prompt: Any, field: str) -> tuple[int, int | None, str]:
    """(characters, exact tokens if token ids, head text used as a prefix identity)."""
    if isinstance(prompt, str):
        return len(prompt), None, prompt[:PREFIX_PROBE_CHARS] if len(prompt) > PREFIX_PROBE_CHARS else ""
    if isinstance(prompt, list) and prompt and all(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
        head = ",".join(map(str, prompt[:256])) if len(prompt) > 256 else ""
        return 0, len(prompt), head
    if isinstance(prompt, list) and prompt and all(isinstance(x, str) for x in prompt):
        return sum(len(x) for x in prompt), None, ""
    raise BadRequest(f"'{field}' must be a string, a list of strings or a list of token ids", param=field)
