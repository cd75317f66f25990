"""How many steps programs take, learnt from the programs that ended, and what that says about an
idle program whose client cannot say that it ended.

An agent run without program ids (``control.conversations``) never releases its program: after its
last answer it simply stops asking. The router sees a program idle for ``t`` seconds after its
``k``-th step and must guess whether it is in a tool or gone. Two distributions answer it:

- the *step hazard* ``h(k)``: the share of programs that, having answered step ``k``, end there.
  Kaplan–Meier on binned step counts: every answered step ``k`` puts one program at risk in the
  bin of ``k`` (``reached``); every program that ends after ``k`` steps (released by its client
  or by its idle timeout) counts one end there (``ended``). ``h`` of a bin is ends ÷ steps at
  risk, shrunk towards the hazard over all bins by ``PRIOR_STEPS`` pseudo-steps so that a bin
  with few programs does not swing it. Counts decay by ``KEEP`` per end, so the last few hundred
  programs count;
- the tool-time survival ``S(t)``: the share of tool calls longer than ``t``
  (``ToolTimes.survival`` of ``Served.returns``: answer to next request, measured when the
  request arrives, so a program paused in a long tool still counts the whole of it).

Bayes then gives the probability that the program ended::

    P(ended | k, idle t) = h(k) / (h(k) + (1 − h(k)) · S(t))

Programs of 15–30 steps are almost surely alive at step 10 whatever the idle time, and at step 28
ended after a few seconds of silence; a tool-time quantile alone cannot tell the two apart. Before
any program has ended ``h`` is 0 and so is the probability: nothing is guessed ended until the
first idle timeouts have taught the router how long programs are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

KEEP = 0.99
"""Each end multiplies the older counts by this: about the last 100 programs' ends weigh most."""

PRIOR_STEPS = 5.0
"""Pseudo-steps at the overall hazard added to each bin's counts."""

_EXACT = 32
"""Step counts up to this have a bin each; above, bins are 1.25× wide."""

_BINS = _EXACT + 30


def step_bin(k: int) -> int:
    """The bin of step count ``k`` (≥ 1)."""
    if k <= _EXACT:
        return max(0, k - 1)
    return min(_BINS - 1, _EXACT + int(math.log(k / _EXACT) / math.log(1.25)))


@dataclass(slots=True)
class ProgramLengths:
    reached: list[float] = field(default_factory=lambda: [0.0] * _BINS)
    ended: list[float] = field(default_factory=lambda: [0.0] * _BINS)
    programs_ended: int = 0

    def step(self, k: int) -> None:
        """A program answered its ``k``-th step: it is at risk of ending there."""
        if k >= 1:
            self.reached[step_bin(k)] += 1.0

    def end(self, k: int) -> None:
        """A program ended after ``k`` steps."""
        if k < 1:
            return
        r, e = self.reached, self.ended
        for i in range(_BINS):
            r[i] *= KEEP
            e[i] *= KEEP
        e[step_bin(k)] += 1.0
        self.programs_ended += 1

    def hazard(self, k: int) -> float:
        """The share of programs at step ``k`` that end there (0 before any has ended)."""
        total_r = sum(self.reached)
        if total_r <= 0:
            return 0.0
        overall = min(1.0, sum(self.ended) / total_r)
        i = step_bin(k)
        return min(1.0, (self.ended[i] + PRIOR_STEPS * overall) / (self.reached[i] + PRIOR_STEPS))

    def ended_probability(self, k: int, survival: float) -> float:
        """P(ended | ``k`` steps answered, idle longer than a share ``survival`` of tool calls
        last)."""
        h = self.hazard(k)
        if h <= 0:
            return 0.0
        return h / (h + (1.0 - h) * max(0.0, survival))
