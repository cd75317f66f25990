"""The thunder policies: program-level pause and restore under KV pressure (``core.ThunderScheduler``).

**Decides**, every tick (``tick_seconds``) and on arrivals: which active programs to pause
because their backend's decayed demand exceeds its high watermark, which waiting programs to
restore or admit and where (``placement``; a group's members where their group runs when
``groups``), and how far each backend is filled beyond the watermarks (the admission rule of
``admission.mode``, ``scheduler.admission_rules``). Per request, its ``RequestGate`` says
whether a held request goes now (the HBM condition, ``gate``). The algorithm is in ``core``'s
header.

**Parameters**: ``SchedulerConfig`` (``config.py``, one docstring per field), chiefly
``tick_seconds`` (Δt), ``decay_base`` and ``max_decay_ticks`` (the weight ``x^-k`` of a
program idle k ticks), ``lambda_max`` and ``lambda_min`` (the watermarks), ``tier_aware`` and
``hbm_lambda`` (pool = HBM plus host tiers, and the HBM gate), ``admission`` (the rule and its
knobs), ``session_refs`` (KV references) and ``groups``.

The four policies run this one scheduler and differ only in configuration, so they are rows of
``PRESETS``: overrides of ``SchedulerConfig`` fields (dotted names, as ``admission.mode``)
applied over the configured values. A new variant of thunder is a new row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from thunder_sgl.config import SchedulerConfig
from thunder_sgl.scheduler.core import ThunderScheduler
from thunder_sgl.scheduler.grouping import GroupPicker


@dataclass(frozen=True)
class Preset:
    help: str
    overrides: Mapping[str, object] = field(default_factory=dict)
    """``SchedulerConfig`` fields this policy sets, by dotted name."""


PRESETS: dict[str, Preset] = {
    "thunder": Preset(
        "tier-aware pool, HBM gate, admission level from predicted and measured goodput"),
    "thunder-occupancy": Preset(
        "thunder with the previous default admission rule (a controller on engine occupancy)",
        {"admission.mode": "occupancy", "admission.max_overcommit": 1.0}),
    "thunder-fixed": Preset(
        "thunder with the admission level fixed at the watermarks and no KV references (the earlier default)",
        {"admission.mode": "fixed", "session_refs": False}),
    "thunder-paper": Preset(
        "the paper's method: pool = HBM, no HBM gate, both watermarks at 1",
        {"tier_aware": False, "lambda_max": 1.0, "lambda_min": 1.0, "admission.mode": "fixed",
         "session_refs": False, "groups": False, "decay": "paper"}),
}


def make(cfg: SchedulerConfig, stale_after: float) -> ThunderScheduler:
    """The thunder tick, with the group-aware placement stage when the policy counts groups."""
    return ThunderScheduler(cfg, stale_after, GroupPicker() if cfg.groups else None)
