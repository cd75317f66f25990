"""Pure validation of the worker management bodies, with sglang_router 0.3.2's field names.

``POST /workers`` takes sglang_router's ``WorkerConfigRequest``: ``url`` (required) and 19
optional fields (``WORKER_FIELDS``; the 0.3.2 binary checks the type of each, measured in
tests/data/sglang_router-0.3.2-workers.json). thunder checks the same types (a 400 naming the
field, where sglang_router answers a plain-text 422) and acts on them as follows:

- ``worker_type``: ``regular`` (the default) is what thunder routes to. ``prefill`` and
  ``decode`` are refused (400 ``unsupported_worker_type``): thunder has no PD-disaggregated
  mode, and routing whole requests to a prefill server would fail later and silently.
  sglang_router registers any other string as ``regular``; so does thunder.
- ``model_id`` replaces the served model name in ``GET /workers`` and ``/v1/models``;
  ``priority``, ``cost``, ``labels`` and ``disable_health_check`` are kept and shown as
  sglang_router shows them (labels, and priority and cost when given, also in ``metadata``).
  thunder's scheduling does not weigh priority or cost.
- ``api_key``: thunder sends one key to every worker (``--api-key``); a body key equal to it
  (or none) is accepted, another is refused (400 ``unsupported_worker_api_key``) rather than
  have every call to that worker fail with 401.
- ``bootstrap_port``, the gRPC-only fields (``runtime``, ``tokenizer_path``, ``reasoning_parser``,
  ``tool_parser``, ``chat_template``) and the health-check overrides are accepted and ignored
  (thunder's monitor polls every worker alike: ``MonitorConfig``); sglang_router ignores the
  gRPC ones in HTTP mode too.

``PUT /workers/{id}`` takes sglang_router's update body: ``priority``, ``cost``, ``labels``.
Unknown fields are ignored, as serde does in sglang_router.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from thunder_sgl.errors import BadRequest

U16, U32, U64 = 2**16 - 1, 2**32 - 1, 2**64 - 1
WORKER_FIELDS: dict[str, tuple[str, int | None]] = {
    "api_key": ("str", None), "model_id": ("str", None), "priority": ("int", U32), "cost": ("float", None),
    "worker_type": ("str", None), "bootstrap_port": ("int", U16), "runtime": ("str", None),
    "tokenizer_path": ("str", None), "reasoning_parser": ("str", None), "tool_parser": ("str", None),
    "chat_template": ("str", None), "labels": ("labels", None), "health_check_timeout_secs": ("int", U64),
    "health_check_interval_secs": ("int", U64), "health_success_threshold": ("int", U32),
    "health_failure_threshold": ("int", U32), "disable_health_check": ("bool", None),
    "max_connection_attempts": ("int", U32), "dp_aware": ("bool", None),
}
"""sglang_router 0.3.2's optional ``WorkerConfigRequest`` fields and their types (``url`` aside)."""
PD_TYPES = ("prefill", "decode")
MAX_URL = 2048


@dataclass
class WorkerSpec:
    """What a ``POST /workers`` body asks for, as thunder keeps it on the ``Worker``."""

    url: str
    model_id: str | None = None
    priority: int | None = None
    cost: float | None = None
    labels: dict[str, str] = field(default_factory=dict)
    disable_health_check: bool = False


def _typed(body: dict[str, Any], name: str, kind: str, top: int | None) -> Any:
    v = body.get(name)
    if v is None:
        return None
    ok = {
        "str": isinstance(v, str),
        "bool": isinstance(v, bool),
        "int": isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= (top or 0),
        "float": isinstance(v, (int, float)) and not isinstance(v, bool),
        "labels": isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
    }[kind]
    if not ok:
        want = {"str": "a string", "bool": "a boolean", "int": f"an integer from 0 to {top}", "float": "a number",
                "labels": "an object of string values"}[kind]
        raise BadRequest(f"'{name}' must be {want}", param=name)
    return v


def worker_url(value: Any, param: str = "url") -> str:
    """A worker's base URL: http(s), at most 2048 characters; trailing slashes dropped."""
    if value is None:
        raise BadRequest(f"'{param}' is required: the http(s) URL of a worker", param=param)
    if not isinstance(value, str) or not value.startswith(("http://", "https://")) or len(value) > MAX_URL:
        raise BadRequest(f"'{param}' must be an http(s) URL of a worker", param=param)
    return value.rstrip("/")


def worker_config(body: Any, router_api_key: str | None) -> WorkerSpec:
    """The ``POST /workers`` body (a JSON value already parsed), or ``BadRequest``."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object with 'url'", code="invalid_json")
    url = worker_url(body.get("url"))
    values = {name: _typed(body, name, kind, top) for name, (kind, top) in WORKER_FIELDS.items()}
    wt = values["worker_type"]
    if wt in PD_TYPES:
        raise BadRequest(
            f"worker_type {wt!r}: thunder routes whole requests and has no prefill/decode (PD) mode; "
            "register regular workers (worker_type 'regular') or use sglang_router for PD disaggregation",
            param="worker_type", code="unsupported_worker_type")
    key = values["api_key"]
    if key is not None and key != (router_api_key or None):
        raise BadRequest(
            "a per-worker 'api_key' is not supported: thunder sends the one key given by --api-key to every worker",
            param="api_key", code="unsupported_worker_api_key")
    return WorkerSpec(url=url, model_id=values["model_id"], priority=values["priority"],
                      cost=None if values["cost"] is None else float(values["cost"]), labels=values["labels"] or {},
                      disable_health_check=bool(values["disable_health_check"]))


def worker_update(body: Any) -> dict[str, Any]:
    """The ``PUT /workers/{id}`` body: the fields given among priority, cost, labels."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object", code="invalid_json")
    out = {}
    for name, (kind, top) in (("priority", ("int", U32)), ("cost", ("float", None)), ("labels", ("labels", None))):
        v = _typed(body, name, kind, top)
        if v is not None:
            out[name] = float(v) if name == "cost" else v
    return out
