"""The pure program scheduler: costs, demand accounting, the queue, placement, the thunder
tick, and policies by name (read ``core`` first)."""

from thunder_sgl.scheduler.core import Decisions, ThunderScheduler, apply
from thunder_sgl.scheduler.placement import Placement
from thunder_sgl.scheduler.policies import POLICIES, ProgramScheduler, least_loaded, make_policy

__all__ = ["Decisions", "Placement", "ThunderScheduler", "ProgramScheduler", "apply", "POLICIES",
           "least_loaded", "make_policy"]
