"""A deterministic tokenizer, an append-only chat template and deterministic generated text.

Tokenizer. Text is cut into lines (each keeps its newline) and each line's UTF-8 bytes into
chunks of 4 bytes; a chunk *is* its token id (the bytes as a big-endian integer, zero-padded),
so decoding needs no vocabulary and ``encode(decode(ids)) == ids`` for any id sequence that
``encode`` produced. ASCII text comes out at just under 4 characters per token (the figure a
router uses to estimate tokens from characters); token boundaries re-align at every newline.
Chunk ids are >= 2^24; ids below that are special tokens. NUL characters are dropped.

Chat template (ChatML-like). Every message renders as
``<|im_start|> role\\n content <|im_end|> \\n`` and the generation prompt as
``<|im_start|> assistant\\n``, each part tokenized on its own. Rendering is therefore
append-only: turn k+1's prompt = turn k's prompt + turn k's output tokens + the tokens of the
new messages, so a multi-turn conversation hits the radix cache token for token.

Generated text. Answers are slices of a fixed pseudo-English corpus (pre-tokenized), starting
at an offset drawn from (seed, hash of the prompt): identical prompts get identical answers,
like greedy decoding, and the text of any slice re-tokenizes to the same ids. A request with
an explicit temperature > 0 mixes its rid into that hash (``request.SimRequest.sampled``):
identical prompts then get different answers, as sampling gives them.
"""

from __future__ import annotations

import json
import math
import random
import re
import sys
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

IM_START = 1
IM_END = 2
EOS = 3
SPECIAL_TOKENS = {IM_START: "<|im_start|>", IM_END: "<|im_end|>", EOS: "<|endoftext|>"}
_FIRST_CHUNK_ID = 1 << 24

_LINE = re.compile(r"[^\n]*\n|[^\n]+")
_LITTLE = sys.byteorder == "little"

_WORDS = (
    "the of and to in is that for it as with was on be by this are or at from an which but not "
    "have has all can will one we they file line code function test value error return case "
    "class module change check output input run command path patch fix issue bug call data "
    "list result should would could now then first next also only when where because update "
    "method type string number config build server request model token cache memory time step "
    "let me look into see if works need add remove use make sure again here there"
).split()


def pack(ids: Iterable[int] | bytes | array) -> bytes:
    """Token ids as packed native uint32 bytes (the engine's internal form)."""
    if isinstance(ids, bytes):
        return ids
    if isinstance(ids, array) and ids.typecode == "I":
        return ids.tobytes()
    return array("I", ids).tobytes()


def unpack(packed: bytes) -> array:
    a = array("I")
    a.frombytes(packed)
    return a


class Tokenizer:
    """Byte-chunk tokenizer with a bounded cache of encoded segments."""

    def __init__(self, cache_tokens: int = 8_000_000) -> None:
        self._cache: OrderedDict[str, array] = OrderedDict()
        self._cache_tokens = 0
        self._cache_limit = cache_tokens

    @staticmethod
    def encode_uncached(text: str) -> array:
        out = array("I")
        for line in _LINE.findall(text.replace("\x00", "")):
            b = line.encode()
            pad = -len(b) % 4
            out.frombytes(b + b"\0" * pad if pad else b)
        if _LITTLE:
            out.byteswap()
        return out

    def encode(self, text: str) -> array:
        """Token ids of ``text`` (cached: chat histories resend the same messages every turn)."""
        hit = self._cache.get(text)
        if hit is not None:
            self._cache.move_to_end(text)
            return hit
        ids = self.encode_uncached(text)
        if len(text) >= 32:
            self._cache[text] = ids
            self._cache_tokens += len(ids)
            while self._cache_tokens > self._cache_limit and self._cache:
                _, old = self._cache.popitem(last=False)
                self._cache_tokens -= len(old)
        return ids

    @staticmethod
    def token_bytes(tid: int, skip_special: bool = True) -> bytes:
        if tid < _FIRST_CHUNK_ID:
            return b"" if skip_special else SPECIAL_TOKENS.get(tid, f"<|{tid}|>").encode()
        return tid.to_bytes(4, "big").rstrip(b"\0")

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        tb = self.token_bytes
        return b"".join(tb(t, skip_special) for t in ids).decode("utf-8", errors="replace")


class ChatTemplate:
    """Append-only ChatML-like template over a Tokenizer."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tok = tokenizer
        self._nl = tokenizer.encode_uncached("\n")
        self._role: dict[str, array] = {}

    def _role_ids(self, role: str) -> array:
        ids = self._role.get(role)
        if ids is None:
            ids = self._role[role] = array("I", [IM_START]) + self.tok.encode_uncached(role + "\n")
        return ids

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[Any] | None = None,
        add_generation_prompt: bool = True,
    ) -> array:
        out = array("I")
        if tools:
            out += self._segment("system", "# Tools\n" + json.dumps(list(tools), sort_keys=True))
        for m in messages:
            if not isinstance(m, dict) or "role" not in m:
                raise ValueError("each message must be an object with a role")
            out += self._segment(str(m["role"]), message_text(m))
        if add_generation_prompt:
            out += self._role_ids("assistant")
        return out

    def _segment(self, role: str, text: str) -> array:
        return self._role_ids(role) + self.tok.encode(text) + array("I", [IM_END]) + self._nl


def message_text(m: dict[str, Any]) -> str:
    """The text a message contributes: string content, text parts, tool calls as JSON."""
    content = m.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, dict) and p.get("type") in ("text", "input_text", "output_text"):
                parts.append(str(p.get("text", "")))
            elif isinstance(p, str):
                parts.append(p)
            else:
                parts.append("[media]")
        text = "".join(parts)
    else:
        raise ValueError("message content must be a string, a list of parts or null")
    for call in m.get("tool_calls") or ():
        fn = call.get("function", {}) if isinstance(call, dict) else {}
        text += "\n<tool_call>" + json.dumps({"name": fn.get("name"), "arguments": fn.get("arguments")}) + "</tool_call>"
    return text


@lru_cache(maxsize=1)
def _corpus() -> array:
    """64 Ki tokens of pseudo-English on one line: every chunk is 4 bytes, so any slice of it
    decodes to text that encodes back to the same slice (wrap-around included)."""
    rng = random.Random(20260213)
    words: list[str] = []
    size = 0
    while size < 4 * 65536:
        w = rng.choice(_WORDS) + ("." if len(words) % 11 == 10 else "")
        words.append(w)
        size += len(w) + 1
    text = " " + " ".join(words)[: 4 * 65536 - 1]
    return Tokenizer.encode_uncached(text)


def prompt_digest(packed: bytes) -> int:
    """A stable 32-bit digest of a packed prompt."""
    return zlib.crc32(packed)


def generate_output(seed: int, digest: int, n: int) -> array:
    """``n`` deterministic answer tokens for a prompt digest (the same for the same seed)."""
    corpus = _corpus()
    size = len(corpus)
    off = zlib.crc32(f"{seed}:{digest}".encode()) % size
    out = corpus[off : off + n]
    while len(out) < n:
        out += corpus[: n - len(out)]
    return out


def sample_length(seed: int, digest: int, median: float, sigma: float, cap: int) -> int:
    """Answer length in lognormal mode: min(cap, round(lognormal(median, sigma))) ≥ 1."""
    rng = random.Random(zlib.crc32(f"len:{seed}:{digest}".encode()))
    return max(1, min(cap, int(round(median * math.exp(sigma * rng.gauss(0.0, 1.0))))))
