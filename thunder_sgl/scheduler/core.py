"""The thunder scheduler core: one pure ``tick(now, programs, backends) -> Decisions``.

No I/O and no clock reads: time and state come in, decisions go out, nothing is mutated
(``apply`` does that, separately). Each tick:

1. **Account.** Every active program adds its decayed demand to its backend
   (``capacity.BackendLoad``). Paused and new programs form the global waiting queue.
2. **Pause (thrash check).** On a backend whose demand exceeds ``λ_max · pool``, pause idle
   programs — acting ones before ones whose request the HBM gate holds — by lowest decayed
   weight, then shortest context (recompute ∝ c², paper Lemma 4.1), until the excess is freed;
   then drop from the pause set every program whose removal still frees the excess, so no
   more than the excess is ever paused. Reasoning programs are never paused (a pause never
   cuts a request mid-decode). An unavailable backend (unhealthy, stale, draining) counts
   as full: every idle program on it goes back to the queue, to migrate.
3. **Restore / admit.** Waiting programs in order of an aging score — held requests, then
   idle programs, then new programs, each class a head start in seconds, plus the time
   waited — are placed where they fit: the previous backend if it has room (its KV may still
   be cached there: reload is linear in c, recompute quadratic), else the backend with the
   most free pool (migration). A backend accepts restores only while its demand is below
   ``λ_min · pool`` and the placement keeps it within ``λ_max · pool``; in tier-aware mode
   a program with a held request must also fit the HBM condition. When a program has waited
   ``reserve_after_seconds`` and fits nowhere, nothing behind it is placed, so capacity
   accumulates for it and every wait stays bounded. Rooms only shrink while placing, so a
   program larger than the most room of any open backend (pool, or HBM for a held request)
   is skipped without trying, and placing stops once nothing left in the queue can fit.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from thunder_sgl.backends.backend import Backend
from thunder_sgl.config import SchedulerConfig
from thunder_sgl.programs import Program, ProgramState, ProgramTable
from thunder_sgl.scheduler.capacity import BackendLoad, Member, decay_weights, expected_output

EPS = 1e-6


@dataclass(frozen=True, slots=True)
class Placement:
    program_id: str
    backend: str
    admit: bool
    """True for a new program's first placement, False for a restore."""
    migrated: bool
    """Restored onto a different backend than the one it last ran on."""


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

    @property
    def empty(self) -> bool:
        return not self.pauses and not self.placements


_Entry = tuple[float, int, str, Program, float, float, float]
"""A queue entry: (order key, demand tokens, id, program, private need, HBM need if gated
(else −inf), waiting since)."""


class ThunderPolicy:
    """Program-level pause/restore under KV pressure, one global queue, tier-aware pool."""

    def __init__(self, cfg: SchedulerConfig, stale_after: float = float("inf")) -> None:
        self.cfg = cfg
        self.stale_after = stale_after
        self._decay = decay_weights(cfg)

    # ------------------------------------------------------------------------------------
    def tick(self, now: float, programs: ProgramTable, backends: Sequence[Backend]) -> Decisions:
        cfg = self.cfg
        loads = {b.key: BackendLoad.for_backend(b, cfg) for b in backends}
        default_out = float(cfg.default_output_tokens)
        for key, load in loads.items():
            load.account(programs.on_backend(key), now, cfg.tick_seconds, self._decay, default_out)
        # Programs on a backend that was removed go back to the queue (to migrate).
        orphans = [
            p.id for key in programs.backend_keys() if key not in loads
            for p in programs.on_backend(key) if p.in_flight == 0
        ]
        waiting = programs.waiting()

        pauses = orphans
        for load in loads.values():
            if not load.backend.available(now, self.stale_after):
                pauses.extend(self._evacuate(load))
            elif load.demand > load.limit_hi + EPS:
                pauses.extend(self._pause_excess(load))

        placements, reserved = self._place(now, waiting, loads)
        return Decisions(
            pauses=tuple(pauses),
            placements=tuple(placements),
            reserved_for=reserved,
            demand={k: v.demand for k, v in loads.items()},
            pool={k: v.pool for k, v in loads.items()},
        )

    # ---- pause ---------------------------------------------------------------------------
    def _evacuate(self, load: BackendLoad) -> list[str]:
        out = []
        for m in load.members(self.cfg, idle_only=True):
            load.remove(m)
            out.append(m.program.id)
        return out

    def _pause_excess(self, load: BackendLoad) -> list[str]:
        excess = load.demand - load.limit_hi
        cands = load.members(self.cfg, idle_only=True)
        # Acting programs first (held ones last), lowest decayed weight, then shortest context.
        cands.sort(key=lambda m: (m.program.held > 0, m.weight, m.program.demand_tokens(), m.program.id))
        chosen: list[Member] = []
        freed = 0.0
        for m in cands:
            if freed >= excess - EPS:
                break
            freed += load.freed_by(m)
            load.remove(m)
            chosen.append(m)
        # Minimality: give back every program whose pause the excess does not need, trying
        # the most valuable to keep (latest in the order) first.
        kept: list[Member] = []
        for m in reversed(chosen):
            gain = m.private + load.shared_added(m.key, m.shared)
            if freed - gain >= excess - EPS:
                load.add(m)
                freed -= gain
            else:
                kept.append(m)
        return [m.program.id for m in reversed(kept)]

    # ---- restore / admit -----------------------------------------------------------------
    def _score(self, p: Program, now: float) -> float:
        cfg = self.cfg
        since = p.waiting_since if p.waiting_since is not None else p.created_at
        if not p.admitted:
            bonus = 0.0
        elif p.held:
            bonus = cfg.held_bonus_seconds
        else:
            bonus = cfg.idle_bonus_seconds
        return (now - since) + bonus

    def queue_order(self, now: float, waiting: Iterable[Program]) -> list[Program]:
        """The global queue, best first (exposed for /programs and for prefetching)."""
        queue, _ = self._queue(waiting)
        queue.sort()
        return [e[3] for e in queue]

    def _queue(
        self, waiting: Iterable[Program], room: float = float("inf"), hbm_room: float = float("inf"),
        now: float = 0.0,
    ) -> tuple[list[_Entry], tuple[float, float, float]]:
        """Queue entries ordered by (waiting_since − class bonus, demand, id) — ascending is
        best first, the same order as descending ``_score`` — and the smallest needs in the
        queue: private demand of an ungated entry, private demand and HBM need of a gated
        (held, tier-aware) one. A flat loop: with thousands of waiting programs this runs
        every tick.

        ``room`` / ``hbm_room``: the most free pool, and the most HBM room for reasoning KV, of
        any open backend. A program whose private demand exceeds ``room``, or (tier-aware) a
        held one whose context plus expected output exceeds ``hbm_room``, cannot be placed
        this tick (rooms only shrink while placing), so it is left out — except the
        best-ordered one among those that have waited past ``reserve_after_seconds``, which
        stays in so that it still reserves capacity."""
        cfg = self.cfg
        held_bonus, idle_bonus = cfg.held_bonus_seconds, cfg.idle_bonus_seconds
        reserve_after = cfg.reserve_after_seconds
        gate = cfg.tier_aware
        default_out = float(cfg.default_output_tokens)
        no_gate = float("-inf")
        queue = []
        inf = float("inf")
        min_need = min_gated = min_hneed = inf
        blocker: _Entry | None = None
        for p in waiting:
            if not p.admitted and not p.held:
                continue  # known only by its sandbox so far: nothing to run, nothing to size
            since = waited_from = p.waiting_since
            if since is None:
                since = waited_from = p.created_at
            if p.admitted:
                since -= held_bonus if p.held else idle_bonus
            c = p.context_tokens
            pp = p.pending_prompt_tokens
            if pp > c:
                c = pp
            need = c
            if p.prefix_key:
                sp = p.shared_prefix_tokens
                need = c - (sp if sp < c else c)
            hneed = no_gate
            if gate and p.held:
                eo = p.expected_output_tokens
                hneed = c + (eo if eo > 0 else default_out)
            if need > room or hneed > hbm_room:
                if now - waited_from >= reserve_after and (
                    blocker is None or since < blocker[0] or (since == blocker[0] and (c, p.id) < blocker[1:3])
                ):
                    blocker = (since, c, p.id, p, need, hneed, waited_from)
                continue
            if hneed == no_gate:
                if need < min_need:
                    min_need = need
            else:
                if need < min_gated:
                    min_gated = need
                if hneed < min_hneed:
                    min_hneed = hneed
            queue.append((since, c, p.id, p, need, hneed, waited_from))
        if blocker is not None:
            queue.append(blocker)
        return queue, (min_need, min_gated, min_hneed)

    def _place(
        self, now: float, waiting: list[Program], loads: dict[str, BackendLoad]
    ) -> tuple[list[Placement], str | None]:
        if not waiting:
            return [], None
        cfg = self.cfg
        open_loads = {
            key: ld for key, ld in loads.items()
            if ld.backend.available(now, self.stale_after)
            and not ld.backend.under_pressure(cfg.pressure_waiting_reqs)
        }
        if not open_loads:
            return [], None
        rooms = _Rooms(open_loads.values())
        best, best_hbm = rooms.best(), rooms.best_hbm()
        if best < 0:
            return [], None  # every open backend is at its low watermark: nothing is placed
        queue, (min_need, min_gated, min_hneed) = self._queue(waiting, best, best_hbm, now)
        if not queue:
            return [], None
        heapq.heapify(queue)
        placements: list[Placement] = []
        reserved: str | None = None
        reserve_after = cfg.reserve_after_seconds
        skipped = 0
        # Something in the queue may still fit (rooms only shrink, so once nothing can, stop).
        while queue and (best >= min_need or (best >= min_gated and best_hbm >= min_hneed)):
            _, c, _, p, need, hneed, waited_from = heapq.heappop(queue)
            # Rooms only shrink while placing: a program larger than the best room (pool, or
            # HBM for a held one) fits nowhere, and the check here saves a _choose call.
            if need <= best and hneed <= best_hbm:
                target = self._choose(p, c, open_loads, rooms)
            else:
                target = None
                skipped += 1
                if skipped >= _PRUNE_AFTER and len(queue) > _PRUNE_AFTER:
                    # Many in a row no longer fit: drop the rest that cannot, at once.
                    queue, (min_need, min_gated, min_hneed) = _prune(queue, best, best_hbm, now, reserve_after)
                    skipped = 0
            if target is None:
                if now - waited_from >= reserve_after:
                    reserved = p.id
                    break
                continue
            target.add(target.member(p, 1.0, cfg))
            rooms.update(target)
            best, best_hbm = rooms.best(), rooms.best_hbm()
            key = target.backend.key
            placements.append(
                Placement(p.id, key, admit=not p.admitted,
                          migrated=p.admitted and p.prev_backend is not None and p.prev_backend != key)
            )
        return placements, reserved

    def _choose(
        self, p: Program, c: int, open_loads: dict[str, BackendLoad], rooms: _Rooms
    ) -> BackendLoad | None:
        """The previous backend if it fits, else the open backend with most free pool that fits."""
        s = min(p.shared_prefix_tokens, c) if p.prefix_key else 0
        private = float(c - s)
        reasoning_add = c + expected_output(p, self.cfg) if p.held else 0.0
        gate = self.cfg.tier_aware

        def ok(ld: BackendLoad) -> bool:
            return ld.fits(private + ld.shared_added(p.prefix_key, p.shared_prefix_tokens), reasoning_add, gate)

        prev = open_loads.get(p.prev_backend) if p.prev_backend else None
        if prev is not None and ok(prev):
            return prev
        # Not redundant with the caller's size check: with reasoning_add 0 (no held request)
        # this still refuses a placement off the previous backend while every open backend's
        # reasoning KV is past its HBM limit (best_hbm < 0), which ``fits`` alone would allow.
        if private > rooms.best() or (gate and reasoning_add > rooms.best_hbm()):
            return None
        return rooms.first(ok)


_PRUNE_AFTER = 128
"""Consecutive too-large programs after which the rest of the queue is filtered at once."""


def _prune(
    queue: list[_Entry], best: float, best_hbm: float, now: float, reserve_after: float
) -> tuple[list[_Entry], tuple[float, float, float]]:
    """The entries that may still fit under the current rooms (a heap again), plus — as in
    ``_queue`` — the best-ordered one among the rest that waited past ``reserve_after``, so a
    long waiter still reserves; and the new smallest needs."""
    keep = [e for e in queue if e[4] <= best and e[5] <= best_hbm]
    inf = float("inf")
    min_need = min((e[4] for e in keep if e[5] == -inf), default=inf)
    min_gated = min((e[4] for e in keep if e[5] != -inf), default=inf)
    min_hneed = min((e[5] for e in keep if e[5] != -inf), default=inf)
    if len(keep) < len(queue):
        blocker = min(
            (e for e in queue if (e[4] > best or e[5] > best_hbm) and now - e[6] >= reserve_after),
            default=None,
        )
        if blocker is not None:
            keep.append(blocker)
    heapq.heapify(keep)
    return keep, (min_need, min_gated, min_hneed)


class _Rooms:
    """Open backends by free pool (largest first), as a lazily invalidated heap.

    An empty backend has unlimited room (it accepts any program); a backend at or above its
    low watermark accepts nothing this tick and leaves the heap.
    """

    def __init__(self, loads: Iterable[BackendLoad]) -> None:
        self._version: dict[int, int] = {}
        self._heap: list[tuple[float, int, int, BackendLoad]] = []
        self._hbm: dict[int, float] = {}
        self._best_hbm = float("-inf")
        self._seq = 0
        for ld in loads:
            self.update(ld)

    def best_hbm(self) -> float:
        """Most HBM room for reasoning KV on any open backend (inf if one is empty)."""
        return self._best_hbm

    @staticmethod
    def _free(ld: BackendLoad) -> float | None:
        if ld.active == 0:
            return float("inf")
        if ld.demand >= ld.limit_lo:
            return None
        return ld.limit_hi - ld.demand

    def update(self, ld: BackendLoad) -> None:
        v = self._version.get(id(ld), 0) + 1
        self._version[id(ld)] = v
        free = self._free(ld)
        old = self._hbm.get(id(ld))
        self._hbm[id(ld)] = hbm = (float("inf") if ld.active == 0 else ld.hbm_limit - ld.reasoning) if free is not None else float("-inf")
        if hbm >= self._best_hbm:
            self._best_hbm = hbm
        elif old is not None and old >= self._best_hbm:
            self._best_hbm = max(self._hbm.values())
        if free is not None:
            self._seq += 1
            heapq.heappush(self._heap, (-free, self._seq, v, ld))

    def _clean(self) -> None:
        h = self._heap
        while h and self._version[id(h[0][3])] != h[0][2]:
            heapq.heappop(h)

    def best(self) -> float:
        self._clean()
        return -self._heap[0][0] if self._heap else -1.0

    def first(self, ok: Callable[[BackendLoad], bool]) -> BackendLoad | None:
        """The backend with most room that satisfies ``ok`` (heap order restored after)."""
        popped = []
        found = None
        h = self._heap
        while True:
            self._clean()
            if not h:
                break
            entry = heapq.heappop(h)
            popped.append(entry)
            if ok(entry[3]):
                found = entry[3]
                break
        for e in popped:
            heapq.heappush(h, e)
        return found


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
