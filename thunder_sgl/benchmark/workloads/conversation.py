"""One program's conversation on the wire: its texts (system prompt, task, observations, from
``thunder_sgl.textgen``), request bodies, headers and usage parsing (no I/O).

Shared by the asyncio driver and the locust user, so both send exactly the same bytes. The
conversation is append-only: each request's messages extend the previous request's by the
assistant reply *exactly as returned* and the next observation, so a prefix cache can reuse
everything up to the new observation.

A program is identified three ways, because routers differ: the body field ``program_id``
(what the OpenAI SDK's ``extra_body`` produces; the thunder router reads it), the header
``X-Program-Id``, and ``X-SMG-Routing-Key`` (stock ``sglang_router`` drops unknown body fields
and every header but this one, which it forwards to workers and its ``manual`` policy uses).
"""

from __future__ import annotations

import json
from typing import Any

from thunder_sgl.benchmark.workloads.profile import ProgramSpec
from thunder_sgl.programs import Usage
from thunder_sgl.textgen import text

APIS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
"""Supported OpenAI APIs → path."""


def program_headers(program_id: str) -> dict[str, str]:
    """Headers that carry the program id through both the thunder and the stock router."""
    return {"X-Program-Id": program_id, "X-SMG-Routing-Key": program_id}


def release_path(program_id: str) -> str:
    return f"/programs/{program_id}/release"


def release_unsupported(status: int, body: bytes) -> bool:
    """Whether a release answer means "this router has no program routes" (a stock router:
    405, or a 404 without the OpenAI error body the thunder router gives an unknown program)."""
    if status == 405:
        return True
    if status != 404:
        return False
    try:
        return not (isinstance(doc := json.loads(body), dict) and "error" in doc)
    except ValueError:
        return True


def system_prompt(profile_name: str, n_tokens: int) -> str:
    """The profile's shared system prompt: identical for every program of the profile."""
    return text(
        n_tokens, f"system:{profile_name}", head=f"You are {profile_name}, a software agent.\n"
    )


def instance_text(spec: ProgramSpec) -> str:
    """The first user message of ``spec`` (its task)."""
    return text(
        spec.instance_tokens, f"instance:{spec.program_id}", head=f"Task {spec.program_id}:\n"
    )


def history_reply_text(spec: ProgramSpec, step: int) -> str:
    """The assistant reply of a step before ``spec.start_step`` (a warm-started program's
    history: it was never asked of a model, so it is text of the step's output size)."""
    return text(spec.steps[step].output_tokens, f"reply:{spec.program_id}:{step}")


def observation_text(spec: ProgramSpec, step: int) -> str:
    """The tool observation appended after LLM call ``step`` of ``spec``."""
    s = spec.steps[step]
    return text(
        s.observation_tokens,
        f"obs:{spec.program_id}:{step}",
        head=f"<output step={step} tool={s.tool}>\n",
    )


class Conversation:
    """The growing request of one program (from ``spec.start_step``: the history before it is
    in the first request)."""

    def __init__(
        self,
        spec: ProgramSpec,
        system_text: str,
        *,
        model: str,
        api: str = "chat",
        stream: bool = False,
        max_tokens_cap: int | None = None,
        ignore_eos: bool = True,
        send_id: bool = True,
    ) -> None:
        """``send_id`` False: no program id in the body or the headers (an unmodified agent)."""
        self.send_id = send_id
        if api not in APIS:
            raise ValueError(f"unknown api {api!r}; valid: {sorted(APIS)}")
        self.spec = spec
        self.api = api
        self.path = APIS[api]
        self.model = model
        self.stream = stream
        self.max_tokens_cap = max_tokens_cap
        self.ignore_eos = ignore_eos
        self.messages: list[dict[str, str]] = [
            {"role": "system", "content": system_text},
            {"role": "user", "content": instance_text(spec)},
        ]
        for step in range(spec.start_step):
            self.add_reply(step, history_reply_text(spec, step))

    @property
    def program_id(self) -> str:
        return self.spec.program_id

    def headers(self) -> dict[str, str]:
        return program_headers(self.spec.program_id) if self.send_id else {}

    def body(self, step: int) -> dict[str, Any]:
        """The request of LLM call ``step`` (call ``add_reply`` for the previous steps first)."""
        max_tokens = self.spec.steps[step].output_tokens
        if self.max_tokens_cap is not None:
            max_tokens = min(max_tokens, self.max_tokens_cap)
        body: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens}
        if self.api == "chat":
            body["messages"] = list(self.messages)
        else:
            body["prompt"] = render_prompt(self.messages)
        if self.send_id:
            body["program_id"] = self.spec.program_id
        body["stream"] = self.stream
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        if self.ignore_eos:
            body["ignore_eos"] = True
        return body

    def add_reply(self, step: int, reply: str) -> None:
        """Append the reply of call ``step`` and, unless it was the last, its observation."""
        self.messages.append({"role": "assistant", "content": reply})
        if step + 1 < len(self.spec.steps):
            self.messages.append({"role": "user", "content": observation_text(self.spec, step)})


def render_prompt(messages: list[dict[str, str]]) -> str:
    """A plain-text transcript for ``/v1/completions``; append-only as messages are appended."""
    return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"


def parse_usage(usage: dict[str, Any] | None) -> Usage:
    """``Usage`` from an OpenAI usage object (cached tokens 0 when the server does not report them)."""
    usage = usage or {}
    details = usage.get("prompt_tokens_details") or {}
    return Usage(
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        cached_tokens=int(details.get("cached_tokens") or 0),
    )


def parse_response(doc: dict[str, Any], api: str) -> tuple[str, Usage]:
    """Reply text and usage of a non-streamed response; ``ValueError`` when it has no choice."""
    try:
        choice = doc["choices"][0]
        reply = choice["message"]["content"] if api == "chat" else choice["text"]
    except (KeyError, IndexError, TypeError) as e:
        raise ValueError(f"response without a choice: {str(doc)[:200]}") from e
    return reply or "", parse_usage(doc.get("usage"))


class StreamAccumulator:
    """Collects reply text and usage from server-sent-event lines of a streamed response."""

    def __init__(self, api: str) -> None:
        self.api = api
        self.parts: list[str] = []
        self.usage: Usage | None = None
        self.done = False

    def feed(self, line: bytes | str) -> None:
        if isinstance(line, bytes):
            line = line.decode()
        line = line.strip()
        if not line.startswith("data:"):
            return
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            return
        doc = json.loads(data)
        if "error" in doc:
            raise ValueError(f"error event in stream: {str(doc['error'])[:200]}")
        for choice in doc.get("choices") or []:
            piece = (
                (choice.get("delta") or {}).get("content")
                if self.api == "chat"
                else choice.get("text")
            )
            if piece:
                self.parts.append(piece)
        if doc.get("usage"):
            self.usage = parse_usage(doc["usage"])

    @property
    def text(self) -> str:
        return "".join(self.parts)
