"""A request trace with prefix-block hash ids (the Mooncake FAST'25 format), replayed open-loop.

Format (kvcache-ai/Mooncake ``FAST25-release/traces/*.jsonl``), one request a line::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ..., 2354]}

``timestamp`` is the arrival in milliseconds from the trace's start, ``hash_ids`` names the
prompt's 512-token blocks (``BLOCK_TOKENS``): block i of two requests is the same KV exactly
when their ids at i are equal (the ids are prefix hashes, so an equal id also means an equal
prefix up to it). The last block is partial: ``len(hash_ids) == ceil(input_length / 512)``.

Replay (``load_trace``): arrivals at ``timestamp / 1000 / speed`` seconds (``speed`` > 1
compresses the trace: more load on the same cluster), optionally only the first ``limit``
requests or those before ``until_s``.

Tokens (``BlockTokens``): block ``h`` is a fixed sequence of 512 token ids drawn from
``(seed, h)``; a prompt is its blocks' sequences concatenated, the last one cut to make exactly
``input_length`` tokens. Requests sharing their first k ids therefore share their first
``512·k`` tokens and nothing more, which is what the trace says about their KV. The text form
(``BlockTokens.text``, for HTTP and real mode) keeps the property under the simulator's
tokenizer: a block is one line of 4-character chunks ending in a newline, 512 tokens exactly.

Conversations (``conversations``), as live traffic would show them to a router that sees only
prompts: a request *continues* a conversation when its ids start with every full block of the
conversation's latest request (that request's prompt, less the partial block where the answer
and the next message begin) and that shares at least ``min_shared_blocks`` blocks (block 0,
a system prompt, is in every request of the Mooncake trace, so sharing it alone says nothing).
Of several, the longest wins (then the latest). A request that continues none starts a new
conversation; so does the second request extending the same one (a branch: the first took it).
A conversation's id is ``trace-<index of its first request>``. The DES drives thunder with these
ids (explicit ids); the answer never appears in the next prompt, as in the trace, so the
generated tokens' KV is never hit.

A conversation is a program: a turn is sent at its timestamp or, when the previous turn of the
same conversation has not been answered by then, as soon as it is (a user does not type the
next message before seeing the answer); conversations are independent of each other (open loop).
"""

from __future__ import annotations

import json
import math
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from thunder_sgl import textgen
from thunder_sgl.benchmark.des.tokens import random_ids

BLOCK_TOKENS = 512
"""Tokens per hash id (the Mooncake traces' block size)."""
TEXT_CACHE_BLOCKS = 20_000
"""Block texts kept (about 2 KB each)."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    index: int
    """Line of the trace (0-based, after any skipped lines)."""
    arrival_s: float
    """Seconds from the trace's start, after ``speed``."""
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    block: int = BLOCK_TOKENS
    """Tokens per hash id (512, or 512 / the token scale of ``load_trace``)."""

    @property
    def full_blocks(self) -> tuple[int, ...]:
        """Ids of the blocks that are full (all but a partial last one)."""
        return self.hash_ids[:self.input_length // self.block]


@dataclass
class Conversation:
    cid: str
    requests: list[TraceRequest] = field(default_factory=list)


def parse_line(line: str, index: int, speed: float = 1.0, token_scale: int = 1) -> TraceRequest:
    d = json.loads(line)
    ids = tuple(int(h) for h in d["hash_ids"])
    n, out = int(d["input_length"]), int(d["output_length"])
    if n < 1 or out < 1 or not ids:
        raise ValueError(f"trace line {index + 1}: need input_length >= 1, output_length >= 1 and hash_ids")
    if math.ceil(n / BLOCK_TOKENS) != len(ids):
        raise ValueError(f"trace line {index + 1}: {len(ids)} hash ids for {n} tokens "
                         f"(want ceil({n}/{BLOCK_TOKENS}))")
    if token_scale > 1:  # ceil(ceil(n / k) / (512 / k)) == ceil(n / 512): the same ids
        n, out = -(-n // token_scale), max(1, round(out / token_scale))
    return TraceRequest(index, float(d["timestamp"]) / 1000.0 / speed, n, out, ids, BLOCK_TOKENS // token_scale)


def load_trace(path: str | Path, speed: float = 1.0, limit: int | None = None,
               until_s: float | None = None, token_scale: int = 1) -> list[TraceRequest]:
    """The trace's requests in arrival order: timestamps / ``speed``, the first ``limit``
    requests, those arriving before ``until_s`` (after ``speed``). ``token_scale`` k (a divisor
    of 512) shrinks every request for a small engine: blocks of 512 / k tokens, input and output
    lengths / k, the same hash ids (so the same sharing)."""
    if speed <= 0:
        raise ValueError("trace speed must be > 0")
    if token_scale < 1 or BLOCK_TOKENS % token_scale:
        raise ValueError(f"trace token scale must divide {BLOCK_TOKENS}")
    out: list[TraceRequest] = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            if limit is not None and len(out) >= limit:
                break
            r = parse_line(line, len(out), speed, token_scale)
            if until_s is not None and r.arrival_s > until_s:
                break
            out.append(r)
    out.sort(key=lambda r: (r.arrival_s, r.index))
    return out


def conversations(requests: list[TraceRequest], min_shared_blocks: int = 2) -> list[Conversation]:
    """Group requests into conversations by the prefix rule of the module header, in order of
    their first request."""
    convs: list[Conversation] = []
    tips: dict[tuple[int, ...], list[Conversation]] = {}
    """Full blocks of each conversation's latest request → the conversations (latest last)."""
    for r in requests:
        ids = r.hash_ids
        found: Conversation | None = None
        for k in range(len(ids), max(1, min_shared_blocks) - 1, -1):
            cands = tips.get(ids[:k])
            if cands:
                found = cands.pop()
                if not cands:
                    del tips[ids[:k]]
                break
        if found is None:
            found = Conversation(f"trace-{r.index}")
            convs.append(found)
        found.requests.append(r)
        tips.setdefault(r.full_blocks, []).append(found)
    return convs


def summary(requests: list[TraceRequest], convs: list[Conversation]) -> dict[str, float]:
    """Counts of a (loaded) trace: requests, conversations, tokens, and the share of prompt
    tokens in blocks an earlier request had (the KV hit rate of an infinite cache)."""
    seen: set[int] = set()
    reused = 0
    for r in requests:
        for i, h in enumerate(r.hash_ids):
            if h in seen:
                reused += min(r.block, r.input_length - i * r.block)
            seen.add(h)
    prompt = sum(r.input_length for r in requests)
    span = requests[-1].arrival_s - requests[0].arrival_s if requests else 0.0
    return {
        "requests": len(requests), "conversations": len(convs),
        "multi_turn": sum(1 for c in convs if len(c.requests) > 1),
        "prompt_tokens": prompt, "output_tokens": sum(r.output_length for r in requests),
        "reusable_share": reused / prompt if prompt else 0.0, "span_s": span,
        "requests_per_s": len(requests) / span if span > 0 else 0.0,
    }


class BlockTokens:
    """The token ids (and text) of trace prompts: block ``h`` ↦ ids fixed by ``(seed, h)``."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self._cache: dict[int, bytes] = {}
        self._texts: OrderedDict[tuple[int, int, str], str] = OrderedDict()
        """Recent block texts (LRU): a replay's prompts repeat their blocks."""

    def block(self, h: int, size: int = BLOCK_TOKENS) -> bytes:
        """Packed native uint32 ids of block ``h`` (``size`` of them, ≥ 2^24: never special tokens)."""
        b = self._cache.get(h)
        if b is None or len(b) != 4 * size:
            rng = np.random.default_rng([self.seed & 0xFFFFFFFF, 0x7ACE, h & 0xFFFFFFFFFFFF])
            b = random_ids(rng, size)
            if len(self._cache) < 200_000:
                self._cache[h] = b
        return b

    def prompt(self, r: TraceRequest) -> bytes:
        """Packed ids of ``r``'s prompt: exactly ``input_length`` of them."""
        parts = [self.block(h, r.block) for h in r.hash_ids]
        parts[-1] = parts[-1][: 4 * (r.input_length - r.block * (len(r.hash_ids) - 1))]
        return b"".join(parts)

    def block_text(self, h: int, size: int = BLOCK_TOKENS, style: str = "sim") -> str:
        """Text of block ``h``, a pure function of ``(seed, h, size, style)``. ``sim``: one line of
        ``size`` − 1 four-letter chunks and a last three-letter chunk with the newline, ``size``
        tokens exactly under the simulator's tokenizer (4 bytes a token, boundaries re-aligned at
        each newline). ``words``: ``textgen.text`` of ``size`` tokens ending in a newline (about
        ``size`` tokens under the real engine's word-trained tokenizer)."""
        key = (h, size, style)
        t = self._texts.get(key)
        if t is not None:
            self._texts.move_to_end(key)
            return t
        if style == "words":
            t = textgen.text(size, f"trace-block:{self.seed}:{h}")[:-1] + "\n"
        else:
            rng = np.random.default_rng([self.seed & 0xFFFFFFFF, 0x7E47, h & 0xFFFFFFFFFFFF])
            letters = (rng.integers(0, 26, size=4 * size, dtype=np.uint8) + ord("a")).tobytes().decode()
            t = letters[:-1] + "\n"
        self._texts[key] = t
        if len(self._texts) > TEXT_CACHE_BLOCKS:
            self._texts.popitem(last=False)
        return t

    def text(self, r: TraceRequest, style: str = "sim") -> str:
        """``r``'s prompt as text: its blocks' texts, the last cut to the tokens left (4
        characters a token; a cut block ends in a newline too, so it stays one line)."""
        parts = [self.block_text(h, r.block, style) for h in r.hash_ids]
        last = r.input_length - r.block * (len(r.hash_ids) - 1)
        if last < r.block:
            parts[-1] = parts[-1][: 4 * last - 1] + "\n"
        return "".join(parts)


def trace_name(path: str | Path) -> str:
    """A short name of a trace file (its stem)."""
    p = Path(path)
    return p.stem if p.stem else f"trace-{zlib.crc32(str(p).encode()):08x}"
