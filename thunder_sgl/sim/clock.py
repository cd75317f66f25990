"""Virtual clocks: the engines' notion of time, in simulated seconds.

``ManualClock`` is moved by its owner (a discrete-event benchmark, a test). ``ScaledClock`` runs
``time_scale`` times faster than the monotonic clock, so an HTTP worker can compress an hour of
GPU time into minutes: ``virtual = (monotonic − t0) × time_scale``.
"""

from __future__ import annotations

import time
from typing import Protocol


class VirtualClock(Protocol):
    """Anything with ``now()`` in simulated seconds (monotonic, never decreasing)."""

    def now(self) -> float: ...


class ManualClock:
    """A clock that moves only when told to."""

    def __init__(self, t: float = 0.0) -> None:
        self._t = float(t)

    def now(self) -> float:
        return self._t

    def set(self, t: float) -> None:
        if t < self._t:
            raise ValueError(f"clock cannot go back from {self._t} to {t}")
        self._t = float(t)

    def advance(self, dt: float) -> float:
        self.set(self._t + dt)
        return self._t


class ScaledClock:
    """Simulated time = (monotonic − start) × time_scale."""

    def __init__(self, time_scale: float = 1.0) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        self.time_scale = float(time_scale)
        self._t0 = time.monotonic()

    def now(self) -> float:
        return (time.monotonic() - self._t0) * self.time_scale

    def real_delay(self, virtual_seconds: float) -> float:
        """Real seconds until ``virtual_seconds`` of simulated time have passed."""
        return max(0.0, virtual_seconds) / self.time_scale
