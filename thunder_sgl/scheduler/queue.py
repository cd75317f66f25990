"""The global waiting queue: who waits, in which order, and who reserves capacity.

Order (best first): ``since − head start``, then fewer tokens, then id — ascending, so it is
the same order as descending aging score ``waited + head start``. The head start is the
restore class: a paused program with a held request (``held_bonus_seconds``) before an idle
paused program (``idle_bonus_seconds``) before a new program (0). A new program with no
request (known by its sandbox only) and a dormant one (``Program.dormant``) wait for a request.
A group member adds ``group_bonus_seconds × done share`` (``groups``: the share of its group's
members already finished), so the group ages as its members finish: a training step waits for
the group's last member, and that member goes before newer work. Aging makes every wait bounded: a program that
has waited longer than anyone's head start ranks first whatever its class.

A program that has waited ``reserve_after_seconds`` and fits nowhere *reserves*: nothing behind
it is placed, so capacity accumulates for it. One that fits a pool but not the HBM condition
(tier-aware, a held request) would not: the requests of the programs already placed keep taking
the HBM room as it frees, so once it has waited that long it is placed by the pool alone
(``placement.place``) and its request waits at that backend's gate, first in line (``gate``: a
request held that long makes newer ones wait behind it). Its need is counted as ungated in
``Smallest`` for that. ``build`` also drops entries that cannot fit this tick — larger than the
most room of any open backend, pool or (gated) HBM; rooms only shrink while placing — but keeps
the best-ordered long waiter among them, so it still reserves.

The heap holds ``Waiting`` items — named tuples whose sort keys come first, so the heap
compares them in C — and ``QueueEntry`` adds what placement needs to the one taken off the heap
(``pop``): thousands wait, a few dozen are looked at per tick.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from thunder_sgl.config import SchedulerConfig
from thunder_sgl.programs import Program
from thunder_sgl.scheduler.cost import ProgramCost, cost_of

INF = float("inf")


@dataclass(slots=True, eq=False)
class QueueEntry:
    program: Program
    cost: ProgramCost
    since: float
    """Start of the wait minus the class head start: the first sort key."""
    waited_from: float
    """Start of the wait (for the reservation rule)."""
    gated: bool
    """The HBM condition applies to its placement (tier-aware policy, a held request)."""
    need: int
    """Pool tokens it needs: ``cost.private`` (a new prefix is added by the backend)."""
    hbm_need: float
    """``cost.hbm`` when gated, else −inf (no HBM condition)."""



class Waiting(NamedTuple):
    """One waiting program on the heap, ordered by its first three fields (the id is unique,
    so the program is never compared)."""

    since: float
    """Start of the wait minus the class head start."""
    tokens: int
    """Its context c (fewer first)."""
    id: str
    program: Program
    cost: ProgramCost


_new = tuple.__new__


@dataclass(slots=True)
class Smallest:
    """The smallest needs left in the queue: rooms below them mean nothing more can be placed."""

    need: float = INF
    """Pool need of an ungated entry."""
    gated_need: float = INF
    """Pool need of a gated entry ..."""
    gated_hbm: float = INF
    """... and its HBM need."""

    def fits_somewhere(self, room: float, hbm_room: float) -> bool:
        return room >= self.need or (room >= self.gated_need and hbm_room >= self.gated_hbm)

    def add(self, need: float, hbm_need: float) -> None:
        """Count an entry: ``hbm_need`` is −inf for an ungated one."""
        if hbm_need == -INF:
            if need < self.need:
                self.need = need
        else:
            if need < self.gated_need:
                self.gated_need = need
            if hbm_need < self.gated_hbm:
                self.gated_hbm = hbm_need


def item(p: Program, cfg: SchedulerConfig, default_out: float) -> Waiting | None:
    """The heap item of a waiting program (None for one known only by its sandbox so far:
    nothing to run, nothing to size)."""
    if not p.held and (not p.admitted or p.dormant):
        return None
    since = p.waiting_since if p.waiting_since is not None else p.created_at
    if p.admitted:
        since -= cfg.held_bonus_seconds if p.held else cfg.idle_bonus_seconds
    g = p.group
    if g is not None and g.done and cfg.groups:
        since -= cfg.group_bonus_seconds * g.done_share
    pc = cost_of(p, default_out)
    return _new(Waiting, (since, pc.tokens, p.id, p, pc))


def entry(it: Waiting, cfg: SchedulerConfig) -> QueueEntry:
    p, pc = it.program, it.cost
    gated = cfg.tier_aware and p.held > 0
    waited_from = p.waiting_since if p.waiting_since is not None else p.created_at
    return QueueEntry(p, pc, it.since, waited_from, gated, pc.private, pc.hbm if gated else -INF)


def pop(heap: list[Waiting], cfg: SchedulerConfig) -> QueueEntry:
    return entry(heapq.heappop(heap), cfg)


def _needs(it: Waiting, gate: bool) -> tuple[int, float, float]:
    """(pool need, HBM need or −inf, start of the wait) of a heap item."""
    p, pc = it.program, it.cost
    w = p.waiting_since if p.waiting_since is not None else p.created_at
    return pc.private, (pc.hbm if gate and p.held else -INF), w


def order(waiting: Iterable[Program], cfg: SchedulerConfig) -> list[Program]:
    """The global queue, best first (for /programs and for prefetching sandboxes)."""
    default_out = float(cfg.default_output_tokens)
    items = [it for p in waiting if (it := item(p, cfg, default_out)) is not None]
    items.sort()
    return [it.program for it in items]


def build(waiting: Iterable[Program], cfg: SchedulerConfig, now: float, room: float = INF,
          hbm_room: float = INF) -> tuple[list[Waiting], Smallest]:
    """The queue as a heap of the entries that may fit under ``room`` / ``hbm_room`` (the most
    of any open backend), plus the reserving long waiter; and the smallest needs among them.
    (The hot loop of a tick with thousands waiting: ``item``, ``_needs`` and the cache check
    of ``cost_of`` written out.)"""
    default_out = float(cfg.default_output_tokens)
    heap: list[Waiting] = []
    smallest = Smallest()
    blocker: Waiting | None = None
    gate = cfg.tier_aware
    reserve_after = cfg.reserve_after_seconds
    held_bonus, idle_bonus = cfg.held_bonus_seconds, cfg.idle_bonus_seconds
    group_bonus = cfg.group_bonus_seconds if cfg.groups else 0.0
    for p in waiting:
        held = p.held
        if not held and (not p.admitted or p.dormant):
            continue
        waited_from = p.waiting_since if p.waiting_since is not None else p.created_at
        since = waited_from - (held_bonus if held else idle_bonus) if p.admitted else waited_from
        g = p.group
        if g is not None and g.done and group_bonus:
            since -= group_bonus * g.done_share
        pc = p.cost_cache  # cost_of's cache check, written out as in capacity.BackendLoad.account
        if pc is None or pc[7] or (pc[9] != default_out and p.expected_output_tokens <= 0):  # type: ignore[index]
            pc = cost_of(p, default_out)
        it = _new(Waiting, (since, pc[0], p.id, p, pc))  # type: ignore[index]
        need = pc[4]  # type: ignore[index]
        hneed = pc[5] if gate and held else -INF  # type: ignore[index]
        if need > room or hneed > hbm_room:
            if now - waited_from >= reserve_after and (blocker is None or it < blocker):
                blocker = it
            continue
        smallest.add(need, hneed)
        heap.append(it)
    if blocker is not None:
        heap.append(blocker)
        _add_aged(smallest, blocker, room, gate)
    heapq.heapify(heap)
    return heap, smallest


def _add_aged(smallest: Smallest, it: Waiting, room: float, gate: bool) -> None:
    """The reserving long waiter, when only the HBM condition keeps it out: it is placed by the
    pool alone (module header), so its need counts as ungated."""
    need, hneed, _ = _needs(it, gate)
    if need <= room and hneed != -INF:
        smallest.add(need, -INF)


def prune(heap: list[Waiting], room: float, hbm_room: float, now: float,
          cfg: SchedulerConfig) -> tuple[list[Waiting], Smallest]:
    """The entries that may still fit under the current rooms (a heap again), plus — as in
    ``build`` — the best-ordered one among the rest that waited past the reservation age; and
    the new smallest needs."""
    keep: list[Waiting] = []
    smallest = Smallest()
    blocker: Waiting | None = None
    gate = cfg.tier_aware
    reserve_after = cfg.reserve_after_seconds
    for it in heap:
        need, hneed, waited_from = _needs(it, gate)
        if need <= room and hneed <= hbm_room:
            keep.append(it)
            smallest.add(need, hneed)
        elif now - waited_from >= reserve_after and (blocker is None or it < blocker):
            blocker = it
    if blocker is not None:
        keep.append(blocker)
        _add_aged(smallest, blocker, room, gate)
    heapq.heapify(keep)
    return keep, smallest
