"""Deterministic English-like text of a given size in tokens.

The workload states sizes in tokens; requests carry text. We assume ~4 characters per token
(``CHARS_PER_TOKEN``): ``text(n, key)`` is exactly ``4·n`` characters of short common words
(mean word plus separator ≈ 4 characters, so a word-level tokenizer also counts ≈ n). Real
token counts come from the server's ``usage``; nothing downstream relies on this estimate
being exact.

Text is a pure function of its key. The benchmark's programs key their system prompt by the
profile name only (byte-identical across the profile's programs, so prefix caches share it), an
instance or an observation by program id and step (``benchmark.workloads.conversation``);
the real engine's tokenizer is trained on the same words (``engine.models``), so a token there
is ≈ 4 characters too.
"""

from __future__ import annotations

import math
import random

CHARS_PER_TOKEN = 4
"""Characters per token assumed when turning a token count into text."""

WORDS = tuple(
    """a an as at be by do go he if in is it me my no of oh ok on or so to up us we
    add age all and any are bar bin bit box bug but can cat cut day dir end env err few
    fix for get git has how key let log map max may min new not now off old one out put
    raw ref row run see set src sum tab the top try two use val was way who why yes you
    also base call case code copy data diff done each edit file find from have here into
    just last line list load look make mode more must name need next node only open path
    read repo same save show size step test that then this time type unit used view what
    when with work""".split()
)
"""Short common words (mean length ≈ 3 letters)."""


def estimate_tokens(text: str) -> int:
    """Tokens of ``text`` under the ~4 characters per token assumption."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def text(n_tokens: int, key: str, head: str = "") -> str:
    """``head`` followed by English-like words, ``CHARS_PER_TOKEN · n_tokens`` characters in all
    (just ``head`` when it is longer). The same (n_tokens, key, head) gives the same bytes."""
    size = max(0, n_tokens) * CHARS_PER_TOKEN
    if len(head) >= size:
        return head
    rng = random.Random(f"thunder-text:{key}")
    parts = [head]
    length = len(head)
    words = 0
    while length < size:
        w = rng.choice(WORDS)
        words += 1
        sep = ".\n" if words % 97 == 0 else (". " if words % 13 == 0 else " ")
        parts.append(w)
        parts.append(sep)
        length += len(w) + len(sep)
    body = "".join(parts)[:size]
    # A trailing separator would be stripped by some clients; end on a full stop instead.
    return body[:-1] + "." if body[-1].isspace() else body
