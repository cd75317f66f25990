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

**The end sign.** A program whose last answer looked like the agent's last
(``control.conversations`` rule 7: a finishing tool call or marker, *sign*; or tools offered and
none called, *plain*), or whose last request the engine refused for the model's context length
(*context overflow*), carries that hint until it asks again. For each kind the router counts the
hinted answers that were the program's last (it ended without asking again) and those it came
back from, decayed as the step counts are, and ``q`` = (last + prior) ÷ (both + prior pseudo-answers):
the share of such answers that end their program. It stands in for ``h(k)`` when larger:

    P(ended | hint, k, idle t) = q' / (q' + (1 − q') · S(t)),   q' = max(h(k), q)

and a program whose last answer carried no hint is judged by the hazard of the ends that came
without one, ``h₀(k)`` (ends after a hint are counted apart, ``ended_hinted``): where agents sign
their end, a silent one is most likely in a tool, and guessing it ended would evict a live
context. Where no client hints, ``h₀ = h`` and nothing changes.

The priors (``HINT_PRIOR``) keep the first guesses modest — a sign or a context overflow starts
at 0.75, which needs an idle time past two thirds of tool calls before P reaches 0.9; plain at
0.25, past the 96th percentile — and the counts then say whether the clients' hints mean what
they seem to: a model that keeps forgetting its tools teaches plain hints a low ``q``, and they
stop mattering; an agent that answers an overflow by trimming its last observation and asking
again teaches the context-overflow hint the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

KEEP = 0.99
"""Each end multiplies the older counts by this: about the last 100 programs' ends weigh most."""

PRIOR_STEPS = 5.0
"""Pseudo-steps at the overall hazard added to each bin's counts."""

HINT_PRIOR = {"sign": (3.0, 1.0), "plain": (1.0, 3.0), "context_overflow": (3.0, 1.0)}
"""Pseudo-counts (ended, came back) of each end-hint kind before any is observed."""

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
    ended_hinted: list[float] = field(default_factory=lambda: [0.0] * _BINS)
    """The ends of ``ended`` whose last answer carried an end hint."""
    programs_ended: int = 0
    hints: dict[str, list[float]] = field(default_factory=dict)
    """Per end-hint kind: [hinted answers that were their program's last, ones it came back from]."""

    def step(self, k: int) -> None:
        """A program answered its ``k``-th step: it is at risk of ending there."""
        if k >= 1:
            self.reached[step_bin(k)] += 1.0

    def end(self, k: int, hinted: bool = False) -> None:
        """A program ended after ``k`` steps (``hinted``: its last answer carried an end hint)."""
        if k < 1:
            return
        r, e, eh = self.reached, self.ended, self.ended_hinted
        for i in range(_BINS):
            r[i] *= KEEP
            e[i] *= KEEP
            eh[i] *= KEEP
        e[step_bin(k)] += 1.0
        if hinted:
            eh[step_bin(k)] += 1.0
        self.programs_ended += 1

    def hint_outcome(self, kind: str, ended: bool) -> None:
        """A program whose last answer carried hint ``kind`` ended (True) or asked again."""
        c = self.hints.setdefault(kind, [0.0, 0.0])
        c[0] *= KEEP
        c[1] *= KEEP
        c[0 if ended else 1] += 1.0

    def hint_rate(self, kind: str) -> float:
        """``q``: the share of answers hinted ``kind`` that were their program's last."""
        a, b = HINT_PRIOR.get(kind, (0.0, 1.0))
        c = self.hints.get(kind, (0.0, 0.0))
        return (c[0] + a) / (c[0] + c[1] + a + b)

    def hazard(self, k: int, unhinted: bool = False) -> float:
        """The share of programs at step ``k`` that end there (0 before any has ended);
        ``unhinted``: that end there with no end hint on their last answer."""
        total_r = sum(self.reached)
        if total_r <= 0:
            return 0.0
        ended = self.ended
        if unhinted and any(self.ended_hinted):  # at risk: every step (a hinted one is rare where hints mean an end)
            ended = [e - h for e, h in zip(self.ended, self.ended_hinted, strict=True)]
        overall = min(1.0, max(0.0, sum(ended)) / total_r)
        i = step_bin(k)
        return min(1.0, (max(0.0, ended[i]) + PRIOR_STEPS * overall) / (self.reached[i] + PRIOR_STEPS))

    def ended_probability(self, k: int, survival: float, hint: str | None = None) -> float:
        """P(ended | ``k`` steps answered, idle longer than a share ``survival`` of tool calls
        last, the last answer hinted ``hint`` or not)."""
        if hint is not None:
            h = max(self.hazard(k), self.hint_rate(hint))
        else:  # where programs sign their end, one that did not is less likely to have ended
            h = self.hazard(k, unhinted=True)
        if h <= 0:
            return 0.0
        return h / (h + (1.0 - h) * max(0.0, survival))
