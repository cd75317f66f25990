"""Placement: the stages that put waiting programs onto backends.

1. **Open backends** (``open_backends``): available (healthy, fresh, not draining), not
   paused behind the router (``backends.pause``), not under engine pressure, and below their
   low watermark.
2. **Queue entries** (``queue.build``): the waiting programs that may fit somewhere, best first.
3. **Pick a backend** (``Picker``): where a program goes. ``PreviousThenMostRoom`` — the
   default — prefers the program's previous backend when it fits there (its KV may still be
   cached: reload is linear in c, recompute quadratic), else the open backend with the most
   free pool that fits (migration). A cost-aware picker replaces this stage, nothing else.
4. **Reserve**: a program that has waited ``reserve_after_seconds`` and fits nowhere stops the
   walk, so capacity accumulates for it (``place``).

``Rooms`` keeps the open backends by free pool (largest first) in a lazily invalidated heap,
and the most HBM room among them, so a program larger than any room is skipped without trying
(rooms only shrink while placing) and the walk stops once nothing left can fit.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from thunder_sgl.config import SchedulerConfig
from thunder_sgl.programs import Program
from thunder_sgl.scheduler import queue
from thunder_sgl.scheduler.capacity import BackendLoad
from thunder_sgl.scheduler.cost import ProgramCost

PRUNE_AFTER = 128
"""Consecutive too-large programs after which the rest of the queue is filtered at once."""


@dataclass(frozen=True, slots=True)
class Placement:
    program_id: str
    backend: str
    admit: bool
    """True for a new program's first placement, False for a restore."""
    migrated: bool
    """Restored onto a different backend than the one it last ran on."""


class Rooms:
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
        """Most HBM room on any open backend that accepts (inf if one is empty)."""
        return self._best_hbm

    def update(self, ld: BackendLoad) -> None:
        v = self._version.get(id(ld), 0) + 1
        self._version[id(ld)] = v
        free = ld.room()
        old = self._hbm.get(id(ld))
        self._hbm[id(ld)] = hbm = ld.hbm_room() if free is not None else float("-inf")
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


class Picker(Protocol):
    """Stage 3: choose the backend for one waiting program. ``open_loads`` are the open
    backends by key; ``rooms`` their free pool. Returns None when the program fits nowhere.
    Must not mutate anything (the caller adds the program to the chosen load)."""

    def pick(self, p: Program, pc: ProgramCost, open_loads: dict[str, BackendLoad], rooms: Rooms,
             gate_hbm: bool) -> BackendLoad | None: ...


class PreviousThenMostRoom:
    """The previous backend if the program fits there, else the open backend with the most
    free pool where it fits."""

    def pick(self, p: Program, pc: ProgramCost, open_loads: dict[str, BackendLoad], rooms: Rooms,
             gate_hbm: bool) -> BackendLoad | None:
        prev = open_loads.get(p.prev_backend) if p.prev_backend else None
        if prev is not None and prev.fits(pc, gate_hbm):
            return prev
        return rooms.first(lambda ld: ld.fits(pc, gate_hbm))


def open_backends(loads: dict[str, BackendLoad], now: float, stale_after: float,
                  cfg: SchedulerConfig) -> dict[str, BackendLoad]:
    """Stage 1: the backends that take programs this tick."""
    return {
        key: ld for key, ld in loads.items()
        if ld.backend.available(now, stale_after)
        and not ld.backend.engine_paused
        and (ld.request_level or not ld.backend.under_pressure(cfg.pressure_waiting_reqs))
    }


def place(now: float, waiting: list[Program], open_loads: dict[str, BackendLoad], cfg: SchedulerConfig,
          picker: Picker) -> tuple[list[Placement], str | None]:
    """Stages 2–4: walk the queue best first and place what fits; a long waiter that fits
    nowhere reserves. Returns the placements and the reserving program's id (or None)."""
    if not waiting or not open_loads:
        return [], None
    rooms = Rooms(open_loads.values())
    best, best_hbm = rooms.best(), rooms.best_hbm()
    if best < 0:
        return [], None  # every open backend is at its low watermark: nothing is placed
    heap, smallest = queue.build(waiting, cfg, now, best, best_hbm)
    placements: list[Placement] = []
    reserved: str | None = None
    reserve_after = cfg.reserve_after_seconds
    gate = cfg.tier_aware
    skipped = 0
    while heap and smallest.fits_somewhere(best, best_hbm):
        e = queue.pop(heap, cfg)
        p = e.program
        target = None
        if e.need <= best and e.hbm_need <= best_hbm:
            target = picker.pick(p, e.cost, open_loads, rooms, gate)
        elif e.gated and e.need <= best and now - e.waited_from >= reserve_after:
            # only the HBM condition keeps a long waiter out: placed by the pool alone, its
            # request waits at the gate first in line (queue's header: bounded waits)
            target = picker.pick(p, e.cost, open_loads, rooms, False)
        else:
            skipped += 1
            if skipped >= PRUNE_AFTER and len(heap) > PRUNE_AFTER:
                # Many in a row no longer fit: drop the rest that cannot, at once.
                heap, smallest = queue.prune(heap, best, best_hbm, now, cfg)
                skipped = 0
        if target is None:
            if now - e.waited_from >= reserve_after:
                reserved = p.id
                break
            continue
        target.add(BackendLoad.placed(p, e.cost))
        rooms.update(target)
        best, best_hbm = rooms.best(), rooms.best_hbm()
        key = target.backend.key
        placements.append(Placement(p.id, key, admit=not p.admitted,
                                    migrated=p.admitted and p.prev_backend is not None and p.prev_backend != key))
    return placements, reserved
