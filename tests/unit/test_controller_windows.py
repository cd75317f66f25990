"""The request path during weight-update windows, and the KV reset after new weights."""

from __future__ import annotations

from thunder_sgl.backends import Backend, Tiers
from thunder_sgl.config import GatewayConfig, RouterConfig, SchedulerConfig, WindowConfig
from thunder_sgl.control.controller import Controller
from thunder_sgl.control.tickets import Ticket
from thunder_sgl.control.windows import Reason
from thunder_sgl.programs import Phase, ProgramState, Usage


def make(hbm: int = 10_000, n: int = 1, held_timeout: float = 1800.0, max_window: float = 1800.0, **sched) -> Controller:
    sched.setdefault("hbm_lambda", 1.0)
    sched.setdefault("lambda_max", 1.0)
    sched.setdefault("lambda_min", 1.0)
    cfg = RouterConfig(scheduler=SchedulerConfig(default_output_tokens=100, **sched),
                       gateway=GatewayConfig(held_timeout_seconds=held_timeout),
                       windows=WindowConfig(max_window_seconds=max_window))
    c = Controller(cfg)
    for i in range(n):
        c.add_backend(Backend(f"http://w{i}", 0, Tiers(hbm_tokens=hbm)))
    return c


def ticket(pid: str | None, tokens: int) -> Ticket:
    return Ticket(program_id=pid, prompt_chars=tokens * 4)


def step(c: Controller, pid: str, tokens: int, out: int, now: float) -> Ticket:
    t = ticket(pid, tokens)
    if c.submit(t, now) is None:
        assert t in c.tick(now).dispatched
    c.finish(t, now + 1, Usage(tokens, out))
    return t


def test_an_open_window_holds_active_paused_new_and_stateless_requests():
    c = make()
    step(c, "a", 1000, 100, 0.0)
    c.windows.hold(Reason.WEIGHT_SYNC, 5.0)
    held = [ticket("a", 1200), ticket("new", 500), ticket(None, 100)]
    for t in held:
        assert c.submit(t, 6.0) is None
    assert c.held_count == 3 and c.stats.window_held == 3
    # No tick places or dispatches anything while the window is open.
    r = c.tick(7.0)
    assert r.dispatched == [] and r.decisions.empty
    assert c.programs.get("new").state is ProgramState.PAUSED
    c.windows.release(Reason.WEIGHT_SYNC, 8.0)
    r = c.tick(8.0)
    assert sorted(map(id, r.dispatched)) == sorted(map(id, held))
    assert c.held_count == 0 and all(t.backend is not None for t in held)


def test_a_request_in_flight_when_the_window_opens_finishes_and_its_program_turns_acting():
    c = make()
    step(c, "a", 1000, 100, 0.0)
    t = ticket("a", 1200)
    assert c.submit(t, 1.0) is not None
    c.windows.hold(Reason.PAUSED, 2.0, mode="retract")
    assert c.finish(t, 3.0, Usage(1200, 50)) == []  # nothing drains into a paused engine
    p = c.programs.get("a")
    assert (p.phase, p.in_flight, p.context_tokens, p.steps) == (Phase.ACTING, 0, 1250, 2)


def test_window_time_does_not_count_towards_the_held_timeout():
    c = make(held_timeout=10.0)
    c.backends.clear()  # nothing can be admitted: the request stays held
    t = ticket("p", 100)
    c.submit(t, 0.0)
    c.windows.hold(Reason.WEIGHT_SYNC, 5.0)
    assert c.tick(20.0).expired == []  # inside the window: never failed
    c.windows.release(Reason.WEIGHT_SYNC, 100.0)
    # Held 101 s, 95 of them inside the window: 6 s count.
    assert c.tick(101.0).expired == []
    assert c.tick(105.5).expired == [t]


def test_watchdog_closes_a_stuck_window_and_held_requests_go_out():
    c = make(max_window=30.0)
    step(c, "a", 1000, 100, 0.0)
    c.windows.hold(Reason.WEIGHT_SYNC, 5.0)
    t = ticket("a", 1200)
    c.submit(t, 6.0)
    assert c.tick(30.0).dispatched == []
    r = c.tick(36.0)
    assert r.window_closed is not None and r.window_closed.by_watchdog and r.dispatched == [t]


def test_reset_kv_requeues_idle_programs_and_restarts_their_decay():
    c = make(n=2, decay_base=2.0, tick_seconds=5.0)
    step(c, "a", 1000, 100, 0.0)
    step(c, "b", 1000, 100, 0.0)
    a, b = c.programs.get("a"), c.programs.get("b")
    assert a.backend != b.backend
    busy = ticket("b", 1200)
    c.submit(busy, 50.0)  # b reasoning on its backend
    requeued = c.reset_kv(None, 60.0)
    assert requeued == [a]
    assert (a.state, a.prev_backend, a.acting_since, a.kv_resets) == (ProgramState.PAUSED, None, 60.0, 1)
    assert (b.state, b.backend, b.kv_resets) == (ProgramState.ACTIVE, busy.backend.key, 1)
    # Restored anywhere, without counting a migration (its KV is nowhere any more).
    r = c.tick(61.0)
    assert r.placed == [a] and a.migrations == 0 and c.stats.migrations == 0


def test_reset_kv_only_touches_the_named_backends():
    c = make(n=2)
    step(c, "a", 1000, 100, 0.0)
    step(c, "b", 1000, 100, 0.0)
    a, b = c.programs.get("a"), c.programs.get("b")
    assert c.reset_kv([a.backend], 10.0) == [a]
    assert b.state is ProgramState.ACTIVE and b.kv_resets == 0


def test_after_new_weights_the_oldest_held_requests_are_readmitted_first_within_capacity():
    """Four programs of 2000 tokens on one backend of 10 000, two more new: during the window
    each sends a request; the weights change. The cluster is refilled by the scheduler in its
    aging order — known programs' held requests in the order they arrived, then new programs —
    only as many as fit (not all six prefilling at once), and the rest follow as the first
    ones finish."""
    c = make(hbm=10_000)
    pids = [f"p{i}" for i in range(6)]
    for i, pid in enumerate(pids[:4]):
        step(c, pid, 2000, 100, float(i))
    c.windows.hold(Reason.PAUSED, 10.0, mode="abort")
    order = [3, 0, 5, 1, 4, 2]  # arrival order during the window (p4, p5 are new)
    tickets = {}
    for k, i in enumerate(order):
        tickets[pids[i]] = t = ticket(pids[i], 2000)
        assert c.submit(t, 11.0 + k) is None
    requeued = c.reset_kv(None, 20.0)
    assert sorted(p.id for p in requeued) == pids[:4]
    c.windows.release(Reason.PAUSED, 20.0)
    first = c.tick(20.0).dispatched
    fit = 10_000 // (2000 + 100)  # the HBM condition: context + expected output each
    aging = [pids[i] for i in order if i < 4] + [pids[i] for i in order if i >= 4]
    assert [t.program_id for t in first] == aging[:fit]
    assert sum(p.in_flight for p in c.programs) == fit
    # Every held request is answered once the first ones finish.
    done = set()
    now = 21.0
    while len(done) < 6:
        for t in list(first):
            c.finish(t, now, Usage(2000, 100))
            c.release(t.program_id, now)
            done.add(t.program_id)
        now += 1.0
        first = c.tick(now).dispatched
    assert c.held_count == 0


def test_stateless_requests_held_by_a_window_wait_for_a_backend():
    c = make()
    c.windows.hold(Reason.UPDATING, 0.0)
    t = ticket(None, 10)
    assert c.submit(t, 0.0) is None
    for b in c.backends.values():
        b.healthy = False
    c.windows.release(Reason.UPDATING, 1.0)
    assert c.tick(1.0).dispatched == [] and c.held_count == 1
    for b in c.backends.values():
        b.healthy = True
    assert c.tick(2.0).dispatched == [t]
    assert c.cancel(t) is False  # dispatched: no longer held


def test_a_worker_whose_update_failed_is_out_of_routing_until_it_reports_the_expected_version():
    """``Backend.weights_pending``: its idle program and held request move to the other
    backend (as from an unhealthy one); the backend comes back on the expected version only."""
    from thunder_sgl.backends.backend import PendingWeights

    c = make(n=2)
    step(c, "a", 1000, 100, 0.0)
    b = c.backends[c.programs.get("a").backend]
    other = next(x for x in c.backend_list() if x is not b)
    b.weight_version = "v0"
    c.windows.hold(Reason.UPDATING, 1.0)
    b.weights_pending = PendingWeights("v1", "v0", 1.0, "/update_weights_from_distributed", "no group")
    t = ticket("a", 1200)
    assert c.submit(t, 2.0) is None  # held by the window
    c.windows.release(Reason.UPDATING, 3.0)
    assert c.tick(3.0).paused == [c.programs.get("a")]  # evacuated, as from an unhealthy backend
    assert t in c.tick(3.2).dispatched and t.backend is other  # and placed on the other one
    assert not b.available(3.0, 10.0) and c.submit(ticket(None, 10), 3.5) is other
    assert c.weight_version_seen(b, "v0", 4.0) == [] and b.weights_pending is not None  # the old weights
    c.weight_version_seen(b, "v1", 5.0)
    assert b.weights_pending is None and b.available(5.0, 10.0) and b.weight_version == "v1"
    assert PendingWeights(None, "v0", 0.0, "x", "").met_by("v2") and not PendingWeights(None, "v0", 0.0, "x", "").met_by("v0")


def test_an_active_programs_request_is_not_sent_to_a_worker_whose_update_failed_before_the_next_tick():
    """The window closed and no tick has evacuated the program yet: its next request is held
    (not served by the stale weights) and goes to the other backend once the tick moves it."""
    from thunder_sgl.backends.backend import PendingWeights

    c = make(n=2)
    step(c, "a", 1000, 100, 0.0)
    b = c.backends[c.programs.get("a").backend]
    other = next(x for x in c.backend_list() if x is not b)
    b.weights_pending = PendingWeights("v1", "v0", 1.0, "/update_weights_from_distributed", "no group")
    t = ticket("a", 1200)
    assert c.submit(t, 2.0) is None and c.held_count == 1 and c.next_tick_at() <= 2.0
    assert c.tick(2.0).paused == [c.programs.get("a")]
    assert t in c.tick(2.2).dispatched and t.backend is other
