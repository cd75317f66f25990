"""Fuzz the router's OpenAPI schema (schemathesis): no input may cause a 5xx.

The schema is built in process from ``create_app`` at collection time, so every operation is a
test of its own (``test_no_input_causes_a_server_error[POST /v1/chat/completions]``); the cases
are sent to a real router process, and a separate test checks that the router serves the very
schema that was fuzzed. This avoids schemathesis's lazy ``from_fixture`` loader, which rewrites
pytest's private ``Function._nodeid`` (gone in pytest 9.2: ``AttributeError: 'Function' object
has no attribute '_nodeid'``).
"""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from thunder_sgl.config import RouterConfig
from thunder_sgl.gateway.app import create_app

TS = 50.0


def _openapi() -> dict:
    return create_app(RouterConfig()).app.openapi()


SCHEMA = schemathesis.openapi.from_dict(_openapi())
OPERATIONS = [r.ok() for r in SCHEMA.get_all_operations()]
SKIP = {("DELETE", "/programs"), ("POST", "/weight_sync/begin")}
"""DELETE /programs releases every program: fine, but it would only slow the other cases down.
/weight_sync/begin takes no input to break, and the window it opens would hold every request
the other cases send (its bad sequences are tested in tests/integration/test_rl_windows.py)."""
POSITIVE_SKIP = {("POST", "/pause_generation"), ("POST", "/update_weights_from_disk"),
                 ("POST", "/release_memory_occupation"), ("GET", "/release_memory_occupation")}
"""Valid calls of these pause the engines or hold requests for the rest of the run; their
invalid inputs are still fuzzed (and their valid ones tested in test_rl_windows.py)."""


@pytest.fixture(scope="module")
def router_url(tmp_path_factory):
    from thunder_sgl.benchmark.drivers.peers import start_sim, start_thunder

    logs = tmp_path_factory.mktemp("logs")
    sim = start_sim("tiny", workers=1, time_scale=TS, log_dir=logs)
    r = start_thunder(sim.urls, time_scale=TS, log_dir=logs, extra=["--thunder-sandbox-provider", "local"])
    yield r.url
    r.stop()
    sim.stop()


def test_the_router_serves_the_fuzzed_schema(router_url):
    served = httpx.get(router_url + "/openapi.json", timeout=30).json()
    assert served["paths"].keys() == _openapi()["paths"].keys()
    assert len(OPERATIONS) >= 20, [f"{o.method} {o.path}" for o in OPERATIONS]


def _cases() -> list:
    """Every operation with valid inputs; with invalid ones (types broken, required fields
    dropped...) too where it has a query or a body to break: its path parameters are free
    strings, so an operation with nothing else has no invalid input."""
    out = []
    for o in OPERATIONS:
        if (o.method.upper(), o.path) in SKIP:
            continue
        name = f"{o.method.upper()} {o.path}"
        if (o.method.upper(), o.path) not in POSITIVE_SKIP:
            out.append(pytest.param(o, schemathesis.GenerationMode.POSITIVE, id=f"positive-{name}"))
        if len(o.query) or len(o.body):
            out.append(pytest.param(o, schemathesis.GenerationMode.NEGATIVE, id=f"negative-{name}"))
    return out


@pytest.mark.parametrize(("operation", "mode"), _cases())
def test_no_input_causes_a_server_error(operation, mode, router_url):
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def check(case) -> None:
        response = case.call(base_url=router_url, timeout=30)
        assert response.status_code < 500, (
            f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:300]}"
        )
        if response.status_code >= 400:
            body = response.json()
            assert "error" in body and "message" in body["error"], body

    check()
