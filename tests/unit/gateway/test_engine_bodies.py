"""Validation of the engine control bodies (SGLang 0.5.23's fields), and the answer of a
request aborted while the router held it."""

from __future__ import annotations

import orjson
import pytest

from thunder_sgl.errors import BadRequest
from thunder_sgl.gateway import engine_bodies as B
from thunder_sgl.gateway.aborted import aborted_response


@pytest.mark.parametrize(("raw", "want"), [(b"", {}), (b"  ", {}), (b'{"mode": "retract"}', {"mode": "retract"})])
def test_an_empty_body_takes_sglangs_defaults(raw, want):
    assert B.json_object(raw) == want


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b'"abort"'])
def test_a_body_that_is_not_a_json_object_is_refused(raw):
    with pytest.raises(BadRequest) as e:
        B.json_object(raw)
    assert e.value.code == "invalid_json"


@pytest.mark.parametrize(("body", "mode"), [({}, "abort"), ({"mode": "in_place"}, "in_place"), ({"mode": "retract"}, "retract")])
def test_pause_modes_are_sglangs_with_abort_the_default(body, mode):
    assert B.pause_mode(body) == mode


@pytest.mark.parametrize(("call", "body", "param"), [
    (B.pause_mode, {"mode": "inplace"}, "mode"),
    (B.pause_mode, {"mode": 1}, "mode"),
    (B.check_continue, {"torch_empty_cache": "no"}, "torch_empty_cache"),
    (B.abort_target, {}, "rid"),
    (B.abort_target, {"rid": ""}, "rid"),
    (B.abort_target, {"rid": ["a"]}, "rid"),
    (B.abort_target, {"abort_all": "yes"}, "abort_all"),
    (B.weight_update, {}, "model_path"),
    (B.weight_update, {"model_path": 3}, "model_path"),
    (B.weight_update, {"model_path": "/m", "weight_version": 2}, "weight_version"),
    (B.weight_update, {"model_path": "/m", "flush_cache": 0}, "flush_cache"),
    (B.weight_update, {"model_path": "/m", "abort_all_requests": "true"}, "abort_all_requests"),
    (B.memory_tags, {"tags": "kv_cache"}, "tags"),
    (B.memory_tags, {"tags": ["kv_cache", "gpu"]}, "tags"),
    (B.init_group, {"master_port": 1, "rank_offset": 1, "world_size": 3}, "master_address"),
    (B.init_group, {"master_address": "h", "master_port": "1", "rank_offset": 1, "world_size": 3}, "master_port"),
    (B.init_group, {"master_address": "h", "master_port": 70000, "rank_offset": 1, "world_size": 3}, "master_port"),
    (B.init_group, {"master_address": "h", "master_port": 1, "rank_offset": True, "world_size": 3}, "rank_offset"),
    (B.init_group, {"master_address": "h", "master_port": 1, "rank_offset": -1, "world_size": 3}, "rank_offset"),
    (B.init_group, {"master_address": "h", "master_port": 1, "rank_offset": 3, "world_size": 3}, "world_size"),
    (B.init_group, {"master_address": "h", "master_port": 1, "rank_offset": 1, "world_size": 3, "group_name": ""},
     "group_name"),
    (B.destroy_group, {"group_name": 5}, "group_name"),
    (B.distributed_update, {"names": ["w"], "dtypes": ["bf16"]}, "shapes"),
    (B.distributed_update, {"names": ["w"], "dtypes": ["bf16"], "shapes": [[2, -1]]}, "shapes"),
    (B.distributed_update, {"names": ["w", "v"], "dtypes": ["bf16"], "shapes": [[2]]}, "shapes"),
    (B.distributed_update, {"names": "w", "dtypes": ["bf16"], "shapes": [[2]]}, "names"),
    (B.distributed_update, {"names": [], "dtypes": [], "shapes": [], "flush_cache": "no"}, "flush_cache"),
    (B.tensor_update, {}, "serialized_named_tensors"),
    (B.tensor_update, {"serialized_named_tensors": ["x"], "weight_version": 3}, "weight_version"),
    (B.version_update, {}, "new_version"),
    (B.version_update, {"new_version": "v", "abort_all_requests": 1}, "abort_all_requests"),
    (B.lora_load, {"lora_name": "a"}, "lora_path"),
    (B.lora_load, {"lora_name": "a", "lora_path": "p", "pinned": "yes"}, "pinned"),
    (B.lora_unload, {}, "lora_name"),
    (B.worker_ref, {}, "worker"),
    (B.worker_ref, {"worker": "  "}, "worker"),
])
def test_bad_fields_are_refused_naming_the_field(call, body, param):
    with pytest.raises(BadRequest) as e:
        call(body)
    assert e.value.param == param and e.value.status == 400


def test_abort_targets_and_weight_update_defaults():
    assert B.abort_target({"rid": "r1"}) == B.AbortTarget("r1", False)
    assert B.abort_target({"abort_all": True, "rid": "ignored"}) == B.AbortTarget(None, True)
    upd = B.weight_update({"model_path": "/ckpt/step-3", "weight_version": "step-3", "load_format": "auto"})
    assert upd == B.WeightUpdate("step-3", True, "/ckpt/step-3")
    assert B.weight_update({"model_path": "/m", "flush_cache": False}).flush_cache is False
    assert B.distributed_update({"names": ["a"], "dtypes": ["bfloat16"], "shapes": [[4, 4]], "weight_version": "v2",
                                 "flush_cache": False}) == B.WeightUpdate("v2", False)
    assert B.tensor_update({"serialized_named_tensors": ["eA=="]}) == B.WeightUpdate(None, True)
    assert B.init_group({"master_address": "h", "master_port": 29500, "rank_offset": 1, "world_size": 5}) \
        == B.UpdateGroup(1, 5)
    assert B.version_update({"new_version": "v7"}) == "v7" and B.worker_ref({"worker": " 1 "}) == "1"
    assert B.memory_tags({}) is None and B.memory_tags({"tags": []}) is None
    assert B.memory_tags({"tags": ["weights", "weights", "kv_cache"]}) == ["weights", "kv_cache"]


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_a_held_request_aborted_is_answered_like_an_engines_abort(route):
    body = orjson.loads(aborted_response(route, False, False, "r-9", "tiny").body)
    assert body["id"] == "r-9" and body["choices"][0]["finish_reason"] == "abort"
    assert body["usage"] == {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    g = orjson.loads(aborted_response("generate", False, False, "r-9", None).body)
    assert g["meta_info"]["finish_reason"]["type"] == "abort" and g["meta_info"]["completion_tokens"] == 0


@pytest.mark.parametrize(("include_usage", "events"), [(False, 1), (True, 2)])
def test_a_held_stream_aborted_ends_with_done(include_usage, events):
    resp = aborted_response("chat", True, include_usage, "r-1", "tiny")
    blocks = [b for b in resp.body.decode().split("\n\n") if b]
    assert blocks[-1] == "data: [DONE]" and len(blocks) == events + 1
    first = orjson.loads(blocks[0][6:])
    assert first["object"] == "chat.completion.chunk" and first["choices"][0] == {
        "index": 0, "delta": {}, "logprobs": None, "finish_reason": "abort", "matched_stop": None}
    assert resp.media_type == "text/event-stream"
