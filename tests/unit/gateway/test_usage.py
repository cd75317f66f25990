"""Usage extraction and the SSE tap that passes streams through."""

from __future__ import annotations

import orjson
import pytest

from thunder_sgl.gateway.usage import SSETap, usage_from_body
from thunder_sgl.programs import Usage


def sse(obj) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


CHUNK = {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "hi"}}]}
USAGE = {"id": "c", "object": "chat.completion.chunk", "choices": [],
         "usage": {"prompt_tokens": 100, "completion_tokens": 8, "total_tokens": 108,
                   "prompt_tokens_details": {"cached_tokens": 64}}}


def test_usage_from_openai_and_generate_bodies():
    body = orjson.dumps({"choices": [], "usage": USAGE["usage"], "sglext": {"cached_tokens_details": {"device": 40, "host": 24}}})
    assert usage_from_body("chat", body) == Usage(100, 8, 64, 24, 0)
    g = orjson.dumps({"text": "x", "meta_info": {"prompt_tokens": 50, "completion_tokens": 4, "cached_tokens": 30,
                                                 "cached_tokens_details": {"device": 10, "host": 15, "storage": 5}}})
    assert usage_from_body("generate", g) == Usage(50, 4, 30, 15, 5)
    assert usage_from_body("chat", b"not json") is None
    assert usage_from_body("chat", orjson.dumps({"choices": []})) is None


@pytest.mark.parametrize("client_wants_usage", [True, False])
def test_tap_reads_usage_and_drops_the_usage_chunk_unless_asked(client_wants_usage):
    stream = sse(CHUNK) + sse(CHUNK) + sse(USAGE) + b"data: [DONE]\n\n"
    tap = SSETap("chat", client_wants_usage)
    out = b""
    for i in range(0, len(stream), 7):  # chunk boundaries that split events
        out += tap.feed(stream[i:i + 7])
    out += tap.flush()
    assert tap.usage == Usage(100, 8, 64, 0, 0) and tap.done
    assert (b'"usage"' in out) is client_wants_usage
    assert out.count(b'"content":"hi"') == 2 and out.endswith(b"data: [DONE]\n\n")


def test_tap_passes_content_chunks_through_byte_for_byte_and_buffers_a_partial_event():
    two = sse(CHUNK) + b": keep-alive\n\n" + sse(CHUNK)
    tap = SSETap("chat", False)
    assert tap.feed(two + b"data: {\"id\"") == two
    assert tap.feed(b': "c"}\n\n') == b'data: {"id": "c"}\n\n'
    assert tap.usage is None and not tap.done and tap.tokens_seen


def test_tap_strips_usage_riding_on_a_content_chunk():
    riding = dict(CHUNK, usage=USAGE["usage"])
    tap = SSETap("completions", False)
    out = tap.feed(sse(riding))
    assert tap.usage.prompt_tokens == 100 and b'"usage"' not in out and b'"content":"hi"' in out


def test_tap_on_generate_keeps_every_chunk_and_reads_the_last_meta_info():
    a = {"text": "a", "meta_info": {"prompt_tokens": 10, "completion_tokens": 1, "cached_tokens": 0}}
    b = {"text": "ab", "meta_info": {"prompt_tokens": 10, "completion_tokens": 2, "cached_tokens": 6}}
    tap = SSETap("generate", False)
    out = tap.feed(sse(a) + sse(b) + b"data: [DONE]\n\n")
    assert tap.usage == Usage(10, 2, 6) and out.count(b"meta_info") == 2


def test_worker_errors_are_rewrapped_in_openai_shape():
    from thunder_sgl.gateway.proxy import openai_shaped

    sglang = orjson.dumps({"object": "error", "message": "max_new_tokens must be >= 1", "type": "BadRequest",
                           "param": None, "code": 400})
    assert orjson.loads(openai_shaped(sglang, 400)) == {"error": {
        "message": "max_new_tokens must be >= 1", "type": "BadRequest", "param": None, "code": 400}}
    already = orjson.dumps({"error": {"message": "m", "type": "t", "param": None, "code": "c"}})
    assert openai_shaped(already, 400) == already
    assert orjson.loads(openai_shaped(b"plain text", 422))["error"] == {
        "message": "plain text", "type": "invalid_request_error", "param": None, "code": 422}
