"""The weight-update window state machine (pure)."""

from __future__ import annotations

import pytest

from thunder_sgl.control.windows import Reason, WindowConflict, Windows


def test_begin_then_end_opens_and_closes_one_window():
    w = Windows(max_seconds=100)
    assert not w.holding
    opened = w.hold(Reason.WEIGHT_SYNC, 10.0)
    assert w.holding and w.current is opened and opened.id == 1
    closed = w.release(Reason.WEIGHT_SYNC, 14.0)
    assert closed is not None and closed.window is opened and closed.seconds == 4.0 and not closed.by_watchdog
    assert not w.holding and w.opened == 1


def test_reasons_nest_into_one_window_closed_by_the_last():
    # SkyRL-style: begin, pause, update, continue, end is one window.
    w = Windows(max_seconds=100)
    first = w.hold(Reason.WEIGHT_SYNC, 0.0)
    assert w.hold(Reason.PAUSED, 1.0, mode="retract") is first
    assert w.hold(Reason.UPDATING, 2.0) is first
    assert w.release(Reason.UPDATING, 3.0) is None
    assert w.release(Reason.PAUSED, 4.0) is None
    assert w.holding and first.pause_mode == "retract"
    closed = w.release(Reason.WEIGHT_SYNC, 5.0)
    assert closed is not None and closed.seconds == 5.0 and w.opened == 1


@pytest.mark.parametrize(("reason", "code"), [(Reason.WEIGHT_SYNC, "window_already_open"),
                                              (Reason.UPDATING, "update_in_progress")])
def test_a_second_begin_or_concurrent_update_is_refused_and_changes_nothing(reason, code):
    w = Windows(max_seconds=100)
    win = w.hold(reason, 0.0)
    with pytest.raises(WindowConflict) as e:
        w.hold(reason, 1.0)
    assert e.value.code == code and e.value.status == 409
    assert w.current is win and win.reasons == {reason} and w.opened == 1


def test_end_without_begin_is_refused_even_while_paused():
    w = Windows(max_seconds=100)
    with pytest.raises(WindowConflict) as e:
        w.release(Reason.WEIGHT_SYNC, 0.0)
    assert e.value.code == "no_window_open" and not w.holding
    w.hold(Reason.PAUSED, 1.0)
    with pytest.raises(WindowConflict):
        w.release(Reason.WEIGHT_SYNC, 2.0)
    assert w.has(Reason.PAUSED)


@pytest.mark.parametrize("reason", [Reason.PAUSED, Reason.RELEASED])
def test_pause_and_release_are_idempotent_as_on_sglang(reason):
    w = Windows(max_seconds=100)
    assert w.release(reason, 0.0) is None  # continue/resume with nothing to close
    win = w.hold(reason, 1.0)
    assert w.hold(reason, 2.0) is win
    assert w.release(reason, 3.0) is not None
    assert w.release(reason, 4.0) is None


def test_elapsed_counts_only_time_inside_windows():
    w = Windows(max_seconds=100)
    assert w.elapsed(5.0) == 0.0
    w.hold(Reason.PAUSED, 10.0)
    assert w.elapsed(13.0) == 3.0
    w.release(Reason.PAUSED, 14.0)
    assert w.elapsed(50.0) == 4.0
    w.hold(Reason.WEIGHT_SYNC, 60.0)
    assert w.elapsed(62.5) == 6.5


def test_watchdog_closes_a_window_open_too_long():
    w = Windows(max_seconds=30)
    w.hold(Reason.WEIGHT_SYNC, 0.0)
    assert w.expire(30.0) is None
    closed = w.expire(30.5)
    assert closed is not None and closed.by_watchdog and not w.holding and w.expired == 1
    # The trainer's late end is then a clear conflict, not a silent success.
    with pytest.raises(WindowConflict):
        w.release(Reason.WEIGHT_SYNC, 31.0)


def test_weight_version_is_kept_across_windows():
    w = Windows(max_seconds=100)
    w.hold(Reason.UPDATING, 0.0)
    w.weights_updated("step-7")
    assert w.current.updates == 1 and w.current.weight_version == "step-7"
    w.release(Reason.UPDATING, 1.0)
    assert w.weight_version == "step-7" and w.describe(2.0)["weight_version"] == "step-7"
    assert w.describe(2.0)["open"] is False
