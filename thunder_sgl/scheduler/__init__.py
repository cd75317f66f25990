"""The pure program scheduler: demand accounting, the thunder tick, policies by name."""

from thunder_sgl.scheduler.core import Decisions, Placement, ThunderPolicy, apply
from thunder_sgl.scheduler.policies import POLICIES, least_loaded, make_policy

__all__ = ["Decisions", "Placement", "ThunderPolicy", "apply", "POLICIES", "least_loaded", "make_policy"]
