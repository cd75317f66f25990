"""Failure injection of a simulated worker, set from config and changed at runtime.

``POST /sim/faults`` takes a JSON object with any of the fields below and merges it; ``GET``
returns the current state. ``die_mid_stream_after_tokens`` arms a one-shot fault: the *next*
streamed response is broken after that many content chunks, by ``os._exit(1)`` (mode ``exit``,
a real crash: use it against worker processes, never in-process) or by cutting only that
connection (mode ``drop``). ``break_streams_rate`` cuts that fraction of all streams, each
after a random number of chunks (mode ``drop``).
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass
from typing import Any

from thunder_sgl.config import from_dict
from thunder_sgl.sim.config import FaultSpec


@dataclass(slots=True)
class FaultState:
    failure_rate: float = 0.0
    added_latency_ms: float = 0.0
    stop_answering: bool = False
    die_mid_stream_after_tokens: int | None = None
    die_mid_stream_mode: str = "exit"
    startup_delay_s: float = 0.0
    break_streams_rate: float = 0.0

    @classmethod
    def from_spec(cls, spec: FaultSpec) -> FaultState:
        return cls(**{k: getattr(spec, k) for k in cls.__dataclass_fields__})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def update(self, changes: dict[str, Any]) -> None:
        """Merge ``changes``, validated as a FaultSpec (raises ConfigError on bad input)."""
        spec = from_dict(FaultSpec, {**self.to_dict(), **changes}, "faults")
        for k in self.__dataclass_fields__:
            setattr(self, k, getattr(spec, k))


class Faults:
    """Fault state plus the seeded draws and the start time it is judged against."""

    def __init__(self, spec: FaultSpec, seed: int) -> None:
        self.state = FaultState.from_spec(spec)
        self._rng = random.Random(seed)
        self._started = time.monotonic()

    def starting(self) -> bool:
        return time.monotonic() - self._started < self.state.startup_delay_s

    def draw_failure(self) -> bool:
        rate = self.state.failure_rate
        return rate > 0 and self._rng.random() < rate

    def take_die_mid_stream(self, tokens: int) -> tuple[int, str] | None:
        """(after_chunks, mode) if this stream of ``tokens`` tokens must break: the armed
        one-shot fault (disarmed here), else a draw at ``break_streams_rate``."""
        k = self.state.die_mid_stream_after_tokens
        if k is not None:
            self.state.die_mid_stream_after_tokens = None
            return k, self.state.die_mid_stream_mode
        rate = self.state.break_streams_rate
        if rate > 0 and self._rng.random() < rate:
            return self._rng.randrange(max(tokens, 1)), "drop"
        return None
