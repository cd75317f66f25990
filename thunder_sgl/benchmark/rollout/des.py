"""The rollout benchmark in DES mode: groups released in batches or waves, weight updates in
virtual time (``spec`` says what is run and measured; ``des.run`` how the DES runs).

``RolloutRun`` is a ``DesRun`` whose programs come from ``rollout.spec.RolloutSpec`` instead of a
closed loop, and whose trainer updates the weights on a timer. An update, for every router
alike, as a trainer that owns its engines does it (SkyRL's sequence):

1. open: thunder is told (``/weight_sync/begin``: ``Controller.windows`` holds the reason
   ``weight_sync``, so new requests and restores are held); every engine is paused
   (``sim.control.pause``, in ``update_pause`` mode). New requests that reach a paused engine —
   the stock routers keep routing — wait at its front door, as SGLang's tokenizer manager
   holds them.
2. ``update_seconds`` later: new weights on every engine with a cache flush
   (``sim.control.update_weights``); thunder resets the KV accounting of the flushed engines
   (``Controller.reset_kv``); generation continues; the requests at the doors enter the
   engines; thunder's window closes (``/weight_sync/end``) and its next tick re-admits in
   aging order.

A request an ``abort`` pause answered with finish reason ``abort`` is sent again at once, as
``examples/rl_rollout.py`` does (counted in ``resent``, not as a failure). Requests lost —
refused or failed for any reason but the program's own context overflow — are counted per run
and must be 0.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from thunder_sgl.benchmark.des.route import Dispatch, ThunderRouter
from thunder_sgl.benchmark.des.run import DesRun
from thunder_sgl.benchmark.reports.results import RunResult
from thunder_sgl.benchmark.rollout.spec import (
    ProgramDone,
    RolloutSpec,
    batch_measures,
    group_measures,
    task_specs,
)
from thunder_sgl.control.windows import Reason
from thunder_sgl.sim import Completion, control

WINDOW_OPEN, WINDOW_CLOSE = 2, 3


class RolloutRun(DesRun):
    def __init__(self, *args: Any, rollout: RolloutSpec, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.spec = rollout
        self.task = 0
        self.batch = -1
        self.batch_released: list[float] = []
        self.batch_left: Counter[int] = Counter()
        self.batch_steps: Counter[int] = Counter()
        self.of: dict[str, tuple[int, float]] = {}
        """Program id → (batch, release time of its batch or group)."""
        self.first_response: dict[str, float] = {}
        self.done: list[ProgramDone] = []
        self.door: list[list[Dispatch]] = [[] for _ in self.workers]
        self.pausing = False
        self.windows: list[dict[str, Any]] = []
        self.counts["resent"] = 0
        for t in rollout.update_times(self.rec.end_s):
            self._push(t, WINDOW_OPEN, None)

    # ---- releases -----------------------------------------------------------------------
    def _begin(self, now: float) -> None:
        if self.spec.mode == "sync":
            self._release_batch(now)
        else:
            self._refill(now)

    def _release_group(self, now: float, batch: int) -> None:
        from thunder_sgl.benchmark.des.run import Agent

        for spec in task_specs(self.profile, self.seed, self.task, self.spec.group_size):
            a = Agent(spec, self.layout.program(spec), now)
            self.agents[a.pid] = a
            self.of[a.pid] = (batch, now)
            self.batch_left[batch] += 1
            self.counts["started"] += 1
            self._issue(a, now)
        self.task += 1

    def _release_batch(self, now: float) -> None:
        self.batch += 1
        self.batch_released.append(now)
        for _ in range(self.spec.tasks):
            self._release_group(now, self.batch)

    def _refill(self, now: float) -> None:
        """Async: top up to ``programs`` in flight by whole groups."""
        while len(self.agents) + self.spec.group_size <= self.programs:
            self._release_group(now, 0)

    def _end_program(self, a: Any, now: float, outcome: str) -> None:
        self.rec.programs.append((a.start, now, outcome))
        self.counts[outcome] += 1
        del self.agents[a.pid]
        self.router.release(a, now)
        batch, released = self.of.pop(a.pid)
        self.done.append(ProgramDone(a.spec.group_id or a.pid, batch, released, self.first_response.pop(a.pid, None),
                                     now, a.step, outcome == "completed"))
        self.batch_left[batch] -= 1
        if self.spec.mode == "async":
            self._refill(now)
        elif self.batch_left[batch] == 0:
            if self.batch + 1 < self.spec.batches:
                self._release_batch(now)
            else:
                self.finished = True

    def _tool_end(self, a: Any, now: float) -> None:
        self.batch_steps[self.of[a.pid][0]] += 1
        super()._tool_end(a, now)

    def _completed(self, c: Completion, now: float) -> None:
        a = self.by_rid.get(c.rid)
        if a is not None and c.finish_reason == "abort" and c.error is None and self.pausing:
            self.by_rid.pop(c.rid)
            a.worker = None
            self._dispatch(self.router.complete(a, None, now), now)
            self.counts["resent"] += 1
            self._issue(a, now)  # held by thunder's window, or waits at the paused engine's door
            return
        super()._completed(c, now)
        if a is not None and c.error is None and c.finish_reason != "abort":
            self.first_response.setdefault(a.pid, c.time)

    # ---- the trainer --------------------------------------------------------------------
    def _submit(self, d: Dispatch, now: float) -> None:
        if not self.workers[d.worker].accepting:
            self.door[d.worker].append(d)
            return
        super()._submit(d, now)

    def _event(self, kind: int, a: Any, now: float) -> None:
        if kind == WINDOW_OPEN:
            self._open(now)
        elif kind == WINDOW_CLOSE:
            self._close(now)
        else:
            super()._event(kind, a, now)

    def _thunder(self) -> ThunderRouter | None:
        return self.router if isinstance(self.router, ThunderRouter) else None

    def _open(self, now: float) -> None:
        th = self._thunder()
        if th is not None:
            th.ctl.windows.hold(Reason.WEIGHT_SYNC, now)
        self.pausing = True
        for i, w in enumerate(self.workers):
            self.read(i, now)
            control.pause(w, self.spec.update_pause, now)
            self._requeue(i)
        held0 = th.ctl.stats.window_held if th is not None else 0
        self.windows.append({"start": now, "held_before": held0, "in_flight": len(self.by_rid)})
        self._push(now + self.spec.update_seconds, WINDOW_CLOSE, None)

    def _close(self, now: float) -> None:
        th = self._thunder()
        version = f"step-{len(self.windows)}"
        flushed = []
        for i, w in enumerate(self.workers):
            self.read(i, now)
            ok, _ = control.update_weights(w, version, flush=True)
            if ok:
                flushed.append(i)
        if th is not None:
            th.ctl.reset_kv([b.key for i in flushed for b in th.backends[i]], now)
        for i, w in enumerate(self.workers):
            control.resume_generation(w, now)
            self._requeue(i)
        self.pausing = False
        waiting = [d for door in self.door for d in door]
        for door in self.door:
            door.clear()
        for d in waiting:
            self._submit(d, now)
        win = self.windows[-1]
        win.update(end=now, flushed=len(flushed), door=len(waiting),
                   held=(th.ctl.stats.window_held - win.pop("held_before")) if th is not None else 0)
        if th is not None:
            th.ctl.windows.release(Reason.WEIGHT_SYNC, now)
            th.ctl.kick()

    # ---- reports ------------------------------------------------------------------------
    def ledger(self) -> dict[str, int]:
        out = super().ledger()
        out["requests_accounted"] += self.counts["resent"] + sum(len(d) for d in self.door)
        return out

    def rollout_summary(self) -> dict[str, Any]:
        errors = dict(self.rec.errors)
        lost = sum(v for k, v in errors.items() if k != "context_overflow")
        out: dict[str, Any] = {
            "mode": self.spec.mode, "group_size": self.spec.group_size, "tasks": self.spec.tasks,
            "update_every_s": self.spec.update_every_s, "update_seconds": self.spec.update_seconds,
            "update_pause": self.spec.update_pause, "windows": len(self.windows),
            "window_held": sum(w.get("held", 0) for w in self.windows),
            "window_door": sum(w.get("door", 0) for w in self.windows),
            "resent_after_abort": self.counts["resent"], "requests_lost": lost,
            "held_left": self.router.held_count, "programs_failed": self.counts["failed"],
        }
        if self.spec.mode == "sync":
            batches = []
            for b, released in enumerate(self.batch_released):
                mine = [d for d in self.done if d.batch == b]
                batches.append(batch_measures(b, released, mine, self.batch_steps[b]))
            out["batches"] = batches
            out["batches_done"] = sum(1 for b in range(len(self.batch_released)) if self.batch_left[b] == 0)
        else:
            lo, hi = self.rec.warmup_s, self.rec.end_s
            groups: dict[str, list[ProgramDone]] = {}
            for d in self.done:
                groups.setdefault(d.group, []).append(d)
            # groups whose members all ended inside the measured window
            whole = [d for g in groups.values() if len(g) == self.spec.group_size
                     and all(lo <= d.end <= hi for d in g) for d in g]
            out.update(group_measures(whole))
        return out

    def result(self) -> RunResult:
        r = super().result()
        s = self.rollout_summary()
        if self.spec.mode == "sync":
            span = self.now - (self.batch_released[0] if self.batch_released else 0.0)
            steps = sum(self.batch_steps.values())
            r.window_s = span
            r.steps_per_min = 60.0 * steps / span if span > 0 else 0.0
            r.steps_completed = steps
        r.rollout = s
        return r
