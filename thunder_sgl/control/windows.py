"""Weight-update windows: while one is open the router holds new requests and restores.

An RL trainer updates the weights of its rollout engines between training steps. While it
does, a request sent to an engine would be generated with half-updated weights, fail, or sit
in the engine's queue while the router's view of it goes stale. So the router opens a
*window*: new requests (of programs and stateless ones) and restores of paused programs are
held — never failed — and the scheduler does not act on the engines' transient readings.
Requests already in flight finish, or are aborted or retracted by the engines, according to
the pause mode the trainer asked for; their programs are finished as usual.

A window is open while at least one *reason* holds, so the call sequences of different RL
frameworks compose into one window:

- ``weight_sync``: ``/weight_sync/begin`` … ``/weight_sync/end`` (clients written for SkyRL's
  ThunderAgent integration, which pause the engines themselves);
- ``paused``: ``/pause_generation`` … ``/continue_generation`` sent through the router;
- ``released``: ``/release_memory_occupation`` … ``/resume_memory_occupation`` (a colocated
  trainer has the GPU);
- ``updating``: a weight update call in progress (``/update_weights_from_disk``,
  ``/update_weights_from_distributed``, ``/update_weights_from_tensor``).

Misuse is refused, the state untouched: ``begin`` while ``weight_sync`` holds, ``end`` without
it, and a second weight update while one runs (``WindowConflict``, a 409). Pause, continue,
release and resume are idempotent, as they are on SGLang (an engine paused behind the router's
back can still be continued through it).

Time: ``elapsed(now)`` is the total time spent in windows so far. A held request's timeout
counts only time outside windows, so a window never times out the requests it holds; a window
open longer than ``max_seconds`` (a trainer that died mid-sync) is closed by ``expire``, so a
held wait stays bounded across windows. Pure: time is passed in, nothing here does I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from thunder_sgl.errors import Conflict


class Reason(enum.Enum):
    WEIGHT_SYNC = "weight_sync"
    PAUSED = "paused"
    RELEASED = "released"
    UPDATING = "updating"


class WindowConflict(Conflict):
    """A window call out of sequence (409); nothing was changed."""


@dataclass(eq=False)
class Window:
    id: int
    opened_at: float
    reasons: set[Reason] = field(default_factory=set)
    pause_mode: str | None = None
    """Mode of the last /pause_generation in this window (abort, in_place, retract)."""
    weight_version: str | None = None
    """Version named by the last successful weight update in this window."""
    updates: int = 0
    """Successful weight updates (on at least one worker) in this window."""

    def describe(self, now: float) -> dict[str, Any]:
        return {"id": self.id, "open": True, "reasons": sorted(r.value for r in self.reasons),
                "open_seconds": round(max(0.0, now - self.opened_at), 3), "pause_mode": self.pause_mode,
                "weight_version": self.weight_version, "weight_updates": self.updates}


@dataclass(frozen=True)
class Closed:
    """A window that just closed."""

    window: Window
    closed_at: float
    by_watchdog: bool = False

    @property
    def seconds(self) -> float:
        return max(0.0, self.closed_at - self.window.opened_at)


class Windows:
    """The router's window state: at most one window open, with the reasons that hold it."""

    def __init__(self, max_seconds: float) -> None:
        self.max_seconds = max_seconds
        self.current: Window | None = None
        self.opened = 0
        self.expired = 0
        """Windows closed by the watchdog."""
        self.weight_version: str | None = None
        """The last weight version a successful update named (None: never told)."""
        self._closed_seconds = 0.0

    @property
    def holding(self) -> bool:
        return self.current is not None

    def has(self, reason: Reason) -> bool:
        return self.current is not None and reason in self.current.reasons

    def hold(self, reason: Reason, now: float, *, mode: str | None = None) -> Window:
        """Add ``reason`` (opening a window if none is open). Raises WindowConflict for a second
        ``weight_sync`` or a second concurrent update."""
        w = self.current
        if w is not None and reason in w.reasons:
            if reason is Reason.WEIGHT_SYNC:
                raise WindowConflict(
                    f"a weight-sync window is already open (since {now - w.opened_at:.1f}s); "
                    "call /weight_sync/end first", code="window_already_open")
            if reason is Reason.UPDATING:
                raise WindowConflict("a weight update is already in progress; wait for it to finish",
                                     code="update_in_progress")
        if w is None:
            self.opened += 1
            w = self.current = Window(id=self.opened, opened_at=now)
        w.reasons.add(reason)
        if reason is Reason.PAUSED:
            w.pause_mode = mode
        return w

    def release(self, reason: Reason, now: float) -> Closed | None:
        """Drop ``reason``; returns the window if that closed it. Raises WindowConflict for
        ``weight_sync`` when no weight-sync window is open; the other reasons are idempotent."""
        w = self.current
        if w is None or reason not in w.reasons:
            if reason is Reason.WEIGHT_SYNC:
                raise WindowConflict("no weight-sync window is open; call /weight_sync/begin first",
                                     code="no_window_open")
            return None
        w.reasons.discard(reason)
        return None if w.reasons else self._close(now, by_watchdog=False)

    def weights_updated(self, version: str | None) -> None:
        """A weight update succeeded (on at least one worker)."""
        if version is not None:
            self.weight_version = version
        if self.current is not None:
            self.current.updates += 1
            if version is not None:
                self.current.weight_version = version

    def elapsed(self, now: float) -> float:
        """Total seconds spent inside windows up to ``now`` (monotone)."""
        w = self.current
        return self._closed_seconds + (max(0.0, now - w.opened_at) if w is not None else 0.0)

    def expire(self, now: float) -> Closed | None:
        """The watchdog: close a window open longer than ``max_seconds``."""
        w = self.current
        if w is None or now - w.opened_at <= self.max_seconds:
            return None
        self.expired += 1
        return self._close(now, by_watchdog=True)

    def describe(self, now: float) -> dict[str, Any]:
        base = {"windows_opened": self.opened, "windows_expired": self.expired,
                "window_seconds_total": round(self.elapsed(now), 3), "weight_version": self.weight_version}
        if self.current is None:
            return {"open": False, **base}
        return {**self.current.describe(now), **base}

    def _close(self, now: float, by_watchdog: bool) -> Closed:
        w = self.current
        assert w is not None
        self.current = None
        self._closed_seconds += max(0.0, now - w.opened_at)
        return Closed(w, now, by_watchdog)
