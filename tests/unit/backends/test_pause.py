"""The rule that says an engine is paused behind the router (``backends.pause.judge``)."""

from __future__ import annotations

from thunder_sgl.backends.pause import NOT_PAUSED, EnginePause, judge

LIMIT = 100.0


def test_ready_503_while_answering_is_a_pause_from_its_first_answer():
    p = judge(NOT_PAUSED, 503, 10.0, LIMIT)
    assert (p.since, p.paused, p.holding, p.expired) == (10.0, True, True, False)
    assert judge(p, 503, 20.0, LIMIT) is p  # the same pause
    d = p.describe(25.0)
    assert d["since_seconds"] == 15.0 and d["held"] is True and "503" in str(d["reason"])


def test_ready_200_ends_it():
    p = judge(NOT_PAUSED, 503, 10.0, LIMIT)
    assert judge(p, 200, 11.0, LIMIT) == NOT_PAUSED
    assert judge(NOT_PAUSED, 200, 11.0, LIMIT) == NOT_PAUSED


def test_anything_else_changes_nothing():
    p = judge(NOT_PAUSED, 503, 10.0, LIMIT)
    for status in (None, 404, 500, 401):
        assert judge(p, status, 11.0, LIMIT) is p
        assert judge(NOT_PAUSED, status, 11.0, LIMIT) is NOT_PAUSED


def test_a_pause_past_the_limit_is_no_longer_held_until_ready_again():
    p = judge(NOT_PAUSED, 503, 0.0, LIMIT)
    p = judge(p, 503, LIMIT + 1, LIMIT)
    assert (p.paused, p.expired, p.holding) == (True, True, False)
    assert judge(p, 503, LIMIT + 50, LIMIT) is p  # still expired, not held again
    again = judge(judge(p, 200, LIMIT + 60, LIMIT), 503, LIMIT + 61, LIMIT)
    assert again == EnginePause(LIMIT + 61, False) and again.holding
