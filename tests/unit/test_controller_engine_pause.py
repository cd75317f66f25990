"""An engine paused behind the router (``backends.pause``): the controller holds its programs'
requests, keeps the programs where they are, does not time their requests out for the pause,
places nothing new there and lets the held requests go when the engine continues."""

from __future__ import annotations

from test_controller_windows import make as windows_make
from test_controller_windows import step, ticket

from thunder_sgl.backends import Backend, Tiers
from thunder_sgl.control.controller import Controller
from thunder_sgl.control.windows import Reason
from thunder_sgl.programs import ProgramState, Usage
from thunder_sgl.scheduler import least_loaded


def make(hbm: int = 10_000, n: int = 2, held_timeout: float = 10.0, **sched) -> Controller:
    """``test_controller_windows.make`` with this module's defaults: two engines, 10-s held timeout."""
    return windows_make(hbm, n, held_timeout, **sched)


def pause(c: Controller, b: Backend, now: float) -> None:
    b.engine_pause(now)  # what the monitor does (Monitor._set_pause) ...
    c.engine_paused([b.key], now)  # ... and then tells the controller


def test_requests_of_a_paused_engines_programs_are_held_without_timeout_and_go_out_when_it_continues():
    c = make()
    step(c, "a", 1000, 100, 0.0)
    b = c.programs.get("a").backend
    w = c.backends[b]
    pause(c, w, 10.0)
    assert c.stats.engine_pauses_seen == 1 and w.engine_paused
    ta = ticket("a", 1200)
    assert c.submit(ta, 11.0) is None
    p = c.programs.get("a")
    assert (p.state, p.backend, p.held, c.stats.engine_paused_held, c.stats.gated) == (ProgramState.ACTIVE, b, 1, 1, 0)
    # ticks long past the held timeout (10 s): the program keeps its place, its request waits
    for now in (12.0, 30.0, 100.0, 500.0):
        r = c.tick(now)
        assert r.expired == [] and r.dispatched == [] and r.paused == []
        assert (p.state, p.backend, p.held) == (ProgramState.ACTIVE, b, 1)
    # the engine continues: the held request goes to it
    w.engine_resume(500.0)
    assert c.engine_resumed([b], 500.0) == [ta] and ta.backend is w
    assert w.paused_seconds(600.0) == 490.0
    c.finish(ta, 501.0, Usage(1200, 100))
    assert p.steps == 2 and c.stats.expired == 0


def test_held_time_outside_the_pause_still_counts():
    # HBM 3000 in a pool of 30k: b's request waits for a's (the HBM condition), before, during
    # and after a pause of the engine; only the time outside the pause counts.
    c = make(held_timeout=10.0, n=0)
    c.add_backend(Backend("http://w0", 0, Tiers(hbm_tokens=3000, host_tokens=27_000, host_inclusive=False)))
    w = c.backend_list()[0]
    step(c, "a", 1000, 100, 0.0)
    step(c, "b", 1000, 100, 0.0)
    ta, tb = ticket("a", 1500), ticket("b", 1500)
    assert c.submit(ta, 2.0) is w and c.submit(tb, 2.0) is None  # gated
    pause(c, w, 5.0)
    assert c.tick(40.0).expired == []  # 38 s held, 35 paused
    w.engine_resume(50.0)
    assert c.engine_resumed([w.key], 50.0) == []  # a still reasons: b still waits
    assert c.tick(56.0).expired == []  # 54 s held, 45 paused
    assert c.tick(58.0).expired == [tb]  # 56 s held, 45 paused: 11 > 10


def test_a_paused_engine_takes_no_new_program_and_loses_none_to_the_pause_check():
    c = make(hbm=2500, n=2)
    step(c, "a", 1000, 200, 0.0)
    w0 = c.backends[c.programs.get("a").backend]
    w1 = next(b for b in c.backend_list() if b is not w0)
    step(c, "b", 1000, 200, 0.0)
    assert c.programs.get("b").backend == w1.key  # the most room
    # a second program on w0: with w0 paused, b2 goes to w1 although w0 has more room
    pause(c, w0, 1.0)
    t = ticket("c", 300)
    assert c.submit(t, 2.0) is None
    assert c.tick(2.0).dispatched == [t] and t.backend is w1
    # stateless requests avoid the paused engine too
    assert least_loaded(c.backend_list(), 3.0, float("inf")) is w1
    s = ticket(None, 100)
    assert c.submit(s, 3.0) is w1
    c.finish(s, 3.5, Usage(100, 1))
    # a on w0 grows past w0's pool by its usage: the pause check leaves it alone while w0 is paused
    ta = ticket("a", 1400)
    assert c.submit(ta, 4.0) is None
    assert c.tick(4.0).paused == [] and c.programs.get("a").backend == w0.key


def test_stateless_requests_go_to_a_paused_engine_when_every_engine_is_paused():
    c = make(n=1)
    w = c.backend_list()[0]
    pause(c, w, 0.0)
    assert c.submit(ticket(None, 100), 1.0) is w  # it waits at the engine's door, as SGLang holds it


def test_a_pause_through_the_router_is_not_counted_as_one_behind_it():
    c = make(n=1)
    w = c.backend_list()[0]
    c.windows.hold(Reason.PAUSED, 0.0, mode="abort")
    pause(c, w, 0.5)
    assert c.stats.engine_pauses_seen == 0


def test_the_admission_rule_measures_nothing_while_the_engine_is_paused():
    c = make(n=1)  # the default rule: goodput
    step(c, "a", 1000, 100, 0.0)
    w = c.backend_list()[0]
    c.tick(5.0)
    c.tick(10.0)
    assert w.admission is not None and w.admission.at == 10.0
    level = w.admission.level
    pause(c, w, 11.0)
    c.tick(15.0)
    c.tick(400.0)
    assert w.admission.at is None and w.admission.level == level  # kept, its period restarted
    w.engine_resume(400.0)
    c.tick(401.0)
    assert w.admission.at == 401.0
