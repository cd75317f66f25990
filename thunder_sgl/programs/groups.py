"""Groups: the samples of one RL task (GRPO's G trajectories of one prompt), tied together.

A training step waits for its whole batch, so what matters for a group is its *last* member,
and the members share a long prefix: the system prompt and the task. A program joins a group
with its first request (``group_id``: body field, header ``X-Group-Id``, or derived from the
program id by ``programs.group_id_pattern``) and belongs to it until it is released. The
scheduler reads three things from the record (``Group``):

- ``key`` and ``prefix_tokens``: the task prompt the members share beyond the system prompt,
  counted once per backend like the system prompt (``scheduler.cost``, ``capacity``);
- ``done_share``: the share of the members seen so far that have finished, which gives the
  group's waiting members a head start in the queue (``scheduler.queue``), so a group's last
  members are not left behind by newer programs;
- the backends its members run on (through the scheduler's own accounting of ``key``), where
  ``scheduler.grouping.GroupPicker`` places the others when that saves the task's prefill, and
  ``home``, the backend of the last member placed: when no member runs any more, a later
  member (GRPO samples started in waves, a member restored after the others left) is placed
  where the task prompt was cached last, if it fits there.

The table also reports completion per group: each member's time from the group's first
request to its release, the spread between the first and the last, and the groups completed
lately (bounded). Pure bookkeeping: time is passed in.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

GROUP_KEY_PREFIX = "group:"
"""Namespace of group prefix keys (prefix keys of system prompts are hex digests)."""


@dataclass(slots=True, eq=False)
class Group:
    id: str
    created_at: float
    key: str
    """Prefix key of the task prompt the members share."""
    prefix_tokens: int = 0
    """Tokens of the shared task prompt beyond the system prompt (estimated, then learned)."""
    learned: bool = False
    """``prefix_tokens`` comes from the engine's cached tokens, not from characters."""
    live: int = 0
    """Members not yet released."""
    done: int = 0
    """Members released."""
    first_steps: int = 0
    """Members whose first request has finished (the task prompt is cached after the first)."""
    completions: list[float] = field(default_factory=list)
    """Seconds from the group's creation to each released member's release, in order."""
    home: str | None = None
    """The backend a member was last placed on: where the engine cached the task prompt last.
    Kept after the members there leave (released or paused), forgotten when that engine drops
    its KV (``Controller.reset_kv``)."""

    @property
    def size(self) -> int:
        """Members seen so far."""
        return self.live + self.done

    @property
    def done_share(self) -> float:
        n = self.live + self.done
        return self.done / n if n else 0.0

    def first_step(self, cached: int, system_tokens: int) -> bool:
        """A member's first request finished with ``cached`` tokens served from the cache.
        From the group's second first step on, what was cached beyond the system prompt is
        the task prompt: learned (the largest seen), and True is returned (the cached tokens
        are the group's, not a longer system prompt's)."""
        self.first_steps += 1
        if self.first_steps < 2:
            return False
        task = cached - system_tokens
        if task > 0 and (not self.learned or task > self.prefix_tokens):
            self.prefix_tokens = task
            self.learned = True
        return True

    def describe(self) -> dict[str, Any]:
        c = sorted(self.completions)
        median = c[len(c) // 2] if len(c) % 2 else (0.5 * (c[len(c) // 2 - 1] + c[len(c) // 2]) if c else 0.0)
        return {
            "id": self.id, "members": self.size, "live": self.live, "done": self.done,
            "prefix_tokens": self.prefix_tokens, "prefix_learned": self.learned, "home": self.home,
            "first_done_seconds": round(c[0], 3) if c else None,
            "last_done_seconds": round(c[-1], 3) if c else None,
            "median_done_seconds": round(median, 3) if c else None,
            "spread_seconds": round(c[-1] - c[0], 3) if c else None,
            "complete": self.live == 0 and self.done > 0,
        }


class GroupTable:
    """Live groups by id, and the last ``keep`` completed ones (for reports). A member joining a
    group that completed (all its members released, the next not started yet) reopens it: the
    group is the task's, however its members are spread over time."""

    def __init__(self, keep: int = 1000) -> None:
        self._groups: dict[str, Group] = {}
        self._completed: OrderedDict[str, Group] = OrderedDict()
        self.keep = keep
        self.completed_total = 0

    @property
    def completed(self) -> list[Group]:
        """Completed groups, oldest first."""
        return list(self._completed.values())

    def __len__(self) -> int:
        return len(self._groups)

    def get(self, gid: str) -> Group | None:
        return self._groups.get(gid)

    def live(self) -> list[Group]:
        return list(self._groups.values())

    def find(self, gid: str) -> Group | None:
        """A live group, else the most recent completed one of that id."""
        g = self._groups.get(gid)
        return g if g is not None else self._completed.get(gid)

    def join(self, gid: str, now: float, prefix_tokens: int = 0) -> Group:
        """A new member; the group is created by its first member."""
        g = self._groups.get(gid)
        if g is None:
            g = self._completed.pop(gid, None)
            if g is not None:
                self.completed_total -= 1
            else:
                g = Group(gid, now, GROUP_KEY_PREFIX + gid, prefix_tokens)
            self._groups[gid] = g
        elif not g.learned and prefix_tokens > g.prefix_tokens:
            g.prefix_tokens = prefix_tokens
        g.live += 1
        return g

    def leave(self, g: Group, now: float) -> None:
        """A member was released; the group completes with its last member."""
        g.live -= 1
        g.done += 1
        g.completions.append(max(0.0, now - g.created_at))
        if g.live <= 0 and self._groups.get(g.id) is g:
            del self._groups[g.id]
            self._completed[g.id] = g
            self.completed_total += 1
            while len(self._completed) > self.keep:
                self._completed.popitem(last=False)
