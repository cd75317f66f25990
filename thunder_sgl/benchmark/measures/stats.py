"""Records of a workload run and the measures computed from them (design.md, "Measures").

Records hold *wall* seconds since the start of the run; measures are in *simulated* seconds,
wall × ``time_scale`` (1 for a real cluster), so a run against a simulator at ``--time-scale
S`` reports the numbers the simulated GPU would see.

Conventions:
- **steps/min**: a step is one LLM call plus its tool call, counted when its tool wait ends,
  over the window from ``warmup_s`` to the end of the run, per simulated minute.
- **KV hit rate**: Σ cached_tokens / Σ prompt_tokens over successful LLM calls that ended in
  the window.
- **program completion time**: start to end (last tool wait) of programs that completed in the
  window; failed and cancelled programs are not counted.
- **step latency**: one LLM call, request sent to reply received, successful calls in the window.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import numpy as np


@dataclass(slots=True)
class StepRecord:
    """One attempt of one LLM call (a retried call leaves one record per attempt)."""

    program_id: str
    step: int
    attempt: int
    start_s: float
    """Request sent, wall seconds since the run started."""
    end_s: float
    """Reply received (or failure), wall seconds since the run started."""
    status: int = 0
    """HTTP status; 0 when no response came (connection error, timeout)."""
    error: str | None = None
    """None on success, else the error kind (``http_503``, ``connection``, ``timeout``, ``bad_response``)."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    tool: str = ""
    tool_end_s: float | None = None
    """When the step's tool wait ended (the step counts then); None if it did not."""

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def latency_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(slots=True)
class ProgramRecord:
    """One program from its first request to its release."""

    program_id: str
    index: int
    steps_planned: int
    start_s: float
    end_s: float | None = None
    steps_done: int = 0
    outcome: str = "running"
    """running | completed | failed (a step kept failing) | cancelled (the run ended first)."""
    released: bool = False
    """A release call was answered 2xx (False where the router has no program routes)."""
    endpoint: str = ""
    """Where the program's requests went (the router, or one engine for the direct baseline)."""


@overload
def percentile(values: list[float], q: float) -> float | None: ...


@overload
def percentile(values: list[float], q: float, *, empty: float) -> float: ...


def percentile(values: list[float], q: float, *, empty: float | None = None) -> float | None:
    """The q-th percentile (linear interpolation, as numpy's default); ``empty`` for no values:
    None by default (the workload driver's measures), 0.0 in the DES and rollout measures.
    The bench's one percentile: every measure that reports one calls this."""
    return float(np.percentile(values, q)) if values else empty


@dataclass
class WorkloadResult:
    """Everything one run recorded, and its measures."""

    profile: str
    concurrency: int
    time_scale: float
    wall_s: float
    """Length of the run in wall seconds."""
    warmup_s: float = 0.0
    """Wall seconds at the start excluded from every measure."""
    steps: list[StepRecord] = field(default_factory=list)
    programs: list[ProgramRecord] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    """Failed attempts by kind (retried ones included)."""
    release_supported: bool = True
    """False once a release answered like a stock router (no program routes)."""

    def _in_window(self, t: float | None) -> bool:
        return t is not None and self.warmup_s <= t <= self.wall_s

    @property
    def window_sim_s(self) -> float:
        return max(0.0, self.wall_s - self.warmup_s) * self.time_scale

    def _ok_calls(self) -> list[StepRecord]:
        return [s for s in self.steps if s.ok and self._in_window(s.end_s)]

    @property
    def steps_completed(self) -> int:
        return sum(1 for s in self.steps if self._in_window(s.tool_end_s))

    @property
    def steps_per_min(self) -> float:
        window = self.window_sim_s
        return 60.0 * self.steps_completed / window if window > 0 else 0.0

    @property
    def prompt_tokens(self) -> int:
        return sum(s.prompt_tokens for s in self._ok_calls())

    @property
    def cached_tokens(self) -> int:
        return sum(s.cached_tokens for s in self._ok_calls())

    @property
    def kv_hit_rate(self) -> float:
        return _ratio(self.cached_tokens, self.prompt_tokens)

    def _completion_times(self) -> list[float]:
        return [
            (p.end_s - p.start_s) * self.time_scale
            for p in self.programs
            if p.outcome == "completed" and p.end_s is not None and self._in_window(p.end_s)
        ]

    def summary(self) -> dict[str, Any]:
        """The measures as plain data (times in simulated seconds)."""
        done = self._completion_times()
        calls = self._ok_calls()
        lat = [s.latency_s * self.time_scale for s in calls]
        prompt, cached = self.prompt_tokens, self.cached_tokens
        outcomes = Counter(p.outcome for p in self.programs)
        return {
            "profile": self.profile,
            "concurrency": self.concurrency,
            "time_scale": self.time_scale,
            "wall_s": self.wall_s,
            "window_sim_s": self.window_sim_s,
            "steps_completed": self.steps_completed,
            "steps_per_min": self.steps_per_min,
            "kv_hit_rate": _ratio(cached, prompt),
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "completion_tokens": sum(s.completion_tokens for s in calls),
            "programs_started": len(self.programs),
            "programs_completed": outcomes["completed"],
            "programs_failed": outcomes["failed"],
            "programs_cancelled": outcomes["cancelled"],
            "program_completion_p50_s": percentile(done, 50),
            "program_completion_p99_s": percentile(done, 99),
            "step_latency_p50_s": percentile(lat, 50),
            "step_latency_p99_s": percentile(lat, 99),
            "errors": dict(self.errors),
            "release_supported": self.release_supported,
        }

    def write_csv(self, prefix: str | Path) -> tuple[Path, Path]:
        """Raw records to ``<prefix>_steps.csv`` and ``<prefix>_programs.csv`` (wall seconds)."""
        out = []
        for suffix, rows, cls in (
            ("steps", self.steps, StepRecord),
            ("programs", self.programs, ProgramRecord),
        ):
            path = Path(f"{prefix}_{suffix}.csv")
            names = [f.name for f in dataclasses.fields(cls)]
            with path.open("w", newline="") as fh:
                w = csv.writer(fh)
                w.writerow(names)
                for r in rows:
                    w.writerow([_cell(getattr(r, n)) for n in names])
            out.append(path)
        return out[0], out[1]


def _ratio(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def _cell(v: Any) -> Any:
    if v is None:
        return ""
    if isinstance(v, float) and math.isfinite(v):
        return round(v, 6)
    return v
