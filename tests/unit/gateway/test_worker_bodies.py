"""Validation of the worker management bodies (sglang_router 0.3.2's WorkerConfigRequest)."""

from __future__ import annotations

import pytest

from thunder_sgl.errors import BadRequest
from thunder_sgl.gateway import worker_bodies as W


def test_slimes_body_is_a_regular_worker():
    spec = W.worker_config({"url": "http://10.0.0.1:30000/", "worker_type": "regular"}, None)
    assert spec == W.WorkerSpec(url="http://10.0.0.1:30000")


def test_every_field_sglang_router_takes_is_taken():
    body = {"url": "http://h:1", "api_key": "k", "model_id": "m", "priority": 7, "cost": 2, "worker_type": "anything",
            "bootstrap_port": 65535, "runtime": "sglang", "tokenizer_path": "/t", "reasoning_parser": "r",
            "tool_parser": "t", "chat_template": "c", "labels": {"a": "b"}, "health_check_timeout_secs": 5,
            "health_check_interval_secs": 60, "health_success_threshold": 2, "health_failure_threshold": 3,
            "disable_health_check": True, "max_connection_attempts": 20, "dp_aware": False, "later_field": [1]}
    assert set(body) - {"url", "later_field"} == set(W.WORKER_FIELDS)
    spec = W.worker_config(body, "k")
    assert (spec.model_id, spec.priority, spec.cost, spec.labels, spec.disable_health_check) == ("m", 7, 2.0, {"a": "b"}, True)
    assert isinstance(spec.cost, float)


@pytest.mark.parametrize(("body", "param", "code"), [
    ({}, "url", None),
    ({"url": "ftp://h"}, "url", None),
    ({"url": 5}, "url", None),
    ({"url": "http://h:1", "priority": -1}, "priority", None),
    ({"url": "http://h:1", "priority": True}, "priority", None),
    ({"url": "http://h:1", "bootstrap_port": 70000}, "bootstrap_port", None),
    ({"url": "http://h:1", "cost": "1"}, "cost", None),
    ({"url": "http://h:1", "labels": {"a": 1}}, "labels", None),
    ({"url": "http://h:1", "labels": ["a"]}, "labels", None),
    ({"url": "http://h:1", "dp_aware": "no"}, "dp_aware", None),
    ({"url": "http://h:1", "model_id": 3}, "model_id", None),
    ({"url": "http://h:1", "worker_type": "prefill", "bootstrap_port": 8998}, "worker_type", "unsupported_worker_type"),
    ({"url": "http://h:1", "worker_type": "decode"}, "worker_type", "unsupported_worker_type"),
    ({"url": "http://h:1", "api_key": "other"}, "api_key", "unsupported_worker_api_key"),
])
def test_a_bad_field_is_a_400_naming_it(body, param, code):
    with pytest.raises(BadRequest) as e:
        W.worker_config(body, "k")
    assert e.value.param == param
    if code:
        assert e.value.code == code


def test_a_worker_api_key_needs_the_routers_own():
    with pytest.raises(BadRequest):
        W.worker_config({"url": "http://h:1", "api_key": "k"}, None)
    assert W.worker_config({"url": "http://h:1", "api_key": "k"}, "k").url == "http://h:1"


@pytest.mark.parametrize("body", [["http://h:1"], "http://h:1", None])
def test_a_body_that_is_not_an_object_is_refused(body):
    with pytest.raises(BadRequest) as e:
        W.worker_config(body, None)
    assert e.value.code == "invalid_json"


def test_the_update_body_keeps_the_fields_given():
    assert W.worker_update({"priority": 3, "other": 1}) == {"priority": 3}
    assert W.worker_update({"cost": 1, "labels": {}}) == {"cost": 1.0, "labels": {}}
    with pytest.raises(BadRequest):
        W.worker_update({"cost": "cheap"})
