"""An engine paused behind the router: the one rule that says so, and what it holds.

A framework may call an engine's ``/pause_generation`` directly (slime's and AReaL's trainers
talk to the engines, not the router). Requests sent to it then stall: SGLang keeps them at its
door until ``/continue_generation``. The router must not take that stall for a failure.

**What SGLang 0.5.23 exposes.** The paused state lives in the tokenizer manager:
``TokenizerManager.is_pause`` (``srt/managers/tokenizer_manager.py:507-513``), set by
``pause_generation`` in every mode (``:2267-2280``: ``abort`` sets it without telling the
scheduler) and cleared by ``continue_generation`` (``:2282-2286``); every new request waits on
it before it is tokenized (``:938-939``). It is visible in one place only: ``GET /ready``
answers 503 while ``is_ready()`` is false — paused, or not healthy (``is_ready`` at
``tokenizer_manager.py:732-734``; the route at ``srt/entrypoints/http_server.py:714-718``).
Nothing else tells: ``/server_info``, ``/model_info``, ``/v1/loads`` and ``/metrics`` read the
same paused or not (``sglang:num_paused_reqs`` counts the requests an async weight sync
paused, not the engine's state), and ``/health`` must not be asked: it sends a one-token
generation, which waits at a paused engine's door, and after ``SGLANG_HEALTH_CHECK_TIMEOUT``
(20 s) marks the engine ``UnHealthy`` (``http_server.py:721-799``, ``:218``), after which ``/ready``
stays 503 past the continue until a later ``/health`` succeeds.

**The rule** (``judge``), applied by the monitor after every good poll of a worker:

- ``/ready`` answers 503 while the same round's ``/v1/loads`` answered: the worker is
  *paused* (from the first such answer). The process is up and its scheduler answers, so the
  503 is the engine refusing new work — a pause; it is not a failure.
- ``/ready`` answers 200: not paused (resumed, at the first 200 after a pause).
- Anything else — ``/ready`` unread (a failed poll, a timeout), another status — changes
  nothing; a worker whose ``/ready`` is 404 (an SGLang without the route) is never judged
  paused (``Monitor``).

A pause longer than ``limit`` seconds (``windows.max_window_seconds``, the watchdog of the
router's own windows) is *expired*: the router stops holding for it, logs an error, and
requests go to the engine (they wait at its door if it is still paused); it is held again
only after ``/ready`` has answered 200 once.

**What the router does while a worker is paused** (``Backend.engine_paused``; the
``Controller`` and the scheduler read it): its programs keep their place — none is paused by
the scheduler, evacuated or failed over — and their new requests are held at the router; it
is not counted unhealthy; nothing new is placed there (programs waiting in the global queue go
to other backends); stateless requests go to a backend that is not paused when there is one;
its admission rule measures nothing (the period is re-anchored at the resume); the time it
was paused counts neither towards the held timeout of requests held for its programs
(``gateway.held_timeout_seconds``) nor towards the upstream timeout of requests in flight on
it (``gateway.upstream_timeout_seconds``). At the resume the held requests go out, oldest
first, as the HBM condition allows. Requests in flight when the engine paused are the
engine's business, by its pause mode (docs/rl.md §2).

**Limits.** ``/ready`` is also 503 while SGLang's ``server_status`` is not ``Up``: during its
warm-up (the monitor registers a worker only once ``/server_info`` answers, which comes
before) and after a failed ``/health`` generation until one succeeds. Those read as paused
too: the engine says it should not receive requests, and the router holds them; the watchdog
bounds that hold. Between the pause and the monitor's next poll (``poll_interval_seconds``,
1 s) requests may still be sent to the engine: they wait at its door, as without a router.
"""

from __future__ import annotations

from dataclasses import dataclass

READY_PATH = "/ready"


@dataclass(frozen=True, slots=True)
class EnginePause:
    """A worker's paused state, as the rule last judged it."""

    since: float | None = None
    """When ``/ready`` first answered 503 in this pause (None: not paused)."""
    expired: bool = False
    """Paused longer than the limit: no longer held (until ``/ready`` answers 200 again)."""

    @property
    def paused(self) -> bool:
        return self.since is not None

    @property
    def holding(self) -> bool:
        """The router holds this worker's programs."""
        return self.since is not None and not self.expired

    def describe(self, now: float) -> dict[str, object]:
        return {"since_seconds": round(now - self.since, 3) if self.since is not None else None,
                "held": self.holding, "expired": self.expired,
                "reason": f"GET {READY_PATH} answers 503 while the loads poll answers" if self.since is not None else None}


NOT_PAUSED = EnginePause()


def judge(state: EnginePause, ready_status: int | None, now: float, limit: float) -> EnginePause:
    """The worker's paused state after a good poll whose ``/ready`` answered ``ready_status``
    (None: not read). The rule is this module's docstring."""
    if ready_status == 200:
        return NOT_PAUSED
    if ready_status != 503:
        return state
    since = state.since if state.since is not None else now
    expired = state.expired or now - since > limit
    if since == state.since and expired == state.expired:
        return state
    return EnginePause(since, expired)
