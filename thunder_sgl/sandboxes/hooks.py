"""``ProgramHooks`` over the router's ``ProgramTable``: the obvious implementation, ready to
wire (the router may add to it, e.g. a metric per tool call).

A program that is not in the table (never seen, or released: the table drops terminated
programs) is 404. Tool time goes to ``Program.tool_started`` / ``tool_finished``: the program
is ACTING on a tool while ``tool_running > 0`` and ``last_tool_seconds`` /
``total_tool_seconds`` feed the decay and, later, tool-time estimates.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from thunder_sgl.errors import NotFound
from thunder_sgl.programs import Program, ProgramState, ProgramTable


class TableHooks:
    def __init__(self, table: ProgramTable, clock: Callable[[], float] = time.monotonic) -> None:
        self.table = table
        self.clock = clock

    def require_program(self, program_id: str) -> None:
        self._program(program_id)

    def ensure_program(self, program_id: str) -> None:
        if self.table.get(program_id) is None:
            self.table.create(program_id, self.clock())

    def tool_started(self, program_id: str) -> None:
        self._program(program_id).tool_started(self.clock())

    def tool_finished(self, program_id: str, seconds: float) -> None:
        p = self.table.get(program_id)
        if p is not None:  # released while its tool ran: nothing left to account
            p.tool_finished(self.clock(), seconds)

    def _program(self, program_id: str) -> Program:
        p = self.table.get(program_id)
        if p is None or p.state is ProgramState.TERMINATED:
            raise NotFound(f"program {program_id!r} is unknown or released", param="program_id", code="program_not_found")
        return p
