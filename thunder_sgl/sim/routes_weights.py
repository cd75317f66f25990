"""Weight sync routes of the simulated worker, as RL frameworks call them on SGLang 0.5.23
(``entrypoints/http_server.py``; bodies from ``managers/io_struct.py``):

- ``POST /init_weights_update_group {"master_address", "master_port", "rank_offset",
  "world_size", "group_name"?, "backend"?}`` → ``{"success", "message"}`` (400 when false).
  The engine's TP rank r joins the group as rank ``rank_offset + r`` (SGLang's
  ``WeightUpdater.init_weights_update_group``); the simulator records the group and its ranks
  (``GET /sim/state``: ``weight_groups``) and fails — where torch would fail or hang — on an
  empty or existing group name and on ranks outside ``[0, world_size)``;
- ``POST /destroy_weights_update_group {"group_name"?}`` → ``{"success", "message"}``, 400
  "The group to be destroyed does not exist." for an unknown group;
- ``POST /update_weights_from_distributed {"names", "dtypes", "shapes", "group_name"?,
  "flush_cache"?, "abort_all_requests"?, "weight_version"?, "load_format"?}`` → ``{"success",
  "message"}``: a weight update as ``/update_weights_from_disk`` runs it (writer lock, version,
  flush), failing when the group was never initialized;
- ``POST /update_weights_from_tensor {"serialized_named_tensors", "load_format"?, "flush_cache"?,
  "abort_all_requests"?, "weight_version"?}`` → ``{"success", "message"}``: the payloads must be
  base64 strings (SGLang's ``Base64Bytes``); an empty list loads nothing and fails;
- ``POST /load_lora_adapter {"lora_name", "lora_path", "pinned"?}`` and
  ``POST /unload_lora_adapter {"lora_name"}`` → SGLang's ``LoRAUpdateOutput``: ``{"success",
  "error_message", "loaded_adapters": {name: path}}``, 400 when false. A path that is an
  existing directory or starts with ``sim/`` loads; a name already loaded, or unloading one
  that is not, fails with SGLang's messages. LoRA counts as enabled (``--enable-lora``).

SGLang 0.5.23 serves no ``/get_weight_version`` (the version is in ``/model_info``), so neither
does the simulator.
"""

from __future__ import annotations

import base64
import binascii
import os
from typing import Any

from aiohttp import web

from thunder_sgl.sim.request import SimRequestError
from thunder_sgl.sim.routes_control import _object, run_update, update_fields
from thunder_sgl.sim.server import SIM, error_response, json_response

DEFAULT_GROUP = "weight_update_group"


def _int(body: dict[str, Any], name: str) -> int:
    v = body.get(name)
    if not isinstance(v, int) or isinstance(v, bool):
        raise SimRequestError(f"{name}: Field required (an integer)")
    return v


def _str(body: dict[str, Any], name: str, default: str | None = None) -> str:
    v = body.get(name, default)
    if not isinstance(v, str):
        raise SimRequestError(f"{name}: Field required (a string)")
    return v


def _strings(body: dict[str, Any], name: str) -> list[str]:
    v = body.get(name)
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise SimRequestError(f"{name}: Input should be a valid list of strings")
    return v


def _result(ok: bool, message: str) -> web.Response:
    return json_response({"success": ok, "message": message}, 200 if ok else 400)


async def init_weights_update_group(request: web.Request) -> web.Response:
    w = request.app[SIM].worker
    try:
        body = await _object(request)
        address, port = _str(body, "master_address"), _int(body, "master_port")
        offset, world = _int(body, "rank_offset"), _int(body, "world_size")
        name, backend = _str(body, "group_name", DEFAULT_GROUP), _str(body, "backend", "nccl")
    except SimRequestError as e:
        return error_response(str(e), 400)
    if not name:
        return _result(False, "Failed to initialize custom process group: Group name cannot be empty.")
    if name in w.weight_groups:
        return _result(False, f"Failed to initialize custom process group: group {name!r} already exists.")
    ranks = [offset + r for r in range(w.cfg.server.tp_size)]
    if offset < 0 or ranks[-1] >= world:
        return _result(False, f"Failed to initialize custom process group: ranks {ranks} are outside "
                              f"[0, {world}) (rank_offset {offset}, world_size {world}).")
    w.weight_groups[name] = {"master_address": address, "master_port": port, "rank_offset": offset,
                             "world_size": world, "backend": backend, "ranks": ranks}
    return _result(True, "Succeeded to initialize custom process group.")


async def destroy_weights_update_group(request: web.Request) -> web.Response:
    w = request.app[SIM].worker
    try:
        name = _str(await _object(request), "group_name", DEFAULT_GROUP)
    except SimRequestError as e:
        return error_response(str(e), 400)
    if w.weight_groups.pop(name, None) is None:
        return _result(False, "The group to be destroyed does not exist.")
    return _result(True, "Succeeded to destroy custom process group.")


async def update_weights_from_distributed(request: web.Request) -> web.Response:
    srv = request.app[SIM]
    try:
        body = await _object(request)
        names, dtypes = _strings(body, "names"), _strings(body, "dtypes")
        shapes = body.get("shapes")
        if not isinstance(shapes, list) or not all(
                isinstance(s, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in s) for s in shapes):
            raise SimRequestError("shapes: Input should be a valid list of lists of integers")
        if not len(names) == len(dtypes) == len(shapes):
            raise SimRequestError("names, dtypes and shapes must have the same length")
        group = _str(body, "group_name", DEFAULT_GROUP)
        version, flush = update_fields(body)
    except SimRequestError as e:
        return error_response(str(e), 400)

    def load() -> str | None:
        groups = srv.worker.weight_groups
        if group in groups:
            return None
        return (f"Failed to update weights: Group {group} not in {list(groups)}. "
                "Please call `init_weights_update_group` first.")

    return await run_update(srv, body, version, flush, load, {})


async def update_weights_from_tensor(request: web.Request) -> web.Response:
    srv = request.app[SIM]
    try:
        body = await _object(request)
        payloads = _strings(body, "serialized_named_tensors")
        for x in payloads:
            base64.b64decode(x, validate=True)
        version, flush = update_fields(body)
    except (binascii.Error, ValueError) as e:
        return error_response(f"serialized_named_tensors: not base64 ({e})", 400)
    except SimRequestError as e:
        return error_response(str(e), 400)

    def load() -> str | None:
        return None if payloads else "Failed to update weights: no named tensors were sent."

    return await run_update(srv, body, version, flush, load, {})


def _lora(ok: bool, adapters: dict[str, str], error: str | None = None) -> web.Response:
    return json_response({"success": ok, "error_message": error, "loaded_adapters": dict(adapters)},
                         200 if ok else 400)


async def load_lora_adapter(request: web.Request) -> web.Response:
    w = request.app[SIM].worker
    try:
        body = await _object(request)
        name, path = _str(body, "lora_name"), _str(body, "lora_path")
        if not isinstance(body.get("pinned", False), bool):
            raise SimRequestError("pinned: Input should be a valid boolean")
    except SimRequestError as e:
        return error_response(str(e), 400)
    if name in w.lora_adapters:
        return _lora(False, w.lora_adapters, f"Failed to load LoRA adapter {name} because it is already loaded")
    if not (path.startswith("sim/") or os.path.isdir(path)):
        return _lora(False, w.lora_adapters, f"Can't find 'adapter_config.json' at '{path}'")
    w.lora_adapters[name] = path
    return _lora(True, w.lora_adapters)


async def unload_lora_adapter(request: web.Request) -> web.Response:
    w = request.app[SIM].worker
    try:
        name = _str(await _object(request), "lora_name")
    except SimRequestError as e:
        return error_response(str(e), 400)
    if w.lora_adapters.pop(name, None) is None:
        return _lora(False, w.lora_adapters,
                     f"LoRA with name {name} does not exist. Loaded LoRAs: {list(w.lora_adapters)}")
    return _lora(True, w.lora_adapters)


def add_weight_routes(r: web.UrlDispatcher) -> None:
    r.add_post("/init_weights_update_group", init_weights_update_group)
    r.add_post("/destroy_weights_update_group", destroy_weights_update_group)
    r.add_post("/update_weights_from_distributed", update_weights_from_distributed)
    r.add_post("/update_weights_from_tensor", update_weights_from_tensor)
    r.add_post("/load_lora_adapter", load_lora_adapter)
    r.add_post("/unload_lora_adapter", unload_lora_adapter)
