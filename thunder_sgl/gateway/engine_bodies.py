"""Pure validation of the engine control bodies, with SGLang 0.5.23's field names
(``managers/io_struct.py``: ``PauseGenerationReqInput``, ``ContinueGenerationReqInput``,
``AbortReq``, ``UpdateWeightFromDiskReqInput``, ``Release/ResumeMemoryOccupationReqInput``,
``Init/DestroyWeightsUpdateGroupReqInput``, ``UpdateWeightsFromDistributedReqInput``,
``UpdateWeightsFromTensorReqInput``, ``UpdateWeightVersionReqInput``,
``Load/UnloadLoRAAdapterReqInput``), and the ``worker`` query parameter that addresses one
worker (``worker_ref``).

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
    weight_version: str | None
    flush_cache: bool
    """SGLang flushes the cache after loading (default): the programs' KV is gone."""
    model_path: str | None = None
    """``/update_weights_from_disk`` only."""


def _update_fields(body: dict[str, Any], *bools: str) -> WeightUpdate:
    """The fields every SGLang weight update has: ``weight_version``, ``flush_cache``,
    ``abort_all_requests``, ``torch_empty_cache``, ``load_format`` (and the route's own booleans)."""
    version = _str(body, "weight_version")
    for name in ("flush_cache", "abort_all_requests", "torch_empty_cache", *bools):
        _bool(body, name)
    if body.get("load_format") is not None and not isinstance(body["load_format"], str):
        raise BadRequest("'load_format' must be a string", param="load_format")
    return WeightUpdate(version, body.get("flush_cache", True))


def weight_update(body: dict[str, Any]) -> WeightUpdate:
    path = _str(body, "model_path", required=True)
    upd = _update_fields(body, "is_async", "keep_pause", "recapture_cuda_graph")
    return WeightUpdate(upd.weight_version, upd.flush_cache, path)


def _str_list(body: dict[str, Any], name: str) -> list[str]:
    v = body.get(name)
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise BadRequest(f"'{name}' must be a list of strings (required)", param=name)
    return v


def distributed_update(body: dict[str, Any]) -> WeightUpdate:
    """``/update_weights_from_distributed``: ``names``, ``dtypes`` and ``shapes`` of the
    tensors the trainer broadcasts next, one entry each per tensor."""
    names, dtypes = _str_list(body, "names"), _str_list(body, "dtypes")
    shapes = body.get("shapes")
    if not isinstance(shapes, list) or not all(
            isinstance(s, list) and all(_is_int(d) and d >= 0 for d in s) for s in shapes):
        raise BadRequest("'shapes' must be a list of lists of non-negative integers (required)", param="shapes")
    if not len(names) == len(dtypes) == len(shapes):
        raise BadRequest(f"'names', 'dtypes' and 'shapes' must have one entry per tensor "
                         f"(got {len(names)}, {len(dtypes)}, {len(shapes)})", param="shapes")
    _str(body, "group_name")
    return _update_fields(body)


def tensor_update(body: dict[str, Any]) -> WeightUpdate:
    """``/update_weights_from_tensor``: ``serialized_named_tensors``, one base64 string per TP
    rank (SGLang's ``MultiprocessingSerializer`` payloads, meaningful on the trainer's machine)."""
    _str_list(body, "serialized_named_tensors")
    return _update_fields(body)


@dataclass(frozen=True)
class UpdateGroup:
    rank_offset: int
    """Rank of the first engine's TP rank 0 (rank 0 is usually the trainer)."""
    world_size: int


MAX_RANK = 1 << 20
"""Largest rank offset and world size taken (a JSON integer beyond 64 bits cannot even be
forwarded)."""
MAX_DIM = (1 << 63) - 1


def _is_int(v: Any, top: int = MAX_DIM) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and -top <= v <= top


def init_group(body: dict[str, Any]) -> UpdateGroup:
    """``/init_weights_update_group``: every field SGLang requires, checked before any engine
    starts waiting on the trainer's rendezvous."""
    _str(body, "master_address", required=True)
    for name in ("master_port", "rank_offset", "world_size"):
        if not _is_int(body.get(name), MAX_RANK):
            raise BadRequest(f"'{name}' must be an integer up to {MAX_RANK} (required)", param=name)
    if not 0 < body["master_port"] < 65536:
        raise BadRequest("'master_port' must be a TCP port (1-65535)", param="master_port")
    if body["rank_offset"] < 0:
        raise BadRequest("'rank_offset' must be >= 0", param="rank_offset")
    if body["world_size"] <= body["rank_offset"]:
        raise BadRequest("'world_size' must exceed 'rank_offset'", param="world_size")
    _str(body, "group_name")
    _str(body, "backend")
    return UpdateGroup(body["rank_offset"], body["world_size"])


def destroy_group(body: dict[str, Any]) -> None:
    _str(body, "group_name")


def version_update(body: dict[str, Any]) -> str:
    """``/update_weight_version``: the new label (SGLang aborts every request first unless
    ``abort_all_requests`` is false)."""
    _bool(body, "abort_all_requests")
    v = _str(body, "new_version", required=True)
    assert v is not None
    return v


def lora_load(body: dict[str, Any]) -> None:
    _str(body, "lora_name", required=True)
    _str(body, "lora_path", required=True)
    _bool(body, "pinned")


def lora_unload(body: dict[str, Any]) -> None:
    _str(body, "lora_name", required=True)


def worker_ref(query: dict[str, str]) -> str:
    """The ``worker`` query parameter of a single-worker call: a worker's URL, its id, or its
    index in ``GET /workers`` (0-based). A 400 ``missing_worker`` when absent."""
    ref = query.get("worker", "").strip()
    if not ref:
        raise BadRequest("this call goes to one worker: name it with the query parameter 'worker' (its URL, id "
                         "or index in GET /workers), e.g. ?worker=0", param="worker", code="missing_worker")
    return ref


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
