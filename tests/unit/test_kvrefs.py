"""KV references (kvrefs): which requests carry a session_id, and when the router closes it."""

from __future__ import annotations

import pytest

from thunder_sgl.backends import Backend, Tiers
from thunder_sgl.config import RouterConfig, SchedulerConfig
from thunder_sgl.control.controller import Controller
from thunder_sgl.control.tickets import Ticket
from thunder_sgl.programs import Usage
from thunder_sgl.scheduler.goodput import AdmissionState


def make(flag: bool = True, policy: str = "thunder", n: int = 1) -> Controller:
    c = Controller(RouterConfig(scheduler=SchedulerConfig(default_output_tokens=100)), policy)
    for i in range(n):
        c.add_backend(Backend(f"http://w{i}", 0, Tiers(hbm_tokens=10_000), session_refs=flag))
    return c


def send(c: Controller, pid: str, tokens: int, now: float) -> Ticket:
    t = Ticket(pid, prompt_chars=4 * tokens)
    if c.submit(t, now) is None:
        assert t in c.tick(now).dispatched
    return t


@pytest.mark.parametrize(("flag", "policy", "sid"), [
    (True, "thunder", "p"), (False, "thunder", None), (True, "thunder-fixed", None), (True, "thunder-paper", None),
])
def test_a_request_carries_its_program_id_as_session_where_the_worker_and_policy_use_refs(flag, policy, sid):
    c = make(flag, policy)
    t = send(c, "p", 1000, 0.0)
    assert c.session_for(t) == sid
    c.finish(t, 1.0, Usage(1000, 10))
    assert c.programs.get("p").session_on == (t.backend.key if sid else None)


def test_release_and_pause_close_the_session_on_its_backend():
    c = make(policy="thunder-occupancy")  # its first period admits r beside q, then pauses q
    t = send(c, "p", 1000, 0.0)
    c.finish(t, 1.0, Usage(1000, 10))
    key = t.backend.key
    c.release("p", 2.0)
    assert c.kvrefs.take_closes() == [("p", key)]
    t = send(c, "q", 9000, 3.0)
    c.finish(t, 4.0, Usage(9000, 10))
    send(c, "r", 2000, 5.0)  # q (acting, 9 K) no longer fits beside r: paused, its session closed
    c.tick(6.0)
    assert ("q", key) in c.kvrefs.take_closes()
    assert c.programs.get("q").session_on is None
    assert c.kvrefs.take_closes() == []


def test_an_overcommitted_program_loses_its_reference_and_sends_none():
    c = make()
    b = c.backend_list()[0]
    b.admission = AdmissionState(extra=5_000.0, at=0.0)
    for i, size in enumerate((4000, 3000, 4000)):  # 11 K > 0.95 × 10 K: 1.5 K beyond what fits
        t = send(c, f"p{i}", size, float(i))
        c.finish(t, float(i) + 0.5, Usage(size, 0))
    res = c.tick(3.0)  # every program acting for less than a tick: full weight
    assert res.decisions.unref == frozenset({"p1"})  # the shortest goes first
    assert c.kvrefs.take_closes() == [("p1", b.key)]
    t = send(c, "p1", 3100, 4.0)
    assert c.session_for(t) is None
    assert c.session_for(send(c, "p0", 4100, 4.0)) == "p0"


def test_an_engine_that_dropped_its_kv_has_no_sessions_to_close():
    c = make()
    t = send(c, "p", 1000, 0.0)
    c.finish(t, 1.0, Usage(1000, 10))
    c.reset_kv(None, 2.0)
    c.release("p", 3.0)
    assert c.kvrefs.take_closes() == []
