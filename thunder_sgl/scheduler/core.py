"""The thunder scheduler: one pure ``tick(now, programs, backends) -> Decisions``.

No I/O and no clock reads: time and state come in, decisions go out, nothing is mutated
(``apply`` does that, separately). Each tick:

1. **Account.** Every active program adds its decayed demand to its backend
   (``capacity.BackendLoad``, quantities from ``cost``): the decay is the paper's ``x^-k``, or
   with ``decay: returns`` the backend's own table from its measured silences
   (``cost.returns_weights``, renewed every ``TABLE_TICKS`` ticks). Paused and new programs
   form the global waiting queue.
2. **Admission level.** Each backend's watermarks are ``λ_max·pool`` and ``λ_min·pool``, plus
   the extra tokens the admission rule of ``admission.mode`` allows beyond them
   (``admission_rules``: ``goodput``, the default: the level with the best predicted and
   measured steps/s; ``occupancy``, the previous rule; 0 for ``fixed``). On a backend
   admitted beyond ``λ_max·pool``, the programs past what the rule protects (``λ_max·pool``,
   or less when the rule finds references cost more than they save) in pause order (acting,
   lowest weight, shortest) are *overcommitted*: their KV is not referenced
   (``Decisions.unref``), so the engine evicts it before that of the others.
3. **Pause (thrash check).** On a backend whose demand exceeds its high watermark, pause idle
   programs — acting ones before ones whose request the HBM gate holds — by lowest decayed
   weight, then shortest context (recompute ∝ c², paper Lemma 4.1), until the excess is freed;
   then drop from the pause set every program whose removal still frees the excess, so no
   more than the excess is ever paused. Reasoning programs are never paused (a pause never
   cuts a request mid-decode). An unavailable backend (unhealthy, stale, draining) counts
   as full: every idle program on it goes back to the queue, to migrate. A backend whose
   engine is paused behind the router (``Backend.engine_paused``) is frozen: no program there
   is paused, none is placed there, its admission rule measures nothing.
4. **Restore / admit** (``placement``): waiting programs in aging order (``queue``) are placed
   where they fit — the previous backend first, else the one with the most free pool. A
   backend accepts restores only while its demand is below its low watermark and the
   placement keeps it within its high watermark; in tier-aware mode a program with a held
   request must also satisfy the HBM condition (``gate``). A long waiter that fits nowhere
   reserves capacity, so every wait stays bounded.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from thunder_sgl.backends.backend import AdmissionLevel, Backend
from thunder_sgl.config import SchedulerConfig
from thunder_sgl.programs import Program, ProgramState, ProgramTable
from thunder_sgl.scheduler import queue
from thunder_sgl.scheduler.admission_rules import admission_rule
from thunder_sgl.scheduler.capacity import BackendLoad, Member
from thunder_sgl.scheduler.cost import cost_of, decay_weights, returns_weights
from thunder_sgl.scheduler.gate import RequestGate, hbm_limit
from thunder_sgl.scheduler.goodput import BackendView
from thunder_sgl.scheduler.placement import (
    Picker,
    Placement,
    PreviousThenMostRoom,
    open_backends,
    place,
)

EPS = 1e-6
TABLE_TICKS = 12
"""Ticks between two computations of a backend's decay table (``decay: returns``)."""


@dataclass(frozen=True, slots=True)
class Decisions:
    pauses: tuple[str, ...] = ()
    placements: tuple[Placement, ...] = ()
    reserved_for: str | None = None
    """A program so long-waiting that nothing behind it was placed this tick (None when
    nothing in the queue could have been placed anyway)."""
    demand: dict[str, float] = field(default_factory=dict)
    """Per backend, demand after the decisions."""
    pool: dict[str, float] = field(default_factory=dict)
    """Per backend, the pool capacity the decisions were made against."""
    admission: dict[str, AdmissionLevel] = field(default_factory=dict)
    """Per backend, the admission rule's new state (its ``extra`` set the watermarks)."""
    unref: frozenset[str] = frozenset()
    """Active programs whose KV should not be referenced (overcommitted)."""

    @property
    def empty(self) -> bool:
        return not self.pauses and not self.placements


class ThunderScheduler:
    """Program-level pause/restore under KV pressure, one global queue, tier-aware pool."""

    def __init__(self, cfg: SchedulerConfig, stale_after: float = float("inf"), picker: Picker | None = None) -> None:
        self.cfg = cfg
        self.stale_after = stale_after
        self.picker = picker or PreviousThenMostRoom()
        self.gate = RequestGate(cfg)
        """The HBM condition for one request (the controller asks it for every request)."""
        self._decay = decay_weights(cfg)
        self._tables: dict[str, tuple[Backend, float, list[float]]] = {}
        """Per backend key, the backend, when its decay table under ``decay: returns`` was
        computed and the table (``_table``): a memo of a function of the backend's
        measurements, renewed each ``TABLE_TICKS`` ticks, and for a new Backend object under
        the same key (a worker removed and added again starts its measurements afresh)."""
        self._default_out = float(cfg.default_output_tokens)
        self.rule = admission_rule(cfg.admission.mode)
        """The admission rule (``admission_rules``; None: the fixed watermarks)."""

    def tick(self, now: float, programs: ProgramTable, backends: Sequence[Backend]) -> Decisions:
        cfg = self.cfg
        ruled = self.rule is not None
        loads = {b.key: BackendLoad.for_backend(b, cfg, _extra(b), _protect(b), _hbm_extra(b)) if ruled
                 else BackendLoad.for_backend(b, cfg) for b in backends}
        default_out = float(cfg.default_output_tokens)
        for key, load in loads.items():
            load.account(programs.on_backend(key), now, cfg.tick_seconds, self._table(load.backend, now), default_out)
        if len(self._tables) > len(loads):  # backends removed: their tables go with them
            self._tables = {k: v for k, v in self._tables.items() if k in loads}
        levels = self._admission_levels(now, loads, programs.waiting_count)
        pauses = self._orphans(programs, loads)
        for load in loads.values():
            if not load.backend.available(now, self.stale_after):
                pauses.extend(self._evacuate(load))
            elif load.backend.engine_paused:
                continue  # its programs keep their place until the engine continues (backends.pause)
            elif load.demand > load.limit_hi + EPS:
                pauses.extend(self._pause_excess(load))
        unref = self._overcommitted(loads.values())
        placements, reserved = place(now, programs.waiting(), open_backends(loads, now, self.stale_after, cfg),
                                     cfg, self.picker)
        return Decisions(
            pauses=tuple(pauses),
            placements=tuple(placements),
            reserved_for=reserved,
            demand={k: v.demand for k, v in loads.items()},
            pool={k: v.pool for k, v in loads.items()},
            admission=levels,
            unref=unref,
        )

    def _table(self, b: Backend, now: float) -> list[float]:
        """The decay table of ``b``'s programs: the paper's ``x^-k`` (``decay: paper``), or
        ``cost.returns_weights`` of its measured silences, renewed every ``TABLE_TICKS`` ticks
        (a table is 2 × ``max_decay_ticks`` survival reads: too many for every tick at 64
        backends, and the silences it reads change slowly)."""
        if self.cfg.decay != "returns":
            return self._decay
        memo = self._tables.get(b.key)
        if memo is not None and memo[0] is b and 0.0 <= now - memo[1] < TABLE_TICKS * self.cfg.tick_seconds:
            return memo[2]
        table = returns_weights(self.cfg, self._decay, b.served.returns, b.served.request_s)
        self._tables[b.key] = (b, now, table)
        return table

    def queue_order(self, now: float, waiting: Iterable[Program]) -> list[Program]:
        """The global queue, best first (exposed for /programs and for prefetching)."""
        return queue.order(waiting, self.cfg)

    def changed(self, p: Program) -> None:
        """The request path wrote p's cost inputs (a request started, ended, was held or
        withdrawn): its ``ProgramCost`` is computed now, once for the change, and the next
        tick reads it cached. Computed at the tick instead, it was a quarter of a tick's first
        evaluation at 10,000 programs (about 3,000 programs change between two ticks there,
        ~1 µs each), all of it while the event loop waits."""
        cost_of(p, self._default_out)

    # ---- admission level -------------------------------------------------------------------
    def _admission_levels(self, now: float, loads: dict[str, BackendLoad], waiting: int) -> dict[str, AdmissionLevel]:
        rule = self.rule
        if rule is None:
            return {}
        out: dict[str, AdmissionLevel] = {}
        share = self._shares(now, loads, waiting)
        for key, ld in loads.items():
            b = ld.backend
            st = b.admission if isinstance(b.admission, rule.state) else None
            if b.engine_paused:
                if st is not None:
                    out[key] = rule.rest(st)  # nothing to measure; the period restarts at the resume
                continue
            supply = share.get(key, ld.active + waiting)
            new = rule.update(st, b, self._view(ld, supply), now, self.cfg)
            if (new.extra != ld.extra or min(new.protect, ld.fit_limit) != ld.protect_limit
                    or ld.hbm_limit != hbm_limit(self.cfg, b, new.hbm_extra)):
                ld.set_extra(self.cfg, new.extra, new.protect, new.hbm_extra)
            if ld.extra > 0:  # above the watermarks: no more than its share (one backend: all)
                ld.max_active = supply
            ld.request_level = getattr(new, "open_stream", False)
            out[key] = new
        return out

    def _shares(self, now: float, loads: dict[str, BackendLoad], waiting: int) -> dict[str, int]:
        """Each open backend's supply: the programs that could run there — its share, by pool,
        of every program there is to run (the open backends' active ones and the global
        queue), or its own active programs where they are more.

        Not its own programs plus the whole queue: a backend's top admission level admits its
        supply, so with that supply the backend that held more programs had the larger limit,
        the more room, and drew the next program too (DES, two engines, cell
        ctx10-tool2-out16-x2: 32 programs on one engine and 9 on the other, both at the top
        level, the second idle 40% of the time). With one backend the share is all of it."""
        open_ = [ld for ld in loads.values()
                 if ld.backend.available(now, self.stale_after) and not ld.backend.engine_paused]
        pools = sum(ld.pool for ld in open_)
        if not open_ or pools <= 0:
            return {}
        total = waiting + sum(ld.active for ld in open_)
        return {ld.backend.key: max(ld.active, math.ceil(total * ld.pool / pools - EPS)) for ld in open_}

    def _view(self, ld: BackendLoad, supply: int) -> BackendView:
        n = ld.active
        return BackendView(pool=ld.pool, fit_limit=ld.fit_limit, demand=ld.demand,
                           shared=float(sum(ld.key_shared.values())), active=n, ended=max(0.0, ld.ended),
                           context=ld.private_tokens / n if n else 0.0,
                           output=ld.output / n if n else float(self.cfg.default_output_tokens),
                           supply=supply, limit_lo=ld.limit_lo, mean_tokens=ld.tokens / n if n else 0.0)

    @staticmethod
    def _overcommitted(loads: Iterable[BackendLoad]) -> frozenset[str]:
        """Programs beyond what the rule protects (``protect_limit``: ``λ_max·pool`` or less) in
        pause order, on backends admitted past ``λ_max·pool``."""
        out: set[str] = set()
        for ld in loads:
            over = ld.demand - ld.protect_limit
            if ld.extra <= 0 or over <= EPS:
                continue
            freed = 0.0
            for m in sorted(ld.members(idle_only=True), key=_pause_order):
                if freed >= over - EPS:
                    break
                freed += m.private
                out.add(m.program.id)
        return frozenset(out)

    # ---- account ---------------------------------------------------------------------------
    @staticmethod
    def _orphans(programs: ProgramTable, loads: dict[str, BackendLoad]) -> list[str]:
        """Idle programs on a backend that was removed go back to the queue (to migrate)."""
        return [p.id for key in programs.backend_keys() if key not in loads
                for p in programs.on_backend(key) if p.in_flight == 0]

    # ---- pause -----------------------------------------------------------------------------
    @staticmethod
    def _evacuate(load: BackendLoad) -> list[str]:
        out = []
        for m in load.members(idle_only=True):
            load.remove(m)
            out.append(m.program.id)
        return out

    @staticmethod
    def _pause_excess(load: BackendLoad) -> list[str]:
        excess = load.demand - load.limit_hi
        chosen: list[Member] = []
        freed = 0.0
        for cand in load.pause_candidates():
            if freed >= excess - EPS:
                break
            m = load.member(cand.program)
            freed += load.freed_by(m)
            load.remove(m)
            chosen.append(m)
        # Minimality: give back every program whose pause the excess does not need, trying
        # the most valuable to keep (latest in the order) first.
        kept: list[Member] = []
        for m in reversed(chosen):
            gain = m.private + load.shared_added(m.cost)
            if freed - gain >= excess - EPS:
                load.add(m)
                freed -= gain
            else:
                kept.append(m)
        return [m.program.id for m in reversed(kept)]


def _pause_order(m: Member) -> tuple[bool, float, int, str]:
    """Acting programs first (held ones last), lowest decayed weight, then shortest context."""
    return (m.program.held > 0, m.weight, m.cost.tokens, m.program.id)


def _extra(b: Backend) -> float:
    return b.admission.extra if b.admission is not None else 0.0


def _hbm_extra(b: Backend) -> float:
    return b.admission.hbm_extra if b.admission is not None else 0.0


def _protect(b: Backend) -> float:
    return b.admission.protect if b.admission is not None else float("inf")


def apply(decisions: Decisions, programs: ProgramTable, now: float) -> tuple[list[Program], list[Program]]:
    """Carry out a tick's decisions on the program table, skipping programs that changed
    state since the tick (released, or started a request in between). Returns the programs
    actually paused and actually placed."""
    paused, placed = [], []
    for pid in decisions.pauses:
        p = programs.get(pid)
        if p is not None and p.state is ProgramState.ACTIVE and p.in_flight == 0:
            programs.pause(p, now)
            paused.append(p)
    for pl in decisions.placements:
        p = programs.get(pl.program_id)
        if p is None or p.state is not ProgramState.PAUSED or p.admitted == pl.admit:
            continue
        if pl.admit:
            programs.admit(p, pl.backend, now)
        else:
            programs.restore(p, pl.backend, now)
        placed.append(p)
    return paused, placed
