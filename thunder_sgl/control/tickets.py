"""What the controller takes and gives, without behaviour: a request (``Ticket``), the counters
it keeps (``Stats``) and what a tick did (``TickResult``)."""

from __future__ import annotations

import hashlib
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any

from thunder_sgl.backends.backend import Backend
from thunder_sgl.control.windows import Closed
from thunder_sgl.programs import Program
from thunder_sgl.scheduler import Decisions

if TYPE_CHECKING:
    from thunder_sgl.control.conversations import PromptHead


def prefix_key_of(text: str) -> str:
    """Identity of a shared prefix (e.g. the system prompt)."""
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


@dataclass(eq=False)
class Ticket:
    """One client request as the controller sees it. Every field but the program id is named
    at construction."""

    program_id: str | None
    _: KW_ONLY
    prompt_chars: int = 0
    """Size of the prompt text, to estimate tokens before usage is known."""
    prompt_tokens: int | None = None
    """Exact prompt tokens when the client sent token ids."""
    prefix_key: str | None = None
    prefix_chars: int = 0
    group_id: str | None = None
    """The group (RL task) the program is a sample of (``groups``), if the request names one."""
    group_chars: int = 0
    """Size of the task prompt the group's members share beyond the system prompt."""
    max_output: int | None = None
    """The request's bound on its output (``max_tokens``); None: not given."""
    created: float = 0.0
    backend: Backend | None = None
    """Set when dispatched."""
    program: Program | None = None
    dispatched_at: float | None = None
    waiter: Any = None
    """Free for the caller (an asyncio future in the gateway, an event in the DES)."""
    rid: str | None = None
    """The engine's request id (the key of /abort_request), given by the gateway's route."""
    session_id: str | None = None
    """The ``session_id`` the request carries to its backend (``kvrefs``), stamped at dispatch;
    None: it carries none."""
    window_mark: float = 0.0
    """``Windows.elapsed`` when the ticket was held: window time is not held time."""
    pause_mark: tuple[Backend, float] | None = None
    """Held for a program on a backend: it and its ``paused_seconds`` then (time its engine
    was paused behind the router is not held time, ``backends.pause``)."""
    inferred: bool = False
    """The program id was inferred from the messages (``conversations``), not sent."""
    conversation: bytes | PromptHead | None = None
    """No program id sent: the chain hash of the request's messages (or its prompt's hash
    state, ``conversations`` rule 6), which its answer extends."""
    conversation_id: str | None = None
    """No program id sent: the program its answer is recorded under (``conversations``)."""
    tools_offered: bool = False
    """No program id sent: the chat request offered ``tools`` (``conversations.end_hint``)."""
    beyond_context: bool = False
    """Sent at once, outside its program's accounting: the engine will surely refuse it for
    the model's context (``Controller._beyond_context``)."""
    end_hint: str | None = None
    """Its answer looked like the agent's last (``conversations.end_hint``: ``"sign"`` or
    ``"plain"``), or the engine refused it for the model's context length (``"context_overflow"``,
    ``conversations.context_overflow``), set before ``Controller.finish``; read for inferred
    programs only."""

    @property
    def held_seconds(self) -> float:
        return 0.0 if self.dispatched_at is None else self.dispatched_at - self.created


@dataclass
class Stats:
    """Monotonic counters for /metrics and benchmark reports."""

    admissions: int = 0
    pauses: int = 0
    restores: int = 0
    migrations: int = 0
    held: int = 0
    gated: int = 0
    """Requests held by the HBM condition (program active)."""
    expired: int = 0
    released: int = 0
    released_idle: int = 0
    requests: int = 0
    stateless_requests: int = 0
    failed_requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    ticks: int = 0
    window_held: int = 0
    """Requests held because a weight-update window was open."""
    kv_resets: int = 0
    """Programs whose cached KV the engines dropped (new weights, flushed cache)."""
    weight_changes_seen: int = 0
    """Engines whose weight version changed behind the router."""
    dormant: int = 0
    """Inferred programs paused after idling past their tools (``Program.dormant``)."""
    kv_drops_seen: int = 0
    """Engines seen to have dropped their cached KV behind the router with no new weight
    version (a direct flush, a reload without a version label: ``control.kvdrop``)."""
    engine_pauses_seen: int = 0
    """Pauses of a worker seen behind the router (``/ready`` 503 with no window of the router's
    own ``/pause_generation`` open)."""
    engine_paused_held: int = 0
    """Requests held because their program's engine was paused (``backends.pause``)."""
    beyond_context: int = 0
    """Requests sent at once, without waiting for room, because the engine would surely refuse
    them for the model's context (``Controller._beyond_context``)."""
    beyond_context_served: int = 0
    """Of them, those the engine served after all (the estimate was wrong; served statelessly)."""


@dataclass
class TickResult:
    decisions: Decisions
    dispatched: list[Ticket] = field(default_factory=list)
    expired: list[Ticket] = field(default_factory=list)
    released: list[Program] = field(default_factory=list)
    paused: list[Program] = field(default_factory=list)
    placed: list[Program] = field(default_factory=list)
    window_closed: Closed | None = None
    """A window the watchdog closed in this tick."""
