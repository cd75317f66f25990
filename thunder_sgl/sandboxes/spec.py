"""Validation of client input: sandbox specs, exec requests and registered resources.

Parsing is by hand rather than by pydantic so that every rejection is one ``BadRequest``
(HTTP 400, OpenAI-shaped) whose message names the field and the limit, and whose ``param``
is the field name. Limits come from ``SandboxConfig``; defaults fill absent fields, so a
``SandboxSpec`` is always complete and within the configured maximum.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from thunder_sgl.errors import BadRequest
from thunder_sgl.sandboxes.config import SandboxConfig

KEEPALIVE_COMMAND: tuple[str, ...] = ("sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done")
"""Default long-running command of a container: idles, and exits at once on SIGTERM (``wait``
is interrupted by the signal; a foreground ``sleep`` would delay the trap for an hour)."""

MIN_MEMORY_MB = 16
MIN_CPUS = 0.01
MIN_PIDS = 8
MAX_SETUP_COMMANDS = 32
MAX_ENV_VARS = 256
MAX_ARG_CHARS = 128 * 1024
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,254}$")
_RESERVED_ENV_PREFIX = "THUNDER_"

SPEC_FIELDS = ("image", "command", "env", "workdir", "memory_mb", "cpus", "pids", "network", "ports", "setup", "read_only")
EXEC_FIELDS = ("command", "timeout", "env", "workdir")


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    """A validated, complete sandbox specification."""

    image: str
    command: tuple[str, ...] | None
    """Long-running command; None: the provider's default (keepalive for docker, none locally)."""
    env: tuple[tuple[str, str], ...]
    workdir: str | None
    memory_mb: int
    cpus: float
    pids: int
    network: str
    ports: int
    """How many ports from the router's range the sandbox gets (env ``THUNDER_PORTS``)."""
    setup: tuple[tuple[str, ...], ...]
    """Commands run in order while the sandbox is preparing; a non-zero exit fails it."""
    read_only: bool

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)


def parse_spec(data: Any, config: SandboxConfig, *, max_ports: int = 16) -> SandboxSpec:
    """Validate a client's spec (a JSON object) against ``config``; fill defaults."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise BadRequest("sandbox spec must be a JSON object", param="spec")
    _no_unknown(data, SPEC_FIELDS, "sandbox spec")
    image = data.get("image", config.default_image)
    if not isinstance(image, str) or not _IMAGE.match(image):
        raise BadRequest(f"image must be an image reference such as 'name:tag', got {image!r}", param="image")
    command = None if data.get("command") is None else tuple(parse_command(data["command"], "command"))
    network = data.get("network", config.allowed_networks[0])
    if network not in config.allowed_networks:
        raise BadRequest(
            f"network {network!r} is not allowed; allowed networks: {list(config.allowed_networks)}",
            param="network",
        )
    setup = data.get("setup", [])
    if not isinstance(setup, list):
        raise BadRequest("setup must be a list of commands", param="setup")
    if len(setup) > MAX_SETUP_COMMANDS:
        raise BadRequest(f"setup may hold at most {MAX_SETUP_COMMANDS} commands, got {len(setup)}", param="setup")
    read_only = data.get("read_only", False)
    if not isinstance(read_only, bool):
        raise BadRequest(f"read_only must be true or false, got {read_only!r}", param="read_only")
    return SandboxSpec(
        image=image,
        command=command,
        env=tuple(sorted(parse_env(data.get("env"), "env").items())),
        workdir=parse_workdir(data.get("workdir"), "workdir"),
        memory_mb=_int(data, "memory_mb", config.default_memory_mb, MIN_MEMORY_MB, config.max_memory_mb, "max_memory_mb"),
        cpus=_number(data, "cpus", config.default_cpus, MIN_CPUS, config.max_cpus, "max_cpus"),
        pids=_int(data, "pids", config.default_pids, MIN_PIDS, config.max_pids, "max_pids"),
        network=network,
        ports=_int(data, "ports", 0, 0, max_ports, "max_ports_per_sandbox"),
        setup=tuple(tuple(parse_command(c, f"setup[{i}]")) for i, c in enumerate(setup)),
        read_only=read_only,
    )


@dataclass(frozen=True, slots=True)
class ExecRequest:
    command: list[str]
    timeout: float
    env: dict[str, str]
    workdir: str | None


def parse_exec(data: Any, config: SandboxConfig) -> ExecRequest:
    """Validate the body of ``POST …/exec``."""
    if not isinstance(data, dict):
        raise BadRequest("exec request must be a JSON object", param="body")
    _no_unknown(data, EXEC_FIELDS, "exec request")
    if "command" not in data:
        raise BadRequest("command is required", param="command")
    return ExecRequest(
        command=parse_command(data["command"], "command"),
        timeout=parse_timeout(data.get("timeout"), config),
        env=parse_env(data.get("env"), "env"),
        workdir=parse_workdir(data.get("workdir"), "workdir"),
    )


def parse_timeout(value: Any, config: SandboxConfig) -> float:
    if value is None:
        return config.exec_timeout_seconds
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise BadRequest(f"timeout must be a number of seconds > 0, got {value!r}", param="timeout")
    if value > config.max_exec_timeout_seconds:
        raise BadRequest(
            f"timeout {value} exceeds the maximum of {config.max_exec_timeout_seconds} s "
            "(sandboxes.max_exec_timeout_seconds)",
            param="timeout",
        )
    return float(value)


def parse_command(value: Any, name: str) -> list[str]:
    """A command is a non-empty list of strings (argv) or a non-empty string run by ``sh -c``."""
    if isinstance(value, str):
        if not value.strip():
            raise BadRequest(f"{name} must not be empty", param=name)
        argv = ["sh", "-c", value]
    elif isinstance(value, list) and value and all(isinstance(a, str) for a in value):
        argv = list(value)
    else:
        raise BadRequest(f"{name} must be a string or a non-empty list of strings, got {value!r}", param=name)
    if any("\x00" in a for a in argv):
        raise BadRequest(f"{name} must not contain NUL characters", param=name)
    if sum(len(a) for a in argv) > MAX_ARG_CHARS:
        raise BadRequest(f"{name} is longer than {MAX_ARG_CHARS} characters", param=name)
    return argv


def parse_env(value: Any, name: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequest(f"{name} must be an object of string values", param=name)
    if len(value) > MAX_ENV_VARS:
        raise BadRequest(f"{name} may hold at most {MAX_ENV_VARS} variables", param=name)
    for k, v in value.items():
        if not _ENV_NAME.match(k):
            raise BadRequest(f"{name}: invalid variable name {k!r}", param=f"{name}.{k}")
        if k.startswith(_RESERVED_ENV_PREFIX):
            raise BadRequest(f"{name}.{k}: names starting with THUNDER_ are set by the router", param=f"{name}.{k}")
        if not isinstance(v, str) or "\x00" in v:
            raise BadRequest(f"{name}.{k} must be a string without NUL characters, got {v!r}", param=f"{name}.{k}")
    return dict(value)


def parse_workdir(value: Any, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.startswith("/") or "\x00" in value or ".." in value.split("/"):
        raise BadRequest(f"{name} must be an absolute path without '..', got {value!r}", param=name)
    return value


def parse_resource(data: Any) -> dict[str, Any]:
    """Body of ``POST /programs/{id}/resources``: ``{"kind": "container", "id": "<id or name>"}``
    or ``{"kind": "port", "port": 42017}``."""
    if not isinstance(data, dict):
        raise BadRequest("resource must be a JSON object", param="body")
    kind = data.get("kind")
    if kind == "container":
        _no_unknown(data, ("kind", "id"), "container resource")
        ref = data.get("id")
        if not isinstance(ref, str) or not _IMAGE.match(ref):
            raise BadRequest(f"id must be a container id or name, got {ref!r}", param="id")
        return {"kind": "container", "id": ref}
    if kind == "port":
        _no_unknown(data, ("kind", "port"), "port resource")
        port = data.get("port")
        if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 65535:
            raise BadRequest(f"port must be an integer in 1024..65535, got {port!r}", param="port")
        return {"kind": "port", "port": port}
    raise BadRequest(f"kind must be 'container' or 'port', got {kind!r}", param="kind")


def _no_unknown(data: dict[str, Any], known: tuple[str, ...], what: str) -> None:
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise BadRequest(f"unknown field(s) {unknown} in {what}; valid fields: {sorted(known)}", param=unknown[0])


def _int(data: dict[str, Any], name: str, default: int, lo: int, hi: int, limit: str) -> int:
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"{name} must be an integer, got {value!r}", param=name)
    return _within(name, value, lo, hi, limit)


def _number(data: dict[str, Any], name: str, default: float, lo: float, hi: float, limit: str) -> float:
    value = data.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadRequest(f"{name} must be a number, got {value!r}", param=name)
    return float(_within(name, value, lo, hi, limit))


def _within(name: str, value: Any, lo: Any, hi: Any, limit: str) -> Any:
    if value < lo:
        raise BadRequest(f"{name} must be >= {lo}, got {value}", param=name)
    if value > hi:
        raise BadRequest(f"{name}={value} exceeds the configured maximum {hi} (sandboxes.{limit})", param=name)
    return value
