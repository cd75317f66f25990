"""Program inference: the program of a chat request that names none.

An agent framework run unmodified sends no ``program_id``, no ``X-Program-Id`` and no
``X-SMG-Routing-Key``. Its requests still say which program they belong to: an agent's next
request is its previous request's messages, plus the answer the router relayed, plus what
happened since (tool output, user feedback). The rule:

1. **Normalise** each message to ``role`` + its text + its tool calls, and nothing else. The
   text is the content string, or the text parts of a list of parts (image parts by URL),
   stripped of surrounding whitespace; ``developer`` counts as ``system``. A tool call is its
   function name and its arguments, parsed as JSON and written back with sorted keys (as they
   are, stripped, when not JSON). Ignored: ``name``, tool-call ids, ``tool_call_id``, the
   ``reasoning_content``/``reasoning`` fields, and every other key. So a conversation
   re-serialised by a client — other whitespace in the arguments, other key order, a fresh
   tool-call id, the reasoning dropped from the assistant turn — normalises the same.
2. **Chain**: ``h₀ = ∅``, ``hᵢ = blake2b(hᵢ₋₁ ‖ norm(mᵢ))`` (16 bytes). ``hᵢ`` names the
   conversation's first i messages, whatever comes after them.
3. **Record**: when the answer to a request of n messages is relayed, two chains are indexed
   to the program: its *expectation* ``h_{n+1}`` — the request's messages plus the answer as
   an assistant message — and its *head* ``hₙ``, the request's messages alone. A client
   continues from the expectation; the head covers a client that drops an answer from its
   history (mini-swe-agent 2.x does with an answer it cannot parse: its next request is the
   previous one plus the format error). A program keeps the chains of its whole life (32
   bytes a step), so a client that resends an earlier step still lands in it.
4. **Match** a request of m messages by its chain, longest prefix first: the first ``hᵢ``
   that is an expectation, or a head with ``i < m`` (a head matches only a request that adds
   to it: an agent's first request is every agent's head with that system prompt and task),
   decides. One program there: the request is that program's (``matched``). Several: the
   request is routed statelessly and counted (``ambiguous``), never merged. None: a new
   program (``new``), named ``inf-`` and 16 hex digits, admitted like one whose client named
   it. (Its first request could go statelessly instead, the program made at its second: on
   the real CPU engine that let every agent's first step in past admission — a batch of 37
   where thunder ran 9 — and lost 10% of the steps and 26 points of KV hit rate against
   explicit ids, ``bench/results/grid-cpu-real-1e-6r/``.) Two live conversations with an identical
   head — RL samples of one task, agents that share a system prompt and a task — are told
   apart by the answers they received, which are in their expectations; agents whose
   requests are byte for byte the same (the same task, and answers dropped or identical)
   cannot be, and stay ``ambiguous``. An ambiguous request marks its head *contested*
   (``keep_seconds``, at most ``max_programs`` of them): a later request that adds to that
   head is ambiguous too, even where one program also has it as a head. Identical agents on a
   busy machine need this: one agent's second step can arrive while its program is the only
   one yet answered, and is rightly matched; without the mark every other agent's later steps,
   byte for byte that program's, would continue it alone and land in it.
5. **Forget** a program's chains after ``keep_seconds`` without a match, and the oldest
   program's past ``max_programs``. The program itself is paused, dormant, once idle past its
   tools (``inferred_pause_seconds``, ``Program.dormant``: a finished agent cannot say so),
   and released earlier than its chains are forgotten, by its idle timeout
   (``inferred_idle_seconds``): its record outlives it, so an agent that comes back
   after a long tool lands in a program of the same id again, re-created, not in another.

6. **Prompts** (``/v1/completions`` with one prompt, ``/generate`` with ``text`` or
   ``input_ids``, not streamed): a prompt has no message boundaries, so rules 1–2 become the
   prompt's bytes — its UTF-8 text, or its token ids as 8-byte integers, the two kept apart by
   a tag — hashed whole (``blake2b``, 16 bytes). The expectation is the prompt plus the answer's
   text (or its ``output_ids``), the head the prompt alone; both are indexed with their length.
   A prompt is matched at every length the index holds that is no longer than it, longest
   first wins: one pass of the hash over the prompt, a copy of its state at each such length
   (``match_prompt``; a few microseconds a live program), not a hash per length. A head again
   matches only a prompt that adds to it. Nothing is normalised: an agent that sends the answer
   back changed (stripped, re-tokenized text as token ids) continues no program. ``/generate``
   streams are not inferred (SGLang streams its text cumulatively or in deltas depending on a
   server flag the router cannot see), nor batches (a list of prompts, ``n`` > 1). A prompt
   that continues nothing is sent statelessly and recorded; its program is made at the first
   request that continues it (the gateway, ``Gateway.infer_prompt``): prompt routes carry
   one-shot traffic as often as agents, and a one-shot request made a program would wait for
   admission and hold a place.

7. **The end sign** (``end_hint``): a client without ids cannot release its program, but its
   last answer often says the agent is done. *Sign*: a tool call named in
   ``programs.inferred_end_tools`` (OpenHands' ``finish``, SWE-agent's ``submit``, Cline's
   ``attempt_completion``), or a marker of ``programs.inferred_end_markers`` in the text or a
   tool call's arguments (mini-swe-agent's ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``, in its
   last command). *Plain*: the request offered ``tools`` and the answer calls none (an OpenAI
   Agents SDK run ends with such a final output, but a model that forgot its tools answers the
   same). *Context overflow* (``context_overflow``): the engine refused the program's request
   because its prompt, or prompt plus ``max_tokens``, exceeds the model's context (SGLang
   0.5.23's 400, ``context_overflow()``): mini-swe-agent stops there (litellm maps the 400 to
   ``ContextWindowExceededError``, one of its abort exceptions), an OpenAI SDK client raises,
   and an agent that condenses its history sends a conversation that continues none (a new
   program). The hint is only evidence: the controller learns, per kind, how often a program
   with that last answer came back (``programs.lengths``) and the dormant pause weighs it.

The index is pure and deterministic (no clock of its own, no I/O); the gateway calls it from
the inference route (``match``, ``match_prompt``) and from the proxy when an answer is relayed
(``answered``, ``answered_prompt``).
"""

from __future__ import annotations

import bisect
import hashlib
import os
from array import array
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

_CONTESTED = frozenset({""})
"""The owner a contested head adds (rule 4): no program's, so a match there is ambiguous."""
DIGEST = 16
"""Bytes of a chain hash."""
SEP = b"\x1e"


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict):
                if isinstance(part.get("text"), str):
                    out.append(part["text"])
                elif isinstance(part.get("image_url"), dict):
                    out.append(f"<image {part['image_url'].get('url', '')}>")
        return "".join(out).strip()
    return str(content).strip()


def _arguments(args: Any) -> bytes:
    if isinstance(args, str):
        try:
            args = orjson.loads(args)
        except orjson.JSONDecodeError:
            return args.strip().encode()
    try:
        return orjson.dumps(args, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return str(args).encode()


def normalise(m: Any) -> bytes:
    """The bytes of one message that identify it (rule 1)."""
    if not isinstance(m, dict):
        return b"?" + str(m).encode()
    role = m.get("role")
    role = "system" if role == "developer" else str(role)
    parts = [role.encode(), _text(m.get("content")).encode()]
    calls = m.get("tool_calls")
    if isinstance(calls, list):
        for c in calls:
            fn = c.get("function") if isinstance(c, dict) else None
            if isinstance(fn, dict):
                parts.append(str(fn.get("name", "")).encode() + b"(" + _arguments(fn.get("arguments")) + b")")
    return SEP.join(parts)


def chain(messages: Sequence[Any], start: bytes = b"") -> list[bytes]:
    """``h₁ … hₙ`` of the messages (rule 2), continuing from ``start``."""
    out = []
    h = start
    for m in messages:
        h = hashlib.blake2b(h + SEP + normalise(m), digest_size=DIGEST).digest()
        out.append(h)
    return out


@dataclass
class Match:
    kind: str
    """``matched``, ``new`` or ``ambiguous``."""
    program_id: str | None
    """The program (None when ambiguous)."""
    head: bytes
    """``hₙ`` of the request's messages: the start of its expectation once answered."""


@dataclass
class _Record:
    expectations: list[bytes] = field(default_factory=list)
    heads: list[bytes] = field(default_factory=list)
    prompts: list[tuple[bytes, int, bool]] = field(default_factory=list)
    """Its prompt keys (rule 6): (hash, prompt length, a head)."""
    last: float = 0.0


_TEXT, _TOKENS = b"thunder-prompt-text\x00", b"thunder-prompt-ids\x00"


@dataclass(slots=True)
class PromptHead:
    """A prompt's hash state (rule 6): its answer continues it into the expectation."""

    state: Any
    """``blake2b`` after the tag and the prompt's bytes."""
    length: int
    """Bytes of the prompt."""
    tokens: bool
    """Token ids (else text)."""


def prompt_bytes(prompt: Any) -> tuple[bytes, bool] | None:
    """The bytes of a single prompt (rule 6) and whether they are token ids; None for what is
    not one prompt (a batch, a list of strings, nothing)."""
    if isinstance(prompt, str):
        return prompt.encode(), False
    if isinstance(prompt, list) and prompt and all(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
        try:
            return array("q", prompt).tobytes(), True
        except OverflowError:
            return None
    return None


class Conversations:
    """The index of rule 3–5: expectation → programs, and each program's record."""

    def __init__(self, keep_seconds: float, max_programs: int, prefix: str = "inf-") -> None:
        self.keep_seconds = keep_seconds
        self.max_programs = max_programs
        self.prefix = prefix
        self._index: dict[bytes, set[str]] = {}  # expectation → programs
        self._heads: dict[bytes, set[str]] = {}  # head → programs
        self._records: OrderedDict[str, _Record] = OrderedDict()  # least recently matched first
        self._plens: Counter[int] = Counter()  # prompt key lengths (rule 6) → keys of that length
        self._plens_sorted: list[int] = []
        self._contested: OrderedDict[bytes, float] = OrderedDict()  # heads of ambiguous requests → when
        self.counts = {"matched": 0, "new": 0, "ambiguous": 0, "busy": 0, "overflow": 0}
        """Requests by outcome, each once; the gateway moves a ``matched`` or ``new`` one
        (``recount``) to ``busy``, its program had a request out already, or ``overflow``, the
        router had no room to track another program (``max_programs``,
        ``max_waiting_programs``): both sent statelessly."""

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, pid: str) -> bool:
        return pid in self._records

    def match(self, messages: Sequence[Any], now: float) -> Match:
        """The program of a request with these messages (rule 4), counted by kind."""
        hs = chain(messages)
        head = hs[-1] if hs else b""
        last = len(hs) - 1
        for i in range(last, -1, -1):
            owners = self._owners(hs[i], i < last)
            if owners:
                return self._decide(owners, head, now)
        return self._decide(None, head, now)

    def match_prompt(self, prompt: bytes, tokens: bool, now: float) -> tuple[Match, PromptHead]:
        """The program of a request with this prompt (rule 6), counted as ``match`` counts;
        with the prompt's hash state, which its answer continues."""
        h = hashlib.blake2b(_TOKENS if tokens else _TEXT, digest_size=DIGEST)
        view, n, pos = memoryview(prompt), len(prompt), 0
        owners: set[str] | None = None
        lengths = self._plens_sorted
        for length in lengths[:bisect.bisect_right(lengths, n)]:
            h.update(view[pos:length])
            pos = length
            found = self._owners(h.copy().digest(), length < n)
            if found:
                owners = found  # longer wins
        h.update(view[pos:])
        return self._decide(owners, b"", now), PromptHead(h, n, tokens)

    def _owners(self, key: bytes, heads: bool) -> set[str] | None:
        """The programs whose expectation is ``key`` and, with ``heads``, whose head is (rule 4:
        a head matches only a request that adds to it)."""
        owners = self._index.get(key)
        if heads:
            also = self._heads.get(key)
            if also:
                owners = also if not owners else owners | also
            if key in self._contested:
                owners = _CONTESTED if not owners else owners | _CONTESTED
        return owners

    def _decide(self, owners: set[str] | None, head: bytes, now: float) -> Match:
        """The match of rule 4 from the owners of the longest prefix that has any, counted."""
        if not owners:
            self.counts["new"] += 1
            return Match("new", self.prefix + os.urandom(8).hex(), head)
        if len(owners) > 1 or "" in owners:
            self.counts["ambiguous"] += 1
            if head:
                self._contested[head] = now
                self._contested.move_to_end(head)
                self._expire_contested(now)
            return Match("ambiguous", None, head)
        pid = next(iter(owners))
        self._touch(pid, now)
        self.counts["matched"] += 1
        return Match("matched", pid, head)

    def answered_prompt(self, pid: str, head: PromptHead, answer: dict[str, Any], now: float) -> None:
        """The answer to ``pid``'s prompt request was relayed (``answer_of``): index the
        expectation it makes and the head, with their lengths (rule 6)."""
        if head.tokens:
            ids = answer.get("output_ids")
            more = prompt_bytes(ids) if isinstance(ids, list) else None
            if more is None:
                return
            extra = more[0]
        else:
            text = answer.get("content")
            if not isinstance(text, str):
                return
            extra = text.encode()
        h = head.state.copy()
        h.update(extra)
        rec = self._touch(pid, now)
        for key, length, is_head in ((h.digest(), head.length + len(extra), False),
                                     (head.state.digest(), head.length, True)):
            entry = (key, length, is_head)
            if entry in rec.prompts:
                continue
            rec.prompts.append(entry)
            (self._heads if is_head else self._index).setdefault(key, set()).add(pid)
            self._add_length(length)
        self.expire(now)

    def _add_length(self, length: int) -> None:
        if self._plens[length] == 0:
            bisect.insort(self._plens_sorted, length)
        self._plens[length] += 1

    def _drop_length(self, length: int) -> None:
        self._plens[length] -= 1
        if self._plens[length] <= 0:
            del self._plens[length]
            i = bisect.bisect_left(self._plens_sorted, length)
            if i < len(self._plens_sorted) and self._plens_sorted[i] == length:
                del self._plens_sorted[i]

    def recount(self, kind: str, outcome: str) -> None:
        """A request ``match`` counted as ``kind`` went otherwise (``busy``, ``overflow``):
        every request is counted once, by what was done with it."""
        self.counts[kind] -= 1
        self.counts[outcome] += 1

    def answered(self, pid: str, head: bytes, answer: dict[str, Any], now: float) -> None:
        """The answer to ``pid``'s request (whose chain ended at ``head``) was relayed: index
        the expectation it makes, and the head (rule 3)."""
        h = chain([{**answer, "role": "assistant"}], head)[0]
        rec = self._touch(pid, now)
        for mine, index, key in ((rec.expectations, self._index, h), (rec.heads, self._heads, head)):
            if key and key not in mine:
                mine.append(key)
                index.setdefault(key, set()).add(pid)
        self.expire(now)

    def _touch(self, pid: str, now: float) -> _Record:
        """``pid``'s record, made if new, as the most recently used."""
        rec = self._records.get(pid)
        if rec is None:
            rec = self._records[pid] = _Record()
        else:
            self._records.move_to_end(pid)
        rec.last = now
        return rec

    def forget(self, pid: str) -> None:
        rec = self._records.pop(pid, None)
        if rec is None:
            return
        keys = [(h, self._index) for h in rec.expectations] + [(h, self._heads) for h in rec.heads]
        keys += [(h, self._heads if is_head else self._index) for h, _, is_head in rec.prompts]
        for h, index in keys:
            owners = index.get(h)
            if owners is not None:
                owners.discard(pid)
                if not owners:
                    del index[h]
        for _, length, _ in rec.prompts:
            self._drop_length(length)

    def expire(self, now: float) -> int:
        """Forget the records unmatched for ``keep_seconds``, and the oldest beyond
        ``max_programs`` (rule 5). Returns how many were forgotten."""
        n = 0
        while self._records:
            pid, rec = next(iter(self._records.items()))
            if len(self._records) <= self.max_programs and now - rec.last <= self.keep_seconds:
                break
            self.forget(pid)
            n += 1
        self._expire_contested(now)
        return n

    def _expire_contested(self, now: float) -> None:
        contested = self._contested
        while contested:
            key, when = next(iter(contested.items()))
            if len(contested) <= self.max_programs and now - when <= self.keep_seconds:
                break
            del contested[key]


SIGN = "sign"
"""``end_hint``: a tool call or marker that ends the agent (rule 7)."""
PLAIN = "plain"
"""``end_hint``: tools were offered and none was called (rule 7)."""
CONTEXT_OVERFLOW = "context_overflow"
"""``end_hint``: the engine refused the request for the model's context length (rule 7)."""
END_HINTS = (SIGN, PLAIN, CONTEXT_OVERFLOW)

_OVERFLOW_MESSAGES = (
    "is longer than the model's context length",  # tokenizer manager: the input alone
    "exceeds the model's maximum context length",  # tokenizer manager: input + max_new_tokens
    "exceeds the maximum allowed length",  # scheduler: input beyond max_req_input_len
)
"""SGLang 0.5.23's refusals of a request too long for the model (``tokenizer_manager.
_validate_one_request``, ``managers.utils.validate_input_length``); the first two were read off
the real CPU engine (``tests/data/sglang-context-overflow.json``)."""


def context_overflow(status: int, body: bytes) -> bool:
    """Whether a worker's error answer refuses the request for the model's context length
    (rule 7, *overflow*): a 400 whose message is one of SGLang's, or OpenAI's
    ``context_length_exceeded`` code."""
    if status != 400 or not body:
        return False
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        text = body[:2000].decode(errors="replace")
        return any(m in text for m in _OVERFLOW_MESSAGES)
    if not isinstance(obj, dict):
        return False
    err = obj.get("error") if isinstance(obj.get("error"), dict) else obj
    if err.get("code") == "context_length_exceeded":
        return True
    msg = err.get("message")
    return isinstance(msg, str) and any(m in msg for m in _OVERFLOW_MESSAGES)


def end_hint(answer: dict[str, Any] | None, tools_offered: bool, end_tools: frozenset[str],
             end_markers: Sequence[str]) -> str | None:
    """Whether a relayed chat answer looks like the agent's last (rule 7): ``SIGN``, ``PLAIN``
    or None."""
    if not isinstance(answer, dict):
        return None
    calls = answer.get("tool_calls")
    calls = [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
    texts = [answer.get("content")]
    for c in calls:
        fn = c.get("function")
        if isinstance(fn, dict):
            if fn.get("name") in end_tools:
                return SIGN
            texts.append(fn.get("arguments"))
    if end_markers:
        for t in texts:
            if t is not None and not isinstance(t, str):
                t = _text(t) if isinstance(t, list) else str(t)
            if t and any(m in t for m in end_markers):
                return SIGN
    if tools_offered and not calls:
        return PLAIN
    return None


def answer_message(obj: Any) -> dict[str, Any] | None:
    """The assistant message of a chat completion's first choice (None if it has none)."""
    if not isinstance(obj, dict):
        return None
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    msg = choices[0].get("message")
    return msg if isinstance(msg, dict) else None


def answer_of(route: str, obj: Any) -> dict[str, Any] | None:
    """The answer a non-stream response relays, for ``answered`` (chat: the assistant message)
    or ``answered_prompt`` (completions: ``{"content": text}``; ``/generate``: its ``text`` as
    ``content`` and its ``output_ids``). None when it has none."""
    if route == "chat":
        return answer_message(obj)
    if not isinstance(obj, dict):
        return None
    if route == "generate":
        return {"content": obj.get("text"), "output_ids": obj.get("output_ids")}
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    return {"content": choices[0].get("text")}


class StreamAnswer:
    """The assistant message of a chat stream's first choice, from its deltas: the content
    concatenated, and each tool call's name and argument fragments by index."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}

    def feed(self, obj: Any) -> None:
        if not isinstance(obj, dict):
            return
        for ch in obj.get("choices") or ():
            if not isinstance(ch, dict) or ch.get("index", 0) != 0:
                continue
            if isinstance(ch.get("text"), str):  # a completions stream
                self.content.append(ch["text"])
            d = ch.get("delta")
            if not isinstance(d, dict):
                continue
            if isinstance(d.get("content"), str):
                self.content.append(d["content"])
            for c in d.get("tool_calls") or ():
                if not isinstance(c, dict):
                    continue
                slot = self.calls.setdefault(int(c.get("index", 0) or 0), {"name": "", "arguments": ""})
                fn = c.get("function")
                if isinstance(fn, dict):
                    if isinstance(fn.get("name"), str):
                        slot["name"] += fn["name"]
                    if isinstance(fn.get("arguments"), str):
                        slot["arguments"] += fn["arguments"]

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": "".join(self.content)}
        if self.calls:
            msg["tool_calls"] = [{"type": "function", "function": self.calls[i]} for i in sorted(self.calls)]
        return msg
