"""The program model: one agent workflow identified by a ``program_id``.

State machine (design.md, "Program model")::

    new ──admit──▶ ACTIVE ──pause──▶ PAUSED ──restore──▶ ACTIVE
                     │                  │
                     └──────release─────┴──▶ TERMINATED

Phase is orthogonal: REASONING while at least one request is in flight, ACTING otherwise
(waiting on a tool, or on the client). A new program is created PAUSED with ``backend=None``
and ``admitted=False``: it waits in the global queue like any paused program, in the lowest
restore class. Each transition is a short named method; they raise ``InvalidTransition`` on
misuse instead of silently corrupting accounting.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from thunder_sgl.programs.groups import Group, GroupTable
from thunder_sgl.smoothing import ema


class ProgramState(enum.Enum):
    ACTIVE = "active"
    PAUSED = "paused"
    TERMINATED = "terminated"


class Phase(enum.Enum):
    REASONING = "reasoning"
    ACTING = "acting"


class InvalidTransition(RuntimeError):
    """A lifecycle method was called in a state where it is not allowed (a bug, not bad input)."""


@dataclass(slots=True)
class Usage:
    """Token counts reported by the engine for one request."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    cached_host_tokens: int = 0
    cached_storage_tokens: int = 0
    weight_version: str | None = None
    """The engine's weight version when the request finished (SGLang's ``metadata`` /
    ``meta_info``), when it says."""


_set = object.__setattr__

COST_INPUTS = frozenset({"context_tokens", "pending_prompt_tokens", "expected_output_tokens", "output_cap", "prefix_key",
                         "shared_prefix_tokens", "group", "group_key", "phase", "held"})
"""The fields a program's scheduling cost is computed from (``scheduler.cost``)."""


@dataclass(slots=True, eq=False)
class Program:
    id: str
    created_at: float
    state: ProgramState = ProgramState.PAUSED
    phase: Phase = Phase.ACTING
    admitted: bool = False
    """False until the program's first admission (a new program in the queue)."""
    backend: str | None = None
    """Key of the backend the program is placed on; None while paused."""
    prev_backend: str | None = None
    """Where the program last ran: restore prefers it (its KV may still be cached there)."""
    context_tokens: int = 0
    """Exact: prompt_tokens + completion_tokens of the last completed request."""
    pending_prompt_tokens: int = 0
    """Estimate of the prompt of the request(s) in flight or held (from body size)."""
    expected_output_tokens: float = 0.0
    """EMA of completion tokens per step (0: use the scheduler default)."""
    output_cap: int = 0
    """The output bound (``max_tokens``) of its latest request: before the program has an
    output EMA, the default output is sized at most this (``scheduler.cost``); 0: none given."""
    prefix_key: str | None = None
    """Identity of the shared prefix (e.g. a hash of the system prompt)."""
    shared_prefix_tokens: int = 0
    """Tokens of the shared prefix, counted once per backend."""
    group: Group | None = None
    """The group (RL task) the program is a sample of (``groups``), from its first request."""
    group_key: str | None = None
    """The group's prefix key when the policy counts group prompts (else None)."""
    chars_per_token: float = 0.0
    """Learned from usage; 0 until the first response."""
    steps: int = 0
    in_flight: int = 0
    held: int = 0
    """Requests of this program currently held by the router."""
    last_active: float = 0.0
    acting_since: float = 0.0
    paused_since: float | None = None
    waiting_since: float | None = None
    """Start of the current wait in the global queue (paused or new)."""
    total_paused_seconds: float = 0.0
    total_tool_seconds: float = 0.0
    last_tool_seconds: float = 0.0
    max_tool_seconds: float = 0.0
    """The longest time from an answer to its next request (``returned``; an inferred program's
    idle timeout is derived from it)."""
    inferred: bool = False
    """Its id was inferred from its requests' messages (``control.conversations``)."""
    end_hint: str | None = None
    """Its last answer looked like the agent's last (``Ticket.end_hint``), until it asks again."""
    ended_p: float = 0.0
    """The probability that it ended (``programs.lengths``), read by the controller each tick
    while it is an admitted inferred program waiting for its client (``Controller._pause_dormant``);
    0 otherwise. Its backend's admission rule counts it out of the programs that cycle
    (``scheduler.goodput``, ``BackendView.ended``)."""
    dormant: bool = False
    """An inferred program paused after idling well past its tools (it may have ended; its
    client cannot say): it waits in the queue for its next request, not for room
    (``scheduler.queue``), until its idle timeout releases it."""
    tool_running: int = 0
    prompt_tokens_total: int = 0
    cached_tokens_total: int = 0
    cached_host_tokens_total: int = 0
    """Of ``cached_tokens_total``, loaded back from the HiCache host tier (engines that say)."""
    cached_storage_tokens_total: int = 0
    """Of ``cached_tokens_total``, loaded back from the HiCache storage tier."""
    completion_tokens_total: int = 0
    pauses: int = 0
    restores: int = 0
    migrations: int = 0
    kv_resets: int = 0
    """Times the engines dropped this program's cached KV (new weights, flushed cache)."""
    last_step_backend: str | None = None
    """Where its last completed step ran, while it has stayed placed there since (cleared by a
    pause, a failed request, a KV reset): the engine should hold that step's KV
    (``control.kvdrop``)."""
    last_step_end: float = 0.0
    """When its last request ended (completed, failed or aborted)."""
    last_step_prompt: int = 0
    """Prompt tokens of its last completed step."""
    sandboxes: list[str] = field(default_factory=list)
    session_on: str | None = None
    """Backend where the program's KV is referenced by its session (``kvrefs``)."""
    cost_cache: object = field(default=None, repr=False)
    """The scheduler's ``ProgramCost`` of this program (``scheduler.cost.cost_of``), cleared by
    ``__setattr__`` whenever one of ``COST_INPUTS`` is written: computed once per change."""

    def __setattr__(self, name: str, value: object) -> None:
        _set(self, name, value)
        if name in COST_INPUTS:
            _set(self, "cost_cache", None)

    # ---- derived -------------------------------------------------------------------------
    @property
    def paused(self) -> bool:
        return self.state is ProgramState.PAUSED

    @property
    def active(self) -> bool:
        return self.state is ProgramState.ACTIVE

    @property
    def reasoning(self) -> bool:
        return self.phase is Phase.REASONING

    # ---- lifecycle transitions -----------------------------------------------------------
    def admit(self, backend: str, now: float) -> None:
        """First placement of a new program (from the queue onto a backend)."""
        self._require(self.state is ProgramState.PAUSED and not self.admitted, "admit")
        self.admitted = True
        self._place(backend, now)

    def restore(self, backend: str, now: float) -> None:
        """Paused → active on ``backend`` (a different backend than before is a migration)."""
        self._require(self.state is ProgramState.PAUSED and self.admitted, "restore")
        if self.prev_backend is not None and backend != self.prev_backend:
            self.migrations += 1
        self.restores += 1
        if self.paused_since is not None:
            self.total_paused_seconds += max(0.0, now - self.paused_since)
        self._place(backend, now)

    def pause(self, now: float) -> None:
        """Active → paused: unbound from its backend; its KV may be evicted by the engine."""
        self._require(self.state is ProgramState.ACTIVE, "pause")
        self.state = ProgramState.PAUSED
        self.prev_backend = self.backend
        self.backend = None
        self.last_step_backend = None
        self.paused_since = now
        self.waiting_since = now
        self.pauses += 1

    def release(self, now: float) -> None:
        """Any live state → terminated; accounting dropped by the table."""
        self._require(self.state is not ProgramState.TERMINATED, "release")
        if self.state is ProgramState.PAUSED and self.paused_since is not None:
            self.total_paused_seconds += max(0.0, now - self.paused_since)
        self.state = ProgramState.TERMINATED
        if self.backend is not None:
            self.prev_backend = self.backend
        self.backend = None
        self.paused_since = None
        self.waiting_since = None
        self.last_active = now

    def start_request(self, now: float, prompt_estimate: int) -> None:
        """A request is dispatched to the backend: the program is reasoning."""
        self._require(self.state is ProgramState.ACTIVE, "start_request")
        if self.phase is Phase.ACTING and self.in_flight == 0 and self.steps > 0:
            self.last_tool_seconds = max(0.0, now - self.acting_since)
        self.in_flight += 1
        self.phase = Phase.REASONING
        self.pending_prompt_tokens = max(self.pending_prompt_tokens, prompt_estimate)
        self.last_active = now

    def finish_request(self, now: float, usage: Usage | None, alpha: float) -> None:
        """A request ended (completed, failed or aborted). Usage, when known, sets the exact
        context. The last request out switches the program to ACTING."""
        self._require(self.in_flight > 0, "finish_request")
        self.in_flight -= 1
        if usage is not None:
            self.steps += 1
            self.context_tokens = usage.prompt_tokens + usage.completion_tokens
            self.prompt_tokens_total += usage.prompt_tokens
            self.cached_tokens_total += usage.cached_tokens
            self.cached_host_tokens_total += usage.cached_host_tokens
            self.cached_storage_tokens_total += usage.cached_storage_tokens
            self.completion_tokens_total += usage.completion_tokens
            self.expected_output_tokens = ema(self.expected_output_tokens, float(usage.completion_tokens), alpha)
        if self.in_flight == 0:
            self.phase = Phase.ACTING
            self.acting_since = now
            self.pending_prompt_tokens = 0
        self.last_active = now

    def returned(self, now: float) -> float:
        """Its next request arrived: the client's time since the last answer (its tool, and
        whatever else the agent did), measured at arrival, so that a pause, a restore or a
        hold in between does not cut it short (``last_tool_seconds`` runs from the restore).
        Returns it."""
        tool = max(0.0, now - self.last_step_end)
        if tool > self.max_tool_seconds:
            self.max_tool_seconds = tool
        return tool

    def hold(self, now: float, prompt_estimate: int) -> None:
        """A request of this program is held by the router (the program is paused or queued)."""
        self.held += 1
        self.pending_prompt_tokens = max(self.pending_prompt_tokens, prompt_estimate)
        self.last_active = now

    def unhold(self) -> None:
        self._require(self.held > 0, "unhold")
        self.held -= 1

    def reset_kv(self, now: float) -> None:
        """The engine dropped this program's cached KV (new weights, flushed cache): its next
        request is a full prefill wherever it runs. Its demand counts fully again (the decay
        clock restarts) and no backend holds its KV any more, so restoring it anywhere is not
        a migration (a program still placed keeps its backend)."""
        if self.state is not ProgramState.ACTIVE:
            self.prev_backend = None
        if self.in_flight == 0:
            self.acting_since = now
        self.last_step_backend = None
        self.kv_resets += 1

    def tool_started(self, now: float) -> None:
        self.tool_running += 1
        self.last_active = now

    def tool_finished(self, now: float, seconds: float) -> None:
        self.tool_running = max(0, self.tool_running - 1)
        self.last_tool_seconds = seconds
        self.total_tool_seconds += seconds
        self.last_active = now

    # ---- helpers -------------------------------------------------------------------------
    def _place(self, backend: str, now: float) -> None:
        self.state = ProgramState.ACTIVE
        self.dormant = False
        self.backend = backend
        self.prev_backend = backend
        if self.group is not None:
            self.group.home = backend
        self.paused_since = None
        self.waiting_since = None
        if self.in_flight == 0:
            # The tool-time clock restarts: a restored program is as fresh as one that just
            # finished a step (its KV must be rebuilt or reloaded anyway).
            self.acting_since = now

    def _require(self, ok: bool, what: str) -> None:
        if not ok:
            raise InvalidTransition(
                f"program {self.id!r}: {what} not allowed in state={self.state.value} "
                f"phase={self.phase.value} admitted={self.admitted} in_flight={self.in_flight}"
            )


class ProgramTable:
    """The live programs, by id, indexed by backend and by waiting state.

    Placement transitions go through the table (``admit``, ``restore``, ``pause``, ``release``)
    so that the indexes the scheduler's tick reads stay exact; request-level transitions
    (``start_request``, ``finish_request``, ``hold``) do not move programs and are called on
    the Program directly. Terminated programs are dropped; their ids may be reused.
    """

    def __init__(self, groups: GroupTable | None = None) -> None:
        self.groups = groups if groups is not None else GroupTable()
        self._programs: dict[str, Program] = {}
        self._on: dict[str, dict[str, Program]] = {}
        self._waiting: dict[str, Program] = {}

    def __len__(self) -> int:
        return len(self._programs)

    def __contains__(self, pid: object) -> bool:
        return pid in self._programs

    def __iter__(self) -> Iterator[Program]:
        return iter(self._programs.values())

    def get(self, pid: str) -> Program | None:
        return self._programs.get(pid)

    def values(self) -> list[Program]:
        return list(self._programs.values())

    # ---- indexes read by the scheduler --------------------------------------------------
    def on_backend(self, key: str) -> list[Program]:
        """Active programs placed on backend ``key``."""
        d = self._on.get(key)
        return list(d.values()) if d else []

    def placed_on(self, key: str) -> Iterable[Program]:
        """``on_backend`` without the copy: iterate at once, without changing the table."""
        d = self._on.get(key)
        return d.values() if d else ()

    def backend_keys(self) -> list[str]:
        """Backends that have at least one active program."""
        return [k for k, d in self._on.items() if d]

    def waiting(self) -> list[Program]:
        """Paused and new programs: the global waiting queue (unordered)."""
        return list(self._waiting.values())

    @property
    def waiting_count(self) -> int:
        return len(self._waiting)

    # ---- transitions --------------------------------------------------------------------
    def create(self, pid: str, now: float, group_id: str | None = None, group_tokens: int = 0) -> Program:
        """A new program, queued; ``group_id`` makes it a member of that group (created by its
        first member, ``group_tokens`` the estimated task prompt)."""
        if pid in self._programs:
            raise InvalidTransition(f"program {pid!r} already exists")
        p = Program(id=pid, created_at=now, last_active=now, acting_since=now, waiting_since=now)
        if group_id is not None:
            p.group = self.groups.join(group_id, now, group_tokens)
        self._programs[pid] = p
        self._waiting[pid] = p
        return p

    def admit(self, p: Program, backend: str, now: float) -> None:
        p.admit(backend, now)
        self._waiting.pop(p.id, None)
        self._on.setdefault(backend, {})[p.id] = p

    def restore(self, p: Program, backend: str, now: float) -> None:
        p.restore(backend, now)
        self._waiting.pop(p.id, None)
        self._on.setdefault(backend, {})[p.id] = p

    def pause(self, p: Program, now: float) -> None:
        key = p.backend
        p.pause(now)
        self._unindex(p.id, key)
        self._waiting[p.id] = p

    def remove(self, pid: str, now: float) -> Program | None:
        """Release and drop a program (no-op, None, if unknown)."""
        p = self._programs.pop(pid, None)
        if p is None:
            return None
        self._unindex(pid, p.backend)
        self._waiting.pop(pid, None)
        if p.state is not ProgramState.TERMINATED:
            p.release(now)
        if p.group is not None:
            self.groups.leave(p.group, now)
        return p

    def _unindex(self, pid: str, key: str | None) -> None:
        if key is not None:
            d = self._on.get(key)
            if d is not None:
                d.pop(pid, None)
                if not d:
                    del self._on[key]
