"""Placement stage 3 for groups: put a group's members together when that saves prefill.

The samples of one RL task share the system prompt and the task prompt (``groups``). A member
placed where another member of its group runs finds the task prompt in that engine's radix
cache and prefills only what is its own; placed elsewhere it prefills the task again and the
task's KV is held twice. So ``GroupPicker`` chooses, in order:

1. the program's previous backend, if it fits there (its own KV may still be cached: reload is
   linear in c, recompute quadratic — the same first choice as ``PreviousThenMostRoom``);
2. among the open backends that hold members of its group and where it fits, the one with the
   most members (then the most room, then the key): the task prompt is counted there already
   (``capacity.BackendLoad.adds`` is smaller there), and the engine has it cached;
3. when no open backend holds a live member where it fits: the group's ``home``, the backend
   its last placed member went to, if it fits there (the engine cached the task prompt there
   last, and may still hold it: members that left were released or paused, and a paused
   member's KV stays until the engine needs the room);
4. otherwise the open backend with the most room where it fits.

Step 2 never overrides the watermarks: co-location is chosen only where the member fits
within them, so a large group spreads over backends once one is full. A program without a
group (or under a policy that does not count groups: ``group_key`` None) is placed exactly as
``PreviousThenMostRoom`` places it.
"""

from __future__ import annotations

from thunder_sgl.programs import Program
from thunder_sgl.scheduler.capacity import BackendLoad
from thunder_sgl.scheduler.cost import ProgramCost
from thunder_sgl.scheduler.placement import Rooms


class GroupPicker:
    """Previous backend, else a backend running its group, else its group's home, else the
    most room."""

    def pick(self, p: Program, pc: ProgramCost, open_loads: dict[str, BackendLoad], rooms: Rooms,
             gate_hbm: bool) -> BackendLoad | None:
        prev = open_loads.get(p.prev_backend) if p.prev_backend else None
        if prev is not None and prev.fits(pc, gate_hbm):
            return prev
        key = pc.group_key
        if key:
            best: BackendLoad | None = None
            best_rank: tuple[int, float, str] | None = None
            for ld in open_loads.values():
                n = ld.holds(key)
                if not n or not ld.fits(pc, gate_hbm):
                    continue
                room = ld.room()
                rank = (-n, -(room if room is not None else 0.0), ld.backend.key)
                if best_rank is None or rank < best_rank:
                    best, best_rank = ld, rank
            if best is not None:
                return best
            g = p.group
            home = open_loads.get(g.home) if g is not None and g.home else None
            if home is not None and home.fits(pc, gate_hbm):
                return home
        return rooms.first(lambda ld: ld.fits(pc, gate_hbm))
