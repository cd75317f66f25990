"""Pure validation of the engine control bodies, with SGLang 0.5.23's field names
(``managers/io_struct.py``: ``PauseGenerationReqInput``, ``ContinueGenerationReqInput``,
``AbortReq``, ``UpdateWeightFromDiskReqInput``, ``Release/ResumeMemoryOccupationReqInput``).

Only the fields the router acts on are checked (a ``BadRequest`` naming the field); the body
is forwarded to the workers as given, so fields added by later SGLang versions pass through.
An empty body is ``{}``, as SGLang's defaults make it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from thunder_sgl.errors import BadRequest

PAUSE_MODES = ("abort", "in_place", "retract")
MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")


def json_object(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        return {}
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    return body


def _bool(body: dict[str, Any], name: str) -> None:
    if name in body and not isinstance(body[name], bool):
        raise BadRequest(f"'{name}' must be a boolean", param=name)


def _str(body: dict[str, Any], name: str, required: bool = False) -> str | None:
    v = body.get(name)
    if v is None and not required:
        return None
    if not isinstance(v, str) or not v:
        raise BadRequest(f"'{name}' must be a non-empty string" + (" (required)" if required else ""), param=name)
    return v


def pause_mode(body: dict[str, Any]) -> str:
    """The mode of /pause_generation (SGLang's default: abort)."""
    mode = body.get("mode", "abort")
    if mode not in PAUSE_MODES:
        raise BadRequest(f"'mode' must be one of {', '.join(PAUSE_MODES)} (got {mode!r})", param="mode",
                         code="invalid_pause_mode")
    return mode  # type: ignore[no-any-return]


def check_continue(body: dict[str, Any]) -> None:
    _bool(body, "torch_empty_cache")


@dataclass(frozen=True)
class AbortTarget:
    rid: str | None
    abort_all: bool


def abort_target(body: dict[str, Any]) -> AbortTarget:
    """``{"rid": ...}`` or ``{"abort_all": true}``. SGLang silently ignores a body with
    neither; the router says so."""
    _bool(body, "abort_all")
    if body.get("abort_all"):
        return AbortTarget(None, True)
    rid = body.get("rid")
    if rid is None or rid == "":
        raise BadRequest("give 'rid' (a request id) or 'abort_all': true", param="rid", code="missing_rid")
    if not isinstance(rid, str):
        raise BadRequest("'rid' must be a string", param="rid")
    return AbortTarget(rid, False)


@dataclass(frozen=True)
class WeightUpdate:
    model_path: str
    weight_version: str | None
    flush_cache: bool
    """SGLang flushes the cache after loading (default): the programs' KV is gone."""


def weight_update(body: dict[str, Any]) -> WeightUpdate:
    path = _str(body, "model_path", required=True)
    version = _str(body, "weight_version")
    for name in ("flush_cache", "abort_all_requests", "is_async", "keep_pause", "torch_empty_cache",
                 "recapture_cuda_graph"):
        _bool(body, name)
    if body.get("load_format") is not None and not isinstance(body["load_format"], str):
        raise BadRequest("'load_format' must be a string", param="load_format")
    assert path is not None
    return WeightUpdate(path, version, body.get("flush_cache", True))


def memory_tags(body: dict[str, Any]) -> list[str] | None:
    """Tags of /release_memory_occupation and /resume_memory_occupation (None: all)."""
    tags = body.get("tags")
    if tags is None:
        return None
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise BadRequest("'tags' must be a list of strings", param="tags")
    unknown = sorted(set(tags) - set(MEMORY_TAGS))
    if unknown:
        raise BadRequest(f"unknown memory tags {unknown}; valid: {', '.join(MEMORY_TAGS)}", param="tags",
                         code="invalid_memory_tag")
    return list(dict.fromkeys(tags)) or None
