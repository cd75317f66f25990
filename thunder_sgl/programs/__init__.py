"""The domain model the router schedules: programs (one agent workflow each) and groups (the
samples of one RL task).

- ``program``: the program state machine (ACTIVE/PAUSED/TERMINATED × REASONING/ACTING), its
  token accounting (``Usage``) and the table indexed by backend and waiting state.
- ``groups``: a group's members, its shared task prompt, the share finished, completion per
  group.

The names below are the package's surface: ``from thunder_sgl.programs import Program``.
"""

from thunder_sgl.programs.groups import Group, GroupTable
from thunder_sgl.programs.program import (
    InvalidTransition,
    Phase,
    Program,
    ProgramState,
    ProgramTable,
    Usage,
)

__all__ = ["Group", "GroupTable", "InvalidTransition", "Phase", "Program", "ProgramState",
           "ProgramTable", "Usage"]
