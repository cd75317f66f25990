"""Parsing of inference requests: program id, prompt size, prefix identity, precise 400s."""

from __future__ import annotations

import orjson
import pytest

from thunder_sgl.errors import BadRequest
from thunder_sgl.gateway.inbound import parse_inbound

CHAT = {"model": "m", "messages": [{"role": "system", "content": "S" * 400}, {"role": "user", "content": "hello"}]}


def parse(route, body, headers=None):
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return parse_inbound(route, raw, headers or {})


def test_program_id_from_body_is_stripped_before_forwarding():
    i = parse("chat", {**CHAT, "program_id": "prog-1"})
    assert i.program_id == "prog-1" and "program_id" not in i.body


@pytest.mark.parametrize(
    ("body_pid", "headers", "expected"),
    [
        (None, {"x-program-id": "h1"}, "h1"),
        (None, {"x-smg-routing-key": "k1"}, "k1"),
        (None, {"x-program-id": "h1", "x-smg-routing-key": "k1"}, "h1"),
        ("b1", {"x-program-id": "h1"}, "b1"),  # body wins
        (42, {}, "42"),                        # integers are accepted as ids
        (None, {}, None),                      # stateless
    ],
)
def test_program_id_sources_in_order(body_pid, headers, expected):
    body = dict(CHAT)
    if body_pid is not None:
        body["program_id"] = body_pid
    assert parse("chat", body, headers).program_id == expected


def test_prompt_size_and_system_prefix_identity():
    a = parse("chat", CHAT)
    b = parse("chat", {**CHAT, "messages": [CHAT["messages"][0], {"role": "user", "content": "other task"}]})
    assert a.prompt_chars == 405 and a.prefix_chars == 400
    assert a.prefix_key == b.prefix_key is not None


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        ("chat", b"{not json", None),
        ("chat", b"", None),
        ("chat", b"[1, 2]", None),
        ("chat", {"messages": []}, "messages"),
        ("chat", {"messages": "hi"}, "messages"),
        ("chat", {"messages": [{"content": "x"}]}, "messages[0].role"),
        ("chat", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ("chat", {**CHAT, "stream": "yes"}, "stream"),
        ("chat", {**CHAT, "stream_options": {"include_usage": True}}, "stream_options"),
        ("chat", {**CHAT, "max_tokens": -1}, "max_tokens"),
        ("chat", {**CHAT, "max_tokens": 1.5}, "max_tokens"),
        ("chat", {**CHAT, "model": 3}, "model"),
        ("chat", {**CHAT, "program_id": ""}, "program_id"),
        ("chat", {**CHAT, "program_id": "a b"}, "program_id"),
        ("chat", {**CHAT, "program_id": "x" * 257}, "program_id"),
        ("chat", {**CHAT, "program_id": ["x"]}, "program_id"),
        ("completions", {"prompt": 5}, "prompt"),
        ("generate", {"sampling_params": {}}, "text"),
        ("generate", {"text": "hi", "sampling_params": []}, "sampling_params"),
    ],
)
def test_bad_requests_name_the_offending_field(route, body, param):
    with pytest.raises(BadRequest) as e:
        parse(route, body)
    assert e.value.status == 400
    if param:
        assert e.value.param == param


def test_invalid_program_id_header_is_rejected():
    with pytest.raises(BadRequest):
        parse("chat", CHAT, {"x-program-id": "bad id with spaces"})


def test_completions_and_generate_sizes():
    assert parse("completions", {"prompt": "abcd" * 10}).prompt_chars == 40
    assert parse("completions", {"prompt": [1, 2, 3]}).prompt_tokens == 3
    g = parse("generate", {"input_ids": list(range(300)), "stream": True})
    assert g.prompt_tokens == 300 and g.stream and g.prefix_key is not None


def test_stream_include_usage_is_recorded():
    i = parse("chat", {**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    assert i.stream and i.include_usage
    assert not parse("chat", {**CHAT, "stream": True}).include_usage


def test_the_requests_own_output_bound_is_read():
    """max_completion_tokens before max_tokens (chat), max_tokens (completions),
    sampling_params.max_new_tokens (generate); absent or 0: no bound."""
    assert parse("chat", {**CHAT, "max_tokens": 128}).max_output == 128
    assert parse("chat", {**CHAT, "max_tokens": 128, "max_completion_tokens": 64}).max_output == 64
    assert parse("chat", CHAT).max_output is None
    assert parse("chat", {**CHAT, "max_tokens": 0}).max_output is None
    assert parse("completions", {"prompt": "abc", "max_tokens": 16}).max_output == 16
    g = parse("generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 32}})
    assert g.max_output == 32
    assert parse("generate", {"text": "x", "sampling_params": {"max_new_tokens": "lots"}}).max_output is None
