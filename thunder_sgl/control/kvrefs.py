"""Which programs' KV the engines keep referenced, and the ``/close_session`` calls that follows.

SGLang's session radix cache (``--enable-session-radix-cache``) lets a request reference the KV
it leaves behind: ``session_id`` = program id. Eviction then takes unreferenced KV first, so the
KV of the programs thunder runs outlives other traffic (design.md, "KV references"). Thunder
references a program's KV on the backend it runs on, while the program is within what fits:

- a request carries ``session_id`` when its backend runs with the flag, the policy uses
  references (``scheduler.session_refs``) and the program is not overcommitted
  (``Decisions.unref``: admitted beyond ``λ_max·pool`` by the cost-based rule);
- the reference is dropped (``POST /close_session`` on that backend) when the program is
  paused (its KV should go first, it no longer runs there), released, overcommitted, or its
  request failed over to another backend. An engine that dropped all its KV (a weight update,
  a flush) forgot its sessions: nothing to close.

Pure bookkeeping; the drivers (gateway, DES) send what ``take_closes`` returns.
"""

from __future__ import annotations

from thunder_sgl.backends.backend import Backend
from thunder_sgl.programs import Program, ProgramTable


class KVRefs:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._unref: frozenset[str] = frozenset()
        self._closes: list[tuple[str, str]] = []

    def dispatched(self, p: Program, b: Backend) -> None:
        """p's request goes to b: its KV there is referenced, unless p is overcommitted."""
        if not (self.enabled and b.session_refs) or p.id in self._unref:
            return
        if p.session_on is not None and p.session_on != b.key:
            self.left(p)
        p.session_on = b.key

    @staticmethod
    def session_for(p: Program, b: Backend) -> str | None:
        """The ``session_id`` p's request on b carries (None: send none)."""
        return p.id if p.session_on == b.key else None

    def left(self, p: Program) -> None:
        """p no longer runs where its session references KV (paused, released, moved)."""
        if p.session_on is not None:
            self._closes.append((p.id, p.session_on))
            p.session_on = None

    @property
    def unref(self) -> frozenset[str]:
        """The programs overcommitted now (admitted beyond what fits: no reference)."""
        return self._unref

    def forget(self, p: Program) -> None:
        """p's engine dropped its KV (and its sessions with it): nothing to close."""
        p.session_on = None

    def overcommitted(self, unref: frozenset[str], programs: ProgramTable) -> None:
        """The tick's overcommitted programs: newly overcommitted ones lose their reference."""
        for pid in unref - self._unref:
            p = programs.get(pid)
            if p is not None:
                self.left(p)
        self._unref = unref

    def take_closes(self) -> list[tuple[str, str]]:
        """``(session_id, backend key)`` pairs to close, oldest first; the list is emptied."""
        out, self._closes = self._closes, []
        return out
