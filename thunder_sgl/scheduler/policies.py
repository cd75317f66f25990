"""Program schedulers by name, and the stateless fallback for requests without a program id.

A program policy is an entry of ``POLICIES``: a scheduler class (anything with the
``ProgramScheduler`` protocol) and the adjustment it makes to the configured
``SchedulerConfig``. A new scheduler is a new entry, not an edit of the controller.

- ``thunder``: the full policy — tier-aware pool, HBM gate, the admission level chosen from
  predicted and measured goodput (``goodput``), KV references, and groups (``groups``: a
  group's task prompt counted once per backend, members placed together by
  ``grouping.GroupPicker``, groups aged in the queue).
- ``thunder-occupancy``: the same with the previous default admission rule, a controller on
  engine occupancy (``occupancy``), as it ran before the goodput rule; kept for comparison.
- ``thunder-fixed``: the same with the admission level fixed at the watermarks and no KV
  references (the default before the cost-based rules; kept for comparison).
- ``thunder-paper``: the method as the ThunderAgent paper describes it: pool = HBM only, no
  HBM gate, λ_max = λ_min = 1, fixed admission, no groups.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from thunder_sgl.backends.backend import Backend
from thunder_sgl.config import AdmissionConfig, SchedulerConfig
from thunder_sgl.errors import ConfigError
from thunder_sgl.programs import Program, ProgramTable
from thunder_sgl.scheduler.core import Decisions, ThunderScheduler
from thunder_sgl.scheduler.gate import RequestGate
from thunder_sgl.scheduler.grouping import GroupPicker


class ProgramScheduler(Protocol):
    """The contract of a program scheduler.

    ``tick`` is pure: it reads the programs and backends, returns decisions, mutates nothing
    (``core.apply`` carries them out). ``queue_order`` lists the waiting programs best first.
    ``gate`` says whether one request of an active program goes now, and in which order held
    ones go (the controller asks it; it decides nothing itself). ``cfg`` is the one
    configuration the controller reads for scheduling parameters.
    """

    cfg: SchedulerConfig
    stale_after: float
    gate: RequestGate

    def tick(self, now: float, programs: ProgramTable, backends: Sequence[Backend]) -> Decisions: ...

    def queue_order(self, now: float, waiting: Iterable[Program]) -> list[Program]: ...


@dataclass(frozen=True)
class PolicyEntry:
    factory: Callable[[SchedulerConfig, float], ProgramScheduler]
    adjust: Callable[[SchedulerConfig], SchedulerConfig]
    help: str


def thunder(cfg: SchedulerConfig, stale_after: float) -> ThunderScheduler:
    """The thunder tick, with the group-aware placement stage when the policy counts groups."""
    return ThunderScheduler(cfg, stale_after, GroupPicker() if cfg.groups else None)


def _fixed(cfg: SchedulerConfig) -> AdmissionConfig:
    return dataclasses.replace(cfg.admission, mode="fixed")


POLICIES: dict[str, PolicyEntry] = {
    "thunder": PolicyEntry(thunder, lambda cfg: cfg,
                           "tier-aware pool, HBM gate, admission level from predicted and measured goodput"),
    "thunder-occupancy": PolicyEntry(
        thunder, lambda cfg: dataclasses.replace(
            cfg, admission=dataclasses.replace(cfg.admission, mode="occupancy", max_overcommit=1.0)),
        "thunder with the previous default admission rule (a controller on engine occupancy)"),
    "thunder-fixed": PolicyEntry(
        thunder, lambda cfg: dataclasses.replace(cfg, admission=_fixed(cfg), session_refs=False),
        "thunder with the admission level fixed at the watermarks and no KV references (the earlier default)"),
    "thunder-paper": PolicyEntry(
        ThunderScheduler,
        lambda cfg: dataclasses.replace(cfg, tier_aware=False, lambda_max=1.0, lambda_min=1.0, admission=_fixed(cfg),
                                        session_refs=False, groups=False),
        "the paper's method: pool = HBM, no HBM gate, both watermarks at 1"),
}


def make_policy(name: str, cfg: SchedulerConfig, stale_after: float = float("inf")) -> ProgramScheduler:
    try:
        entry = POLICIES[name]
    except KeyError:
        raise ConfigError(f"unknown program policy {name!r}; valid: {sorted(POLICIES)}") from None
    return entry.factory(entry.adjust(cfg), stale_after)


def least_loaded(backends: Sequence[Backend], now: float, stale_after: float) -> Backend | None:
    """Stateless requests (no program id): the available backend with the fewest requests in
    flight from this router plus those the engine reports waiting, then the lowest KV usage.
    None when no backend is available."""
    best: Backend | None = None
    best_key: tuple[int, float, str] | None = None
    for b in backends:
        if not b.available(now, stale_after):
            continue
        k = (b.inflight + b.live.waiting_reqs, b.live.token_usage, b.key)
        if best_key is None or k < best_key:
            best, best_key = b, k
    return best
