"""Program schedulers by name, and the stateless fallback for requests without a program id.

One protocol (``ProgramScheduler``), one registry (``POLICIES``: name → ``PolicyEntry``) and
one factory by name (``make_policy``, which fails with the valid names). Each file of this
package is one policy whose code differs, its header saying what it decides and its parameters:

- ``thunder``: the thunder tick (``core.ThunderScheduler``) and its presets, which differ in
  configuration only (data, ``thunder.PRESETS``):

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

- ``stateless``: ``least_loaded``, where a request without a program id goes.

The admission rules a thunder policy fills its backends with (``admission.mode``) are a
registry of their own, ``scheduler.admission_rules``. A new scheduler is a new entry here, not
an edit of the controller (docs/design.md, "Adding a policy").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from thunder_sgl.backends.backend import Backend
from thunder_sgl.config import SchedulerConfig
from thunder_sgl.errors import ConfigError
from thunder_sgl.programs import Program, ProgramTable
from thunder_sgl.scheduler.core import Decisions
from thunder_sgl.scheduler.gate import RequestGate
from thunder_sgl.scheduler.policies import thunder
from thunder_sgl.scheduler.policies.stateless import least_loaded


class ProgramScheduler(Protocol):
    """The contract of a program scheduler.

    ``tick`` is pure: it reads the programs and backends, returns decisions, mutates nothing
    (``core.apply`` carries them out). ``queue_order`` lists the waiting programs best first.
    ``gate`` says whether one request of an active program goes now, and in which order held
    ones go (the controller asks it; it decides nothing itself). ``changed`` is told of every
    write the request path makes to a program's cost inputs. ``cfg`` is the one
    configuration the controller reads for scheduling parameters.
    """

    cfg: SchedulerConfig
    stale_after: float
    gate: RequestGate

    def tick(self, now: float, programs: ProgramTable, backends: Sequence[Backend]) -> Decisions: ...

    def queue_order(self, now: float, waiting: Iterable[Program]) -> list[Program]: ...

    def changed(self, p: Program) -> None: ...


@dataclass(frozen=True)
class PolicyEntry:
    factory: Callable[[SchedulerConfig, float], ProgramScheduler]
    """Builds the scheduler from the adjusted configuration and the staleness limit."""
    help: str
    overrides: Mapping[str, object] = field(default_factory=dict)
    """``SchedulerConfig`` fields the policy sets over the configured ones, by dotted name."""


POLICIES: dict[str, PolicyEntry] = {
    name: PolicyEntry(thunder.make, p.help, p.overrides) for name, p in thunder.PRESETS.items()
}


def make_policy(name: str, cfg: SchedulerConfig, stale_after: float = float("inf")) -> ProgramScheduler:
    try:
        entry = POLICIES[name]
    except KeyError:
        raise ConfigError(f"unknown program policy {name!r}; valid: {sorted(POLICIES)}") from None
    return entry.factory(with_overrides(cfg, entry.overrides), stale_after)


def with_overrides(cfg: Any, overrides: Mapping[str, object]) -> Any:
    """``cfg`` (a frozen config dataclass) with ``{"admission.mode": "fixed", ...}`` set; each
    nested section is replaced once, so its invariants are checked on the final values."""
    if not overrides:
        return cfg
    here: dict[str, object] = {}
    below: dict[str, dict[str, object]] = {}
    for key, value in overrides.items():
        head, _, rest = key.partition(".")
        if rest:
            below.setdefault(head, {})[rest] = value
        else:
            here[head] = value
    for head, sub in below.items():
        here[head] = with_overrides(getattr(cfg, head), sub)
    return dataclasses.replace(cfg, **here)


__all__ = ["POLICIES", "PolicyEntry", "ProgramScheduler", "least_loaded", "make_policy", "with_overrides"]
