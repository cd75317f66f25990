from __future__ import annotations

import pytest

from thunder_sgl.programs import InvalidTransition, Phase, ProgramState, ProgramTable, Usage


def test_lifecycle_new_admit_reason_act_pause_restore_release():
    t = ProgramTable()
    p = t.create("p", 0.0)
    assert (p.state, p.admitted, t.waiting_count) == (ProgramState.PAUSED, False, 1)
    t.admit(p, "b1", 1.0)
    assert (p.state, p.backend, t.waiting_count, t.on_backend("b1")) == (ProgramState.ACTIVE, "b1", 0, [p])
    p.start_request(1.0, 1200)
    assert p.phase is Phase.REASONING and p.in_flight == 1 and max(p.context_tokens, p.pending_prompt_tokens) == 1200
    p.finish_request(3.0, Usage(prompt_tokens=1000, completion_tokens=200, cached_tokens=0), 0.3)
    assert (p.phase, p.context_tokens, p.steps, p.acting_since) == (Phase.ACTING, 1200, 1, 3.0)
    assert p.pending_prompt_tokens == 0
    t.pause(p, 4.0)
    assert (p.state, p.backend, p.prev_backend, t.on_backend("b1")) == (ProgramState.PAUSED, None, "b1", [])
    t.restore(p, "b2", 10.0)
    assert (p.migrations, p.restores, p.total_paused_seconds, p.acting_since) == (1, 1, 6.0, 10.0)
    assert t.remove("p", 11.0) is p and p.state is ProgramState.TERMINATED and "p" not in t


def test_usage_sets_exact_context_and_output_estimate():
    t = ProgramTable()
    p = t.create("p", 0.0)
    t.admit(p, "b", 0.0)
    for prompt, out, expect_ema in [(1000, 100, 100.0), (1500, 200, 130.0)]:
        p.start_request(0.0, prompt)
        p.finish_request(1.0, Usage(prompt, out, cached_tokens=prompt - 200), 0.3)
        assert p.context_tokens == prompt + out
        assert p.expected_output_tokens == pytest.approx(expect_ema)
    assert (p.prompt_tokens_total, p.cached_tokens_total) == (2500, 2100)


def test_failed_request_returns_program_to_acting_without_counting_a_step():
    t = ProgramTable()
    p = t.create("p", 0.0)
    t.admit(p, "b", 0.0)
    p.start_request(0.0, 500)
    p.finish_request(2.0, None, 0.3)
    assert (p.phase, p.in_flight, p.steps, p.context_tokens) == (Phase.ACTING, 0, 0, 0)


@pytest.mark.parametrize(
    ("setup", "call"),
    [
        ("new", lambda t, p: t.restore(p, "b", 0.0)),       # a new program is admitted, not restored
        ("active", lambda t, p: t.admit(p, "b", 0.0)),
        ("active", lambda t, p: t.restore(p, "b", 0.0)),
        ("paused", lambda t, p: t.pause(p, 0.0)),
        ("paused", lambda t, p: p.start_request(0.0, 10)),  # a paused program's request is held
        ("active", lambda t, p: p.finish_request(0.0, None, 0.3)),
        ("active", lambda t, p: p.unhold()),
    ],
)
def test_invalid_transitions_raise_instead_of_corrupting_state(setup, call):
    t = ProgramTable()
    p = t.create("p", 0.0)
    if setup in ("active", "paused"):
        t.admit(p, "b", 0.0)
    if setup == "paused":
        t.pause(p, 0.0)
    with pytest.raises(InvalidTransition):
        call(t, p)


def test_duplicate_create_is_refused_and_release_of_unknown_is_none():
    t = ProgramTable()
    t.create("p", 0.0)
    with pytest.raises(InvalidTransition):
        t.create("p", 0.0)
    assert t.remove("nope", 0.0) is None
