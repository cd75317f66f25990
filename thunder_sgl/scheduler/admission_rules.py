"""Admission rules by name (``scheduler.admission.mode``): how far each backend's pool is filled
beyond the watermarks ``λ_max·pool`` and ``λ_min·pool``.

**Decides**, once per tick and backend, the rule's next state (``AdmissionLevel``): ``extra``,
the tokens admitted beyond the watermarks (both move up by it), and ``protect``, the tokens of
KV kept referenced (the programs past it in pause order are overcommitted, ``core``). The tick
stores the state on the backend through ``Decisions.admission``.

An entry is a rule's state type and its pure ``update(state, backend, view, now, cfg) ->
state``, ``state`` being None on the first update or when the backend carries another rule's
state. Each rule is one module whose header states its algorithm and parameters (all in
``scheduler.admission``, ``config.AdmissionConfig``):

- ``goodput`` (default): the level with the best predicted and measured steps/s (``goodput``).
- ``occupancy``: the previous default, a controller on engine occupancy (``occupancy``).
- ``fixed``: no rule — nothing beyond the watermarks, every program within ``λ_max·pool``
  referenced; backends keep no admission state.

A new rule is a module with a state (``extra``, ``protect``, ``view``) and ``update``, an entry
here and its name in ``AdmissionConfig.MODES``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from thunder_sgl.backends.backend import AdmissionLevel, Backend
from thunder_sgl.config import SchedulerConfig
from thunder_sgl.errors import ConfigError
from thunder_sgl.scheduler import goodput, occupancy
from thunder_sgl.scheduler.goodput import BackendView


@dataclass(frozen=True, slots=True)
class AdmissionRule:
    state: type
    """The type of the rule's state; a backend's state of another type is not passed on."""
    update: Callable[[Any, Backend, BackendView, float, SchedulerConfig], AdmissionLevel]
    """Pure: the previous state (or None), the backend, what the tick knows of it, the time and
    the configuration give the next state."""
    rest: Callable[[Any], AdmissionLevel]
    """The state kept through a period it must not measure (the engine paused behind the
    router, ``backends.pause``): its level kept, its measurement period restarted at the next
    ``update``."""


def _restart_period(state: Any) -> Any:
    """Both rules' states start a new period (a fresh snapshot of the counters) when ``at`` is None."""
    return replace(state, at=None)


ADMISSION_RULES: dict[str, AdmissionRule | None] = {
    "goodput": AdmissionRule(goodput.AdmissionState, goodput.update, _restart_period),
    "occupancy": AdmissionRule(occupancy.OccupancyState, occupancy.update, _restart_period),
    "fixed": None,
}


def admission_rule(mode: str) -> AdmissionRule | None:
    """The rule of ``mode`` (None: the fixed watermarks); an unknown mode fails with the valid ones."""
    try:
        return ADMISSION_RULES[mode]
    except KeyError:
        raise ConfigError(f"unknown admission rule {mode!r}; valid: {sorted(ADMISSION_RULES)}") from None
