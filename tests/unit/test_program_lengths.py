"""programs.lengths: how many steps programs take, and the probability that an idle inferred
program has ended; backends.backend.ToolTimes.survival, the tool side of that probability."""

import random

from thunder_sgl.backends.backend import ToolTimes
from thunder_sgl.programs.lengths import ProgramLengths, step_bin


def _learn(lengths: ProgramLengths, steps: list[int]) -> None:
    for n in steps:
        for k in range(1, n + 1):
            lengths.step(k)
        lengths.end(n)


def test_nothing_is_guessed_ended_before_any_program_has_ended():
    lengths = ProgramLengths()
    for k in range(1, 40):
        lengths.step(k)
    assert lengths.hazard(20) == 0.0
    assert lengths.ended_probability(20, 0.0) == 0.0


def test_the_hazard_follows_the_step_counts_programs_ended_at():
    """Programs of 15–30 steps (uniform): almost none ends at step 10, one in ~16 at step 15,
    those still running at step 29 or 30 mostly end there."""
    rnd = random.Random(3)
    lengths = ProgramLengths()
    _learn(lengths, [rnd.randint(15, 30) for _ in range(400)])
    assert lengths.programs_ended == 400
    assert lengths.hazard(10) < 0.01
    assert 0.03 < lengths.hazard(15) < 0.12
    assert lengths.hazard(29) > 0.2 and lengths.hazard(30) > 0.5  # ~100 programs weigh: few at risk there
    # long tails share bins: 100 and 110 steps fall together
    assert step_bin(100) == step_bin(110) and step_bin(31) != step_bin(32)


def test_the_probability_of_an_end_grows_with_the_idle_time_and_the_steps():
    rnd = random.Random(4)
    lengths = ProgramLengths()
    _learn(lengths, [rnd.randint(15, 30) for _ in range(400)])
    p = [lengths.ended_probability(25, s) for s in (1.0, 0.5, 0.1, 0.01, 0.0)]
    assert p == sorted(p) and p[0] == lengths.hazard(25) and p[-1] == 1.0
    assert lengths.ended_probability(10, 0.01) < 0.5 < lengths.ended_probability(28, 0.01)


def test_old_programs_weigh_less_than_the_last_hundred():
    """The workload changes from 5-step programs to 40-step ones: after 300 of the new ones a
    program at step 5 is no longer likely to be done."""
    lengths = ProgramLengths()
    _learn(lengths, [5] * 300)
    assert lengths.hazard(5) > 0.8
    _learn(lengths, [40] * 300)
    assert lengths.hazard(5) < 0.1


def test_tool_survival_is_the_share_of_longer_tools():
    t = ToolTimes()
    assert t.survival(100.0) == 1.0  # nothing seen: every tool may still be running
    for _ in range(50):
        t.add(1.0)
        t.add(10.0)
    assert t.survival(0.5) == 1.0
    assert abs(t.survival(3.0) - 0.5) < 0.01  # the later of each pair weighs 1/0.995 more
    assert t.survival(20.0) == 0.0
    inside = [t.survival(s) for s in (0.8, 0.9, 1.0, 1.1)]  # within the bin of 1 s: between 1 and 0.5
    assert inside == sorted(inside, reverse=True) and 0.5 <= min(inside) and max(inside) <= 1.0


def test_an_end_hint_starts_at_its_prior_and_learns_what_the_clients_hints_mean():
    """``q`` of a kind: its prior (sign 0.75, plain 0.25) until hinted answers are seen to end
    their program or not; then the observed share."""
    lengths = ProgramLengths()
    assert lengths.hint_rate("sign") == 0.75 and lengths.hint_rate("plain") == 0.25
    for _ in range(200):
        lengths.hint_outcome("sign", ended=True)
        lengths.hint_outcome("plain", ended=False)
    assert lengths.hint_rate("sign") > 0.97
    assert lengths.hint_rate("plain") < 0.03  # a model that keeps forgetting its tools


def test_a_signed_end_is_believed_at_once_and_an_unsigned_silence_much_later():
    """Programs of 15–30 steps whose clients sign 9 ends in 10: a program at step 12 whose last
    answer carried the sign has most likely ended after any silence; one at step 29 without it
    is judged by the unsigned ends alone (1 in 10), so a silence that would have made it ended
    without hints no longer does."""
    rnd = random.Random(5)
    plain = ProgramLengths()
    hinted = ProgramLengths()
    for i in range(400):
        n = rnd.randint(15, 30)
        for lengths in (plain, hinted):
            for k in range(1, n + 1):
                lengths.step(k)
        plain.end(n)
        hinted.end(n, hinted=i % 10 != 0)
        if i % 10 != 0:
            hinted.hint_outcome("sign", ended=True)
    s = 0.5  # half the tool calls last longer than this silence
    assert hinted.ended_probability(12, s, "sign") > 0.95
    assert plain.ended_probability(29, s) > 0.3
    assert hinted.ended_probability(29, s) < plain.ended_probability(29, s) / 3
    # without hints both counts agree: nothing changes where no client hints
    assert plain.hazard(20) == plain.hazard(20, unhinted=True)
