"""Kept for one release: the simulated worker's reports moved to ``thunder_sgl.sim.exposition``."""

from thunder_sgl.sim.exposition import *  # noqa: F403
