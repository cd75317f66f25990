"""Text of a given token count, and the conversation a program sends."""

from __future__ import annotations

import json

import pytest

from thunder_sgl.benchmark.workloads.conversation import (
    Conversation,
    StreamAccumulator,
    instance_text,
    observation_text,
    parse_response,
    program_headers,
    release_unsupported,
    render_prompt,
    system_prompt,
)
from thunder_sgl.benchmark.workloads.profile import load_profile, program_at
from thunder_sgl.textgen import CHARS_PER_TOKEN, estimate_tokens, text


@pytest.mark.parametrize("n", [1, 17, 300, 1500, 6000])
def test_text_has_four_characters_per_token_and_about_one_word_per_token(n):
    t = text(n, f"k{n}")
    assert len(t) == CHARS_PER_TOKEN * n
    assert estimate_tokens(t) == n
    if n >= 300:
        assert len(t.split()) == pytest.approx(n, rel=0.10)
        assert t.isascii() and not t[-1].isspace()


def test_text_is_a_pure_function_of_its_key():
    assert text(500, "a") == text(500, "a")
    assert text(500, "a") != text(500, "b")
    assert text(10, "a", head="x" * 100) == "x" * 100


def test_system_prompt_is_byte_identical_across_programs_and_nothing_else_is_shared():
    p = load_profile("mini-swe-agent")
    a, b = program_at(p, 0, 0), program_at(p, 0, 1)
    sys_text = system_prompt(p.name, p.system_prompt_tokens)
    assert sys_text == system_prompt(p.name, p.system_prompt_tokens)
    assert estimate_tokens(sys_text) == 1500
    ia, ib = instance_text(a), instance_text(b)
    assert estimate_tokens(ia) == a.instance_tokens
    common = next(i for i, (x, y) in enumerate(zip(ia, ib, strict=False)) if x != y)
    assert common < ia.index("\n")  # the instances diverge within their first line
    assert estimate_tokens(observation_text(a, 3)) == a.steps[3].observation_tokens
    assert observation_text(a, 3) != observation_text(a, 4) != observation_text(b, 3)


def test_conversation_is_append_only_and_carries_the_program_id():
    p = load_profile("mini-swe-agent")
    spec = program_at(p, 0, 0)
    conv = Conversation(spec, "SYS", model="m", max_tokens_cap=150)
    prev = None
    for i in range(4):
        body = conv.body(i)
        assert body["program_id"] == spec.program_id and body["model"] == "m"
        assert body["max_tokens"] == min(150, spec.steps[i].output_tokens)
        assert body["stream"] is False and "stream_options" not in body
        if prev is not None:
            assert body["messages"][: len(prev)] == prev and len(body["messages"]) == len(prev) + 2
        prev = body["messages"]
        conv.add_reply(i, f"reply {i}")
    assert (
        conv.headers()
        == program_headers(spec.program_id)
        == {
            "X-Program-Id": spec.program_id,
            "X-SMG-Routing-Key": spec.program_id,
        }
    )


def test_completions_prompt_grows_append_only():
    spec = program_at(load_profile("toolorchestra"), 0, 0)
    conv = Conversation(spec, "SYS", model="m", api="completions", stream=True)
    p0 = conv.body(0)["prompt"]
    conv.add_reply(0, "thinking")
    p1 = conv.body(1)["prompt"]
    assert p1.startswith(p0) and len(p1) > len(p0)
    assert conv.body(1)["stream_options"] == {"include_usage": True}
    assert render_prompt([]) == "<|assistant|>\n"


def test_parse_response_reads_usage_and_defaults_cached_to_zero():
    doc = {
        "choices": [{"message": {"content": "hi"}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2},
    }
    reply, usage = parse_response(doc, "chat")
    assert reply == "hi" and (
        usage.prompt_tokens,
        usage.completion_tokens,
        usage.cached_tokens,
    ) == (10, 2, 0)
    doc["usage"]["prompt_tokens_details"] = {"cached_tokens": 7}
    assert parse_response(doc, "chat")[1].cached_tokens == 7
    with pytest.raises(ValueError):
        parse_response({"choices": []}, "chat")


def test_stream_accumulator_joins_deltas_and_takes_the_usage_chunk():
    acc = StreamAccumulator("chat")
    for chunk in (
        {"choices": [{"delta": {"content": "he"}}]},
        {"choices": [{"delta": {"content": "llo"}}]},
        {
            "choices": [],
            "usage": {
                "prompt_tokens": 5,
                "completion_tokens": 2,
                "prompt_tokens_details": {"cached_tokens": 3},
            },
        },
    ):
        acc.feed(f"data: {json.dumps(chunk)}\n".encode())
    acc.feed(b"\n")
    acc.feed(b"data: [DONE]\n")
    assert (
        acc.text == "hello" and acc.done and acc.usage is not None and acc.usage.cached_tokens == 3
    )


@pytest.mark.parametrize(
    "status, body, stock",
    [
        (404, b"", True),
        (404, b"Not Found", True),
        (405, b"", True),
        (404, b'{"error": {"message": "unknown program", "type": "not_found_error"}}', False),
        (200, b"{}", False),
        (503, b"", False),
    ],
)
def test_release_unsupported_tells_a_stock_router_from_an_unknown_program(status, body, stock):
    assert release_unsupported(status, body) is stock
