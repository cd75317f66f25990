"""Live progress of a sweep: one row per run (router, N, simulated time, steps/min so far, KV hit
rate, errors), drawn with rich.

``Progress`` is what the harness and the demo report to; ``LiveProgress`` draws a rich table
that refreshes in place on a terminal (and prints one line per finished run everywhere, so a
log file or a CI console shows the sweep too); ``QuietProgress`` prints nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from thunder_sgl.benchmark.drivers.closed_loop import DriverEvent
from thunder_sgl.benchmark.reports.results import RunResult


@dataclass
class RunRow:
    router: str
    programs: int
    status: str = "waiting"
    sim_s: float = 0.0
    total_sim_s: float = 0.0
    warmup_s: float = 0.0
    steps_window: int = 0
    steps_all: int = 0
    prompt: int = 0
    cached: int = 0
    errors: int = 0
    result: RunResult | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def steps_per_min(self) -> float:
        if self.result is not None:
            return self.result.steps_per_min
        if self.sim_s > self.warmup_s + 1e-9 and self.steps_window:
            return 60.0 * self.steps_window / (self.sim_s - self.warmup_s)
        return 60.0 * self.steps_all / self.sim_s if self.sim_s > 0 else 0.0

    def hit_rate(self) -> float:
        if self.result is not None:
            return self.result.kv_hit_rate
        return self.cached / self.prompt if self.prompt else 0.0


class Progress:
    """No-op base: what a sweep reports as it goes."""

    def __init__(self) -> None:
        self.rows: list[RunRow] = []
        self.current: RunRow | None = None
        self._time_scale = 1.0
        self._t0 = 0.0

    def plan(self, runs: list[tuple[str, int]]) -> None:
        self.rows = [RunRow(r, n) for r, n in runs]

    def _row(self, router: str, programs: int) -> RunRow:
        for row in self.rows:
            if row.router == router and row.programs == programs and row.result is None:
                return row
        row = RunRow(router, programs)
        self.rows.append(row)
        return row

    def start_run(self, router: str, programs: int, total_sim_s: float, warmup_s: float,
                  time_scale: float = 1.0) -> None:
        self.current = self._row(router, programs)
        self.current.status = "starting"
        self.current.total_sim_s, self.current.warmup_s = total_sim_s, warmup_s
        self._time_scale = time_scale
        self._t0 = time.monotonic()

    def running(self) -> None:
        """The measured part of the current run begins now (its simulated clock starts)."""
        self.status("running")
        self._t0 = time.monotonic()

    def status(self, text: str) -> None:
        if self.current is not None:
            self.current.status = text

    def driver_event(self, ev: DriverEvent) -> None:
        """The driver's ``on_event`` (HTTP mode; times are wall seconds since the run began)."""
        row = self.current
        if row is None:
            return
        row.sim_s = ev.time_s * self._time_scale
        if ev.kind == "tool_end":
            row.steps_all += 1
            if row.sim_s >= row.warmup_s:
                row.steps_window += 1
        elif ev.kind == "step" and ev.step is not None:
            if ev.step.ok:
                row.prompt += ev.step.prompt_tokens
                row.cached += ev.step.cached_tokens
            else:
                row.errors += 1

    def des_update(self, sim_s: float, snapshot: dict[str, Any]) -> None:
        """``run_des``'s ``progress(sim_time, snapshot)``: cumulative numbers of a DES run."""
        row = self.current
        if row is None:
            return
        row.sim_s = sim_s
        row.steps_all = int(snapshot.get("steps", row.steps_all))
        row.steps_window = int(snapshot.get("window_steps", row.steps_window))
        row.prompt = int(snapshot.get("prompt_tokens", row.prompt))
        row.cached = int(snapshot.get("cached_tokens", row.cached))
        row.errors = int(snapshot.get("errors", row.errors))

    def tick(self) -> None:
        """Called by the harness a few times a second while a run is live."""
        row = self.current
        if row is not None and row.status == "running" and self._time_scale:
            row.sim_s = max(row.sim_s, (time.monotonic() - self._t0) * self._time_scale)

    def end_run(self, result: RunResult) -> None:
        if self.current is not None:
            self.current.result = result
            self.current.status = "failed" if result.errors.get("run_failed") else "done"
            self.current.sim_s = self.current.total_sim_s or self.current.sim_s
        self.current = None

    def message(self, text: str) -> None:
        pass

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class QuietProgress(Progress):
    pass


class LiveProgress(Progress):
    """A rich table refreshed in place; finished runs and messages are printed above it."""

    def __init__(self, title: str = "thunder-sgl bench", console: Console | None = None) -> None:
        super().__init__()
        self.title = title
        self.console = console or Console()
        self._live: Live | None = None

    def __enter__(self) -> LiveProgress:
        if self.console.is_terminal:
            self._live = Live(get_renderable=self.table, console=self.console, refresh_per_second=2,
                              transient=False)
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def message(self, text: str) -> None:
        self.console.print(text, highlight=False, soft_wrap=True)

    def end_run(self, result: RunResult) -> None:
        super().end_run(result)
        state = "FAILED " + result.notes if result.errors.get("run_failed") else (
            f"{result.steps_per_min:.1f} steps/min, KV hit {result.kv_hit_rate:.1%}, "
            f"recompute {result.recompute_tokens / 1e6:.2f} M tok, "
            f"p50 completion {result.program_completion_p50_s:.0f} s")
        self.message(f"  {result.router:<20} N={result.programs:<4} {state}")

    def table(self) -> Table:
        t = Table(title=self.title, expand=False)
        for col, just in (("router", "left"), ("N", "right"), ("status", "left"), ("sim time", "right"),
                          ("steps/min", "right"), ("KV hit", "right"), ("errors", "right")):
            t.add_column(col, justify=just)  # type: ignore[arg-type]
        for row in self.rows:
            sim = f"{row.sim_s:,.0f} / {row.total_sim_s:,.0f} s" if row.total_sim_s else ""
            warm = " (warm-up)" if row.status == "running" and row.sim_s < row.warmup_s else ""
            spm = f"{row.steps_per_min():.1f}" if row.status != "waiting" else ""
            hit = f"{row.hit_rate():.1%}" if row.prompt or row.result else ""
            errs = (sum(v for k, v in row.result.errors.items() if k != "run_failed")
                    if row.result is not None else row.errors)
            t.add_row(row.router, str(row.programs), row.status + warm, sim, spm, hit, str(errs or ""))
        return t
