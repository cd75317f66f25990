"""Spec, exec and resource validation: every malformed or over-limit input is one 400 whose
message names the field (and the configured limit, when one is exceeded)."""

from __future__ import annotations

from typing import Any

import pytest

from thunder_sgl.errors import BadRequest
from thunder_sgl.sandboxes.config import SandboxConfig
from thunder_sgl.sandboxes.spec import KEEPALIVE_COMMAND, parse_exec, parse_resource, parse_spec

CFG = SandboxConfig(max_memory_mb=1024, max_cpus=2.0, max_pids=512, allowed_networks=("none",))

BAD_SPECS: list[tuple[Any, str, str]] = [
    # (spec, param, exact message)
    ([], "spec", "sandbox spec must be a JSON object"),
    ("ubuntu", "spec", "sandbox spec must be a JSON object"),
    ({"imgae": "x"}, "imgae", "unknown field(s) ['imgae'] in sandbox spec; valid fields: "
     "['command', 'cpus', 'env', 'image', 'memory_mb', 'network', 'pids', 'ports', 'read_only', 'setup', 'workdir']"),
    ({"image": ""}, "image", "image must be an image reference such as 'name:tag', got ''"),
    ({"image": "a b"}, "image", "image must be an image reference such as 'name:tag', got 'a b'"),
    ({"image": 3}, "image", "image must be an image reference such as 'name:tag', got 3"),
    ({"command": []}, "command", "command must be a string or a non-empty list of strings, got []"),
    ({"command": ["ls", 1]}, "command", "command must be a string or a non-empty list of strings, got ['ls', 1]"),
    ({"command": "  "}, "command", "command must not be empty"),
    ({"command": "a\x00b"}, "command", "command must not contain NUL characters"),
    ({"env": ["A=1"]}, "env", "env must be an object of string values"),
    ({"env": {"1A": "x"}}, "env.1A", "env: invalid variable name '1A'"),
    ({"env": {"A": 1}}, "env.A", "env.A must be a string without NUL characters, got 1"),
    ({"env": {"THUNDER_PORTS": "1"}}, "env.THUNDER_PORTS", "env.THUNDER_PORTS: names starting with THUNDER_ are set by the router"),
    ({"workdir": "rel/dir"}, "workdir", "workdir must be an absolute path without '..', got 'rel/dir'"),
    ({"workdir": "/a/../etc"}, "workdir", "workdir must be an absolute path without '..', got '/a/../etc'"),
    ({"memory_mb": 2048}, "memory_mb", "memory_mb=2048 exceeds the configured maximum 1024 (sandboxes.max_memory_mb)"),
    ({"memory_mb": 4}, "memory_mb", "memory_mb must be >= 16, got 4"),
    ({"memory_mb": "512"}, "memory_mb", "memory_mb must be an integer, got '512'"),
    ({"memory_mb": True}, "memory_mb", "memory_mb must be an integer, got True"),
    ({"memory_mb": 1.5}, "memory_mb", "memory_mb must be an integer, got 1.5"),
    ({"cpus": 3}, "cpus", "cpus=3 exceeds the configured maximum 2.0 (sandboxes.max_cpus)"),
    ({"cpus": 0}, "cpus", "cpus must be >= 0.01, got 0"),
    ({"cpus": float("nan")}, "cpus", "cpus must be a number, got nan"),
    ({"pids": 100000}, "pids", "pids=100000 exceeds the configured maximum 512 (sandboxes.max_pids)"),
    ({"pids": 1}, "pids", "pids must be >= 8, got 1"),
    ({"network": "bridge"}, "network", "network 'bridge' is not allowed; allowed networks: ['none']"),
    ({"network": "host"}, "network", "network 'host' is not allowed; allowed networks: ['none']"),
    ({"ports": 17}, "ports", "ports=17 exceeds the configured maximum 16 (sandboxes.max_ports_per_sandbox)"),
    ({"ports": -1}, "ports", "ports must be >= 0, got -1"),
    ({"setup": "make"}, "setup", "setup must be a list of commands"),
    ({"setup": ["ok", 5]}, "setup[1]", "setup[1] must be a string or a non-empty list of strings, got 5"),
    ({"setup": ["x"] * 33}, "setup", "setup may hold at most 32 commands, got 33"),
    ({"read_only": "yes"}, "read_only", "read_only must be true or false, got 'yes'"),
]


@pytest.mark.parametrize(("spec", "param", "message"), BAD_SPECS, ids=[f"{p}-{i}" for i, (_, p, _) in enumerate(BAD_SPECS)])
def test_malformed_spec_is_400_naming_the_field(spec: Any, param: str, message: str) -> None:
    with pytest.raises(BadRequest) as e:
        parse_spec(spec, CFG)
    assert e.value.status == 400
    assert e.value.param == param
    assert e.value.message == message
    assert e.value.body()["error"]["type"] == "invalid_request_error"


def test_empty_spec_takes_the_configured_defaults() -> None:
    s = parse_spec(None, CFG)
    assert (s.image, s.memory_mb, s.cpus, s.pids, s.network, s.ports) == (
        CFG.default_image, CFG.default_memory_mb, CFG.default_cpus, CFG.default_pids, "none", 0)
    assert s.command is None and s.setup == () and s.read_only is False
    assert parse_spec({}, CFG) == s


def test_string_commands_run_through_sh() -> None:
    s = parse_spec({"command": "serve --port 1", "setup": ["make", ["pip", "install", "x"]]}, CFG)
    assert s.command == ("sh", "-c", "serve --port 1")
    assert s.setup == (("sh", "-c", "make"), ("pip", "install", "x"))


def test_keepalive_command_exits_on_sigterm_without_waiting_for_sleep() -> None:
    assert "wait $!" in KEEPALIVE_COMMAND[-1] and "trap 'exit 0' TERM" in KEEPALIVE_COMMAND[-1]


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({}, "command", "command is required"),
        ([], "body", "exec request must be a JSON object"),
        ({"command": "ls", "timeout": 0}, "timeout", "timeout must be a number of seconds > 0, got 0"),
        ({"command": "ls", "timeout": "5"}, "timeout", "timeout must be a number of seconds > 0, got '5'"),
        ({"command": "ls", "timeout": 7200}, "timeout",
         "timeout 7200 exceeds the maximum of 3600.0 s (sandboxes.max_exec_timeout_seconds)"),
        ({"command": "ls", "cwd": "/"}, "cwd",
         "unknown field(s) ['cwd'] in exec request; valid fields: ['command', 'env', 'timeout', 'workdir']"),
    ],
)
def test_malformed_exec_is_400(body: Any, param: str, message: str) -> None:
    with pytest.raises(BadRequest) as e:
        parse_exec(body, CFG)
    assert (e.value.param, e.value.message) == (param, message)


def test_exec_defaults_to_the_configured_timeout() -> None:
    req = parse_exec({"command": ["true"]}, CFG)
    assert req.timeout == CFG.exec_timeout_seconds and req.env == {} and req.workdir is None


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"kind": "volume"}, "kind", "kind must be 'container' or 'port', got 'volume'"),
        ({"kind": "port", "port": 80}, "port", "port must be an integer in 1024..65535, got 80"),
        ({"kind": "port", "port": "4000"}, "port", "port must be an integer in 1024..65535, got '4000'"),
        ({"kind": "container"}, "id", "id must be a container id or name, got None"),
        ({"kind": "container", "id": "x", "force": True}, "force",
         "unknown field(s) ['force'] in container resource; valid fields: ['id', 'kind']"),
    ],
)
def test_malformed_resource_is_400(body: Any, param: str, message: str) -> None:
    with pytest.raises(BadRequest) as e:
        parse_resource(body)
    assert (e.value.param, e.value.message) == (param, message)
