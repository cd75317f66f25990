"""The request path: submit / hold / tick / finish / release, without I/O."""

from __future__ import annotations

import dataclasses

import pytest

from thunder_sgl.backends import Backend, Tiers
from thunder_sgl.backends.backend import TOOL_BINS
from thunder_sgl.config import GatewayConfig, ProgramsConfig, RouterConfig, SchedulerConfig
from thunder_sgl.control.controller import Controller
from thunder_sgl.control.tickets import Ticket
from thunder_sgl.errors import Conflict, NoBackend, NotFound, Overloaded
from thunder_sgl.programs import Phase, ProgramState, Usage
from thunder_sgl.scheduler import queue


def make(hbm: int = 10_000, n: int = 1, **sched) -> Controller:
    sched.setdefault("hbm_lambda", 1.0)  # the gate at exactly HBM, watermarks at the pool:
    sched.setdefault("lambda_max", 1.0)  # the arithmetic below stays plain
    sched.setdefault("lambda_min", 1.0)
    cfg = RouterConfig(scheduler=SchedulerConfig(default_output_tokens=100, **sched))
    c = Controller(cfg)
    for i in range(n):
        c.add_backend(Backend(f"http://w{i}", 0, Tiers(hbm_tokens=hbm)))
    return c


def ticket(pid: str | None, tokens: int, chars_per_token: float = 4.0) -> Ticket:
    return Ticket(program_id=pid, prompt_chars=int(tokens * chars_per_token))


def inferred_step(c: Controller, now: float, pid: str = "inf-1") -> Ticket:
    """One step of a program whose id was inferred (``Ticket.inferred``)."""
    t = Ticket(pid, prompt_chars=400, inferred=True, conversation=b"h")
    if c.submit(t, now) is None:
        assert t in c.tick(now).dispatched
    c.finish(t, now + 1, Usage(100, 10))
    return t


def step(c: Controller, pid: str, tokens: int, out: int, now: float) -> Ticket:
    """Submit, tick if held, and finish one request; returns the ticket."""
    t = ticket(pid, tokens)
    if c.submit(t, now) is None:
        assert t in c.tick(now).dispatched
    c.finish(t, now + 1, Usage(tokens, out))
    return t


def test_first_request_creates_a_queued_program_admitted_by_the_next_tick():
    c = make()
    t = ticket("p", 1000)
    assert c.submit(t, 0.0) is None
    p = c.programs.get("p")
    assert (p.state, p.admitted, p.held, c.held_count) == (ProgramState.PAUSED, False, 1, 1)
    assert c.next_tick_at() <= 0.0
    r = c.tick(0.0)
    assert r.dispatched == [t] and t.backend.key == "http://w0"
    assert (p.state, p.phase, p.in_flight, p.held, c.stats.admissions) == (ProgramState.ACTIVE, Phase.REASONING, 1, 0, 1)


def test_active_program_dispatches_at_once_and_usage_sets_its_context():
    c = make()
    step(c, "p", 1000, 200, 0.0)
    p = c.programs.get("p")
    assert (p.context_tokens, p.phase, p.steps) == (1200, Phase.ACTING, 1)
    t = ticket("p", 1500)
    assert c.submit(t, 5.0) is c.backends["http://w0"]
    assert p.pending_prompt_tokens == 1500


def test_a_second_concurrent_request_of_one_program_is_refused_without_side_effects():
    c = make()
    step(c, "p", 1000, 200, 0.0)
    t1 = ticket("p", 1400)
    c.submit(t1, 1.0)
    with pytest.raises(Conflict):
        c.submit(ticket("p", 1400), 1.0)
    p = c.programs.get("p")
    assert (p.in_flight, p.held, c.backends["http://w0"].inflight) == (1, 0, 1)


def test_paused_program_request_is_held_and_continues_after_restore():
    c = make(hbm=2500)
    step(c, "a", 1000, 200, 0.0)
    step(c, "b", 1000, 200, 0.0)
    c.programs.get("b").acting_since = 0.0
    # a grows past the pool: b (acting) is paused by the tick.
    ta = ticket("a", 1400)
    c.submit(ta, 1.0)
    r = c.tick(1.0)
    assert [p.id for p in r.paused] == ["b"]
    tb = ticket("b", 1300)
    assert c.submit(tb, 2.0) is None and c.held_count == 1
    c.finish(ta, 3.0, Usage(1400, 200))
    c.release("a", 3.5)
    r = c.tick(4.0)
    assert r.dispatched == [tb] and c.programs.get("b").restores == 1 and c.stats.restores == 1


def test_errors_return_the_program_to_acting_and_count_as_failed():
    c = make()
    step(c, "p", 1000, 200, 0.0)
    t = ticket("p", 1400)
    c.submit(t, 1.0)
    c.finish(t, 2.0, None)
    p = c.programs.get("p")
    assert (p.phase, p.in_flight, p.context_tokens, c.stats.failed_requests) == (Phase.ACTING, 0, 1200, 1)
    assert c.backends["http://w0"].inflight == 0


def test_hbm_gate_holds_a_request_until_a_running_one_finishes():
    # Pool 30k (host tier, write_back) but HBM only 3000: two 1500-token programs cannot reason together.
    c = make()
    c.backends.clear()
    c.add_backend(Backend("http://w0", 0, Tiers(hbm_tokens=3000, host_tokens=27_000, host_inclusive=False)))
    step(c, "a", 1000, 100, 0.0)
    step(c, "b", 1000, 100, 0.0)
    ta, tb = ticket("a", 1500), ticket("b", 1500)
    assert c.submit(ta, 1.0) is not None
    assert c.submit(tb, 1.0) is None and c.stats.gated == 1   # (1500 + 100) × 2 > 3000
    assert c.finish(ta, 2.0, Usage(1500, 100)) == [tb]


def test_a_request_held_at_the_hbm_gate_past_the_reservation_age_is_not_overtaken():
    """First fit at the HBM condition, until a held request has waited ``reserve_after_seconds``:
    b's large request waits while a runs; c's small one, which fits beside a, goes past it at
    t = 30; a's next one, at t = 62, waits behind b, held 61 s by then (letting it pass starved b
    for as long as small requests kept the room taken); when c ends, b goes, and a follows."""
    c = make()
    c.backends.clear()
    c.add_backend(Backend("http://w0", 0, Tiers(hbm_tokens=3000, host_tokens=27_000, host_inclusive=False)))
    c.kvdrop.confirm = 0  # no cached tokens reported here: not a dropped cache
    for pid in ("a", "b", "c"):
        step(c, pid, 500, 100, 0.0)
    ta, tb, tc = ticket("a", 1200), ticket("b", 2000), ticket("c", 1000)
    assert c.submit(ta, 1.0) is not None
    assert c.submit(tb, 1.0) is None                   # 1300 + 2100 > 3000
    assert c.submit(tc, 30.0) is not None              # 1300 + 1100 fits: first fit, b held 29 s
    assert c.finish(ta, 40.0, Usage(1200, 100)) == []  # 1100 + 2100 > 3000: b still waits
    ta2 = ticket("a", 1200)
    assert c.submit(ta2, 62.0) is None                 # 1100 + 1300 fits, but b has waited 61 s
    assert c.finish(tc, 63.0, Usage(1000, 100)) == [tb]
    assert c.finish(tb, 64.0, Usage(2000, 100)) == [ta2]


def test_a_new_programs_output_is_sized_at_most_its_max_tokens_until_it_has_its_own():
    """Before a program's first answer its output is the default (100 here), bounded by the
    max_tokens its request asks: a burst of new programs asking 40 tokens each is admitted as
    40, not 100. Once it has answered, its own output average counts, not the bound."""
    c = make(hbm=2150)
    ts = [Ticket(program_id=f"p{i}", prompt_chars=4000, max_output=40) for i in range(3)]
    for t in ts:
        assert c.submit(t, 0.0) is None
    assert len(c.tick(0.0).dispatched) == 2           # 2 × (1000 + 40) ≤ 2150
    c2 = make(hbm=2150)
    us = [Ticket(program_id=f"p{i}", prompt_chars=4000) for i in range(3)]
    for t in us:
        c2.submit(t, 0.0)
    assert len(c2.tick(0.0).dispatched) == 1           # 2 × (1000 + 100) > 2150
    t = ts[0]
    c.finish(t, 1.0, Usage(1000, 90))
    p = c.programs.get("p0")
    assert p.expected_output_tokens == 90.0
    from thunder_sgl.scheduler.cost import cost_of
    assert cost_of(p, 100.0).output == 90.0            # its own average, above the bound of 40


def test_the_request_path_computes_a_changed_programs_cost_at_once():
    """Each change the request path makes to a program's cost inputs (held, dispatched,
    answered, withdrawn) is told to the scheduler, which computes the cost then: the tick
    finds it cached, equal to a fresh one."""
    from thunder_sgl.scheduler.cost import program_cost

    c = make()

    def fresh(p):
        assert p.cost_cache is not None
        assert p.cost_cache == program_cost(p, 100.0)

    t = ticket("p", 1000)
    assert c.submit(t, 0.0) is None             # held: a new program waits for its tick
    p = c.programs.get("p")
    fresh(p)
    assert t in c.tick(0.0).dispatched          # dispatched by the tick (pending prompt, reasoning)
    fresh(p)
    assert p.cost_cache.gated and p.cost_cache.tokens == 1000
    c.finish(t, 1.0, Usage(1000, 90))           # answered: the context grows, acting
    fresh(p)
    assert not p.cost_cache.gated and p.cost_cache.tokens == 1090
    t2 = ticket("p", 1200)
    assert c.submit(t2, 2.0) is not None        # its next request goes at once
    fresh(p)
    assert p.cost_cache.tokens == 1200
    c.finish(t2, 3.0, Usage(1200, 50))
    c.programs.pause(p, 3.5)
    t3 = ticket("p", 1300)
    assert c.submit(t3, 4.0) is None            # paused: held
    fresh(p)
    assert c.cancel(t3)                         # withdrawn: no pending prompt any more
    fresh(p)
    assert p.cost_cache.tokens == 1250


def test_paper_variant_has_no_hbm_gate():
    cfg = RouterConfig(scheduler=SchedulerConfig(default_output_tokens=100))
    c = Controller(cfg, policy="thunder-paper")
    c.add_backend(Backend("http://w0", 0, Tiers(hbm_tokens=3000, host_tokens=27_000, host_inclusive=False)))
    step(c, "a", 1000, 100, 0.0)
    step(c, "b", 1000, 100, 0.0)
    assert c.submit(ticket("a", 1400), 1.0) is not None
    assert c.submit(ticket("b", 1400), 1.0) is not None


def test_stateless_requests_use_the_least_loaded_backend_and_are_not_tracked():
    c = make(n=2)
    t1, t2 = ticket(None, 100), ticket(None, 100)
    assert c.submit(t1, 0.0).key == "http://w0"
    assert c.submit(t2, 0.0).key == "http://w1"
    c.finish(t1, 1.0, Usage(100, 10))
    assert len(c.programs) == 0 and c.stats.stateless_requests == 2
    for b in c.backends.values():
        b.healthy = False
    with pytest.raises(NoBackend):
        c.submit(ticket(None, 1), 2.0)


def test_release_returns_held_tickets_and_unknown_release_is_404():
    c = make(hbm=1000)
    t = ticket("big", 5000)
    c.submit(t, 0.0)
    step(c, "other", 500, 10, 0.0)  # not needed for the assertion; keeps a program active
    p, held = c.release("big", 1.0)
    assert p.state is ProgramState.TERMINATED and held in ([t], [])
    with pytest.raises(NotFound):
        c.release("big", 1.0)


def test_a_released_program_counts_its_steps_on_the_backend_it_last_ran_on():
    """``Served.ended`` and ``ended_steps``: how many steps programs take where they end (the
    admission rule tells an open stream of programs from a closed loop by them). A program
    released before any step counts nowhere; one paused since its last step counts where it ran."""
    c = make(n=1)
    b = c.backends["http://w0"]
    for i in range(3):
        step(c, "a", 100 + 10 * i, 10, float(i * 2))
    step(c, "b", 100, 10, 10.0)
    c.ensure_program("sandbox-only", 11.0)
    c.release("sandbox-only", 12.0)
    assert (b.served.ended, b.served.ended_steps) == (0, 0)
    c._pause(c.programs.get("a"), 13.0)
    c.release("a", 14.0)
    c.release("b", 14.0)
    assert (b.served.ended, b.served.ended_steps) == (2, 4)


def test_held_requests_expire_after_the_held_timeout():
    cfg = RouterConfig(gateway=GatewayConfig(held_timeout_seconds=10.0))
    c = Controller(cfg)  # no backends: nothing can be admitted
    t = ticket("p", 100)
    c.submit(t, 0.0)
    assert c.tick(5.0).expired == []
    assert c.tick(11.0).expired == [t]
    assert c.held_count == 0 and c.programs.get("p").held == 0


def test_idle_programs_are_released_after_the_idle_timeout():
    cfg = RouterConfig(programs=ProgramsConfig(idle_timeout_seconds=100.0))
    c = Controller(cfg)
    c.add_backend(Backend("http://w0", 0, Tiers(hbm_tokens=10_000)))
    step(c, "p", 100, 10, 0.0)
    assert c.tick(50.0).released == []
    assert [p.id for p in c.tick(102.0).released] == ["p"] and len(c.programs) == 0


def test_an_inferred_program_is_released_after_its_tool_derived_idle_timeout_and_comes_back_under_its_id():
    """``ProgramsConfig.inferred_idle_seconds``: 4 x the longest tool seen, at least 60 s, at
    most the idle timeout; a program that sent its id keeps the idle timeout."""
    cfg = RouterConfig(programs=ProgramsConfig(idle_timeout_seconds=1000.0))
    assert [cfg.programs.inferred_idle_seconds(t) for t in (0.0, 5.0, 30.0, 600.0)] == [60.0, 60.0, 120.0, 1000.0]
    c = Controller(cfg)
    c.add_backend(Backend("http://w0", 0, Tiers(hbm_tokens=10_000)))

    inferred_step(c, 0.0)
    inferred_step(c, 31.0)  # a 30 s tool: the idle timeout becomes 120 s
    step(c, "explicit", 100, 10, 0.0)
    p = c.programs.get("inf-1")
    assert p.inferred and p.max_tool_seconds == 30.0 and not c.programs.get("explicit").inferred
    assert c.tick(150.0).released == []
    assert [q.id for q in c.tick(153.5).released] == ["inf-1"]
    inferred_step(c, 200.0)  # the agent comes back after a long tool: the same id, a new program
    assert c.programs.get("inf-1").steps == 1 and c.programs.get("explicit") is not None


def test_a_weight_version_changed_behind_the_router_resets_that_engines_kv_accounting():
    c = make(n=2)
    for pid in ("a", "b"):
        step(c, pid, 1000, 100, 0.0)
    on_w0 = [p for p in c.programs if p.backend == "http://w0"]
    w0, w1 = c.backends["http://w0"], c.backends["http://w1"]
    assert c.weight_version_seen(w0, "v1", 5.0) == [] and w0.weight_version == "v1"  # first sight: nothing changed
    assert c.weight_version_seen(w0, "v1", 6.0) == []
    requeued = c.weight_version_seen(w0, "v2", 7.0)
    assert requeued == on_w0 and all(p.kv_resets == 1 and p.paused for p in on_w0)
    assert c.stats.weight_changes_seen == 1 and w1.weight_version is None
    assert c.weight_version_seen(w1, "v2", 7.5) == [] and c.stats.weight_changes_seen == 1
    # an answer naming a new version does the same (the version rides on its usage)
    t = ticket(None, 100)
    assert c.submit(t, 8.0) is not None
    c.finish(t, 9.0, Usage(100, 10, 0, weight_version="v3"))
    assert c.stats.weight_changes_seen == 2 and t.backend.weight_version == "v3"


@pytest.mark.parametrize(
    ("limits", "fill"),
    [({"max_waiting_programs": 2}, 2), ({"max_held_requests": 3}, 3)],
)
def test_bounded_queues_answer_overloaded_past_their_limit(limits, fill):
    cfg = RouterConfig(gateway=dataclasses.replace(GatewayConfig(), **limits))
    c = Controller(cfg)  # no backends: everything waits
    for i in range(fill):
        c.submit(ticket(f"p{i}", 100), 0.0)
    with pytest.raises(Overloaded) as e:
        c.submit(ticket("one-more", 100), 0.0)
    assert e.value.retry_after == cfg.gateway.retry_after_seconds


def test_prefix_tokens_are_learned_from_the_first_requests_cached_tokens():
    c = make()
    t = Ticket("a", prompt_chars=4000, prefix_key="sys", prefix_chars=2000)
    c.submit(t, 0.0)
    c.tick(0.0)
    assert c.programs.get("a").shared_prefix_tokens == 500  # 2000 chars / 4
    c.finish(t, 1.0, Usage(1000, 10, cached_tokens=480))
    t2 = Ticket("b", prompt_chars=4000, prefix_key="sys", prefix_chars=2000)
    c.submit(t2, 2.0)
    assert c.programs.get("b").shared_prefix_tokens == 480


def test_tool_time_restarts_the_decay_clock():
    c = make()
    step(c, "p", 1000, 100, 0.0)
    c.tool_started("p", 2.0)
    assert c.programs.get("p").acting_since == 2.0
    c.tool_finished("p", 9.0, 7.0)
    p = c.programs.get("p")
    assert (p.acting_since, p.last_tool_seconds, p.total_tool_seconds) == (9.0, 7.0, 7.0)
    with pytest.raises(NotFound):
        c.tool_started("nope", 1.0)


def _kv_step(c: Controller, pid: str, prompt: int, cached: int, now: float) -> Ticket:
    t = ticket(pid, prompt)
    if c.submit(t, now) is None:
        assert t in c.tick(now).dispatched
    c.finish(t, now + 1, Usage(prompt, 10, cached))
    return t


def test_a_cache_dropped_behind_the_router_without_a_new_version_is_seen_after_two_programs_in_a_row():
    """``control.kvdrop``: two programs, each still placed since its last step and each after
    the engine went idle, find most of their previous prompt gone: the engine's KV accounting
    is reset, once; the program that saw it keeps its place."""
    c = make(hbm=100_000, n=2)
    for pid in ("a", "b", "c"):
        _kv_step(c, pid, 1000, 0, 0.0)
    w0 = c.backends["http://w0"]
    on0 = sorted(p.id for p in c.programs if p.backend == w0.key)
    assert len(on0) >= 2
    first, second = on0[:2]
    # cached as expected: hits, no evidence
    _kv_step(c, first, 1100, 1000, 10.0)
    assert c.kvdrop.evidence(w0.key) == 0
    # its tail evicted, something kept: what eviction does, not a drop (the first piece of
    # evidence must find nothing, or less than half its shared prefix)
    _kv_step(c, first, 1150, 300, 15.0)
    assert c.kvdrop.evidence(w0.key) == 0
    # the engine drops its cache while idle; the next two programs there find nothing cached
    _kv_step(c, first, 1200, 0, 20.0)
    assert c.kvdrop.evidence(w0.key) == 1 and c.stats.kv_drops_seen == 0
    _kv_step(c, first, 1300, 1200, 30.0)  # a hit in between: no drop after all
    assert c.kvdrop.evidence(w0.key) == 0
    _kv_step(c, first, 1400, 0, 40.0)
    _kv_step(c, first, 1500, 0, 50.0)  # the same program twice is one piece of evidence
    assert c.stats.kv_drops_seen == 0
    _kv_step(c, second, 1100, 120, 60.0)  # only the shared head left: under half
    assert c.stats.kv_drops_seen == 1
    others = [p for p in c.programs if p.id not in (first, second)]
    assert all(p.kv_resets == (1 if p.prev_backend == w0.key or p.backend == w0.key else 0) for p in others)
    p2 = c.programs.get(second)
    assert p2.kv_resets == 1 and p2.active and p2.backend == w0.key and p2.last_step_backend == w0.key
    assert all(p.kv_resets == 0 for p in c.programs if p.backend == "http://w1")


def test_a_lost_prefix_is_no_evidence_unless_the_engine_went_idle_and_the_program_stayed_placed():
    c = make(hbm=100_000, n=1)
    for pid in ("a", "b"):
        _kv_step(c, pid, 1000, 0, 0.0)
    w0 = c.backends["http://w0"]
    # "b" keeps a request in flight from before "a"'s step ended to after "a"'s next dispatch:
    # the router never saw the engine idle in between, so no flush could have happened
    ta = ticket("a", 1100)
    assert c.submit(ta, 10.0) is w0
    tb = ticket("b", 1100)
    assert c.submit(tb, 10.5) is w0
    c.finish(ta, 11.0, Usage(1100, 10, 1000))
    _kv_step(c, "a", 1200, 0, 12.0)  # evicted, not flushed
    assert c.kvdrop.evidence(w0.key) == 0
    c.finish(tb, 14.0, Usage(1100, 10, 1000))
    # a paused program's KV may go: no evidence either
    c.programs.pause(c.programs.get("b"), 9.0)
    assert c.programs.get("b").last_step_backend is None
    c.kvdrop.confirm = 0  # off
    _kv_step(c, "a", 1300, 0, 20.0)
    assert c.kvdrop.evidence(w0.key) == 0 and c.stats.kv_drops_seen == 0


def test_an_idle_inferred_program_goes_dormant_gives_back_its_place_and_comes_back_with_its_request():
    """``Program.dormant``: an inferred program idle past ``inferred_pause_seconds`` is paused
    and not restored for room alone (a finished agent cannot say so); its next request is held
    and restores it, waiting from that request on; an explicit one stays placed."""
    cfg = RouterConfig(programs=ProgramsConfig(idle_timeout_seconds=1000.0))
    assert cfg.programs.inferred_pause_seconds(0.0) == 20.0 and cfg.programs.inferred_pause_seconds(10.0) == 40.0
    c = Controller(cfg)
    c.add_backend(Backend("http://w0", 0, Tiers(hbm_tokens=100_000)))

    inferred_step(c, 0.0)
    step(c, "explicit", 100, 10, 0.0)
    p = c.programs.get("inf-1")
    assert c.tick(15.0).paused == [] and p.active  # nobody waits: 14 s idle is not yet enough
    res = c.tick(21.5)
    assert res.paused == [p] and p.paused and p.dormant and c.stats.dormant == 1
    assert c.programs.get("explicit").active
    assert c.tick(30.0).placed == [] and p.paused  # room, but nothing to run: stays dormant
    t = Ticket("inf-1", prompt_chars=400, inferred=True, conversation=b"h")
    assert c.submit(t, 40.0) is None and p.waiting_since == 40.0
    res = c.tick(40.0)
    assert t in res.dispatched and p.active and not p.dormant
    c.finish(t, 41.0, Usage(120, 10))
    assert p.steps == 2


def _two_inferred_and_one_explicit(a_hint: str | None = None) -> Controller:
    """A full 3,000-token pool: inferred programs inf-a and inf-b and one explicit, each of
    800 tokens after one step that ended at t = 1 (inf-a's answer hinted ``a_hint``)."""
    c = make(hbm=3000)
    for pid, inferred in (("inf-a", True), ("inf-b", True), ("explicit", False)):
        t = Ticket(pid, prompt_chars=3200, inferred=inferred)
        if c.submit(t, 0.0) is None:
            assert t in c.tick(0.0).dispatched
        t.end_hint = a_hint if pid == "inf-a" else None
        c.finish(t, 1.0, Usage(800, 10))
    return c


def _tools_of_1_to_4_s_and_programs_of_about_20_steps(c: Controller) -> None:
    """Teach ``c`` tool calls of 1–4 s on its backend and programs that end after 18–22 steps."""
    b = c.backends["http://w0"]
    for _ in range(25):
        for s in (1.0, 2.0, 3.0, 4.0):
            b.served.returns.add(s)
    for n in (18, 20, 22) * 10:
        for k in range(1, n + 1):
            c.lengths.step(k)
        c.lengths.end(n)


def _programs_end_after_one_or_two_steps(c: Controller) -> None:
    """Teach ``c.lengths`` that programs end after one step half the time (two otherwise)."""
    for n in (1, 2) * 20:
        for k in range(1, n + 1):
            c.lengths.step(k)
        c.lengths.end(n)


def _tools_of_1_s_and_programs_of_1_or_2_steps(c: Controller) -> None:
    """Tools of 1 s on w0 (2.5 s of silence is past every one of them) and programs that end
    after one step half the time: an idle inferred program soon looks ended."""
    for _ in range(50):
        c.backends["http://w0"].served.returns.add(1.0)
    _programs_end_after_one_or_two_steps(c)


def test_while_programs_wait_an_inferred_program_likely_ended_goes_dormant_first():
    """Under pressure the rule is quicker: an inferred program whose probability of having ended
    (``programs.lengths``) reaches 0.9 gives its place to a waiting one, one per waiting program,
    the likeliest first, idle at least 2 s; an explicit program is never made dormant. Before
    any program has ended nobody is guessed ended."""
    c = _two_inferred_and_one_explicit()
    for pid in ("inf-a", "inf-b", "explicit"):
        assert c.programs.get(pid).active
    b = c.backends["http://w0"]
    for _ in range(50):
        b.served.returns.add(1.0)  # tools of 1 s: 2.5 s of silence is past every one of them
    c.programs.get("inf-b").last_active = 2.0  # inf-a has idled longer
    t = ticket("new", 800)
    assert c.submit(t, 3.5) is None  # no room: held
    assert c.tick(3.5).paused == []  # how long programs are is not known yet
    _programs_end_after_one_or_two_steps(c)
    assert c.lengths.ended_probability(1, b.served.returns.survival(2.5)) > 0.9
    res = c.tick(3.6)
    assert [p.id for p in res.paused] == ["inf-a"] and c.programs.get("inf-a").dormant
    assert t in res.dispatched  # its place went to the waiting program in the same tick
    assert c.programs.get("inf-b").active and c.programs.get("explicit").active


def test_each_tick_reads_how_likely_an_idle_inferred_program_ended_for_the_admission_rule():
    """``Program.ended_p``: the probability the dormant rule reads, kept on every admitted
    inferred program that waits for its client, with or without programs waiting, so that its
    backend's admission rule can count it out of the programs that cycle; 0 while its
    request runs, 0 for a program with an explicit id, 0 once dormant."""
    c = _two_inferred_and_one_explicit()
    b = c.backends["http://w0"]
    _tools_of_1_s_and_programs_of_1_or_2_steps(c)
    a, explicit = c.programs.get("inf-a"), c.programs.get("explicit")
    c.tick(1.5)  # 0.5 s after its answer: half of the tools outlast that
    early = a.ended_p
    assert 0.0 < early < 0.9
    c.tick(3.5)  # 2.5 s: past every tool
    assert a.ended_p > 0.9 > early and explicit.ended_p == 0.0
    assert a.ended_p == pytest.approx(c.lengths.ended_probability(a.steps, b.served.returns.survival(2.5)))
    again = Ticket("inf-a", prompt_chars=3600, inferred=True)
    assert c.submit(again, 4.0) is b
    c.tick(4.5)
    assert a.ended_p == 0.0  # its client asked again: it cycles
    c.finish(again, 5.0, Usage(900, 10))
    t = ticket("new", 800)
    assert c.submit(t, 8.0) is None  # a program waits: the likeliest ended one goes dormant
    res = c.tick(8.0)
    assert res.paused and all(p.dormant and p.ended_p == 0.0 for p in res.paused)


def test_a_program_that_ends_late_in_a_long_tool_workload_is_not_guessed_ended_early():
    """The same 2.5 s of silence after the first step, where tools last 1–4 s and programs
    take about 20 steps: P(ended) is small, so the waiting program waits."""
    c = _two_inferred_and_one_explicit()
    _tools_of_1_to_4_s_and_programs_of_about_20_steps(c)
    b = c.backends["http://w0"]
    t = ticket("new", 800)
    assert c.submit(t, 3.5) is None
    assert c.tick(3.5).paused == []
    assert c.lengths.ended_probability(1, b.served.returns.survival(2.5)) < 0.1


def test_an_inferred_program_whose_last_answer_signed_its_end_goes_dormant_first():
    """``conversations`` rule 7: where programs take about 20 steps, a silence of 2.5 s after the
    first step makes nobody ended (the test above), except the program whose answer carried the
    end sign; its place goes to the waiting program. The hint lasts until the program asks
    again (counted as a hint it came back from) or ends (counted as one that ended it)."""
    c = _two_inferred_and_one_explicit(a_hint="sign")
    _tools_of_1_to_4_s_and_programs_of_about_20_steps(c)
    b = c.backends["http://w0"]
    a, inf_b = c.programs.get("inf-a"), c.programs.get("inf-b")
    assert a.end_hint == "sign" and inf_b.end_hint is None
    t = ticket("new", 800)
    assert c.submit(t, 3.5) is None
    # the prior alone (0.75) is not enough after a silence half the tools outlast: 0.86 < 0.9
    assert c.tick(3.5).paused == []
    c.lengths.hints["sign"] = [10.0, 0.0]  # ten signed answers were their program's last
    assert c.programs.get("explicit").end_hint is None  # explicit ids: hints are not read
    res = c.tick(3.6)
    assert res.paused == [a] and a.dormant and t in res.dispatched and inf_b.active
    # it was alive after all: it asks again, and the sign learns it came back
    again = Ticket("inf-a", prompt_chars=3600, inferred=True)
    c.submit(again, 5.0)
    assert a.end_hint is None and c.lengths.hints["sign"] == [10.0 * 0.99, 1.0]
    # inf-b's next answer signs its end and its program is released (idle timeout, or a release)
    tb = Ticket("inf-b", prompt_chars=3600, inferred=True)
    assert c.submit(tb, 6.0) is b
    tb.end_hint = "sign"
    c.finish(tb, 7.0, Usage(900, 10))
    c.release("inf-b", 8.0)
    assert c.lengths.hints["sign"] == [10.0 * 0.99 * 0.99 + 1.0, 0.99]
    assert c.lengths.ended_hinted[1] == 1.0  # the end after two steps counted as a hinted one


def test_an_inferred_program_whose_request_the_engine_refused_for_its_context_goes_dormant_first():
    """``conversations`` rule 7, *context overflow*: a failed request of an inferred program
    that the gateway read as a refusal for the model's context length hints its end, as a
    signed answer does (prior 0.75, learnt the same way); any other failure hints nothing,
    and explicit ids are not read."""
    c = _two_inferred_and_one_explicit()
    _tools_of_1_to_4_s_and_programs_of_about_20_steps(c)
    a, inf_b, ex = c.programs.get("inf-a"), c.programs.get("inf-b"), c.programs.get("explicit")
    for p, hint in ((a, "context_overflow"), (inf_b, None), (ex, "context_overflow")):
        t = Ticket(p.id, prompt_chars=3600, inferred=p.inferred)
        assert c.submit(t, 2.0) is not None
        t.end_hint = hint
        c.finish(t, 2.0, None)  # refused: no usage, no step
        assert p.steps == 1
    assert a.end_hint == "context_overflow" and inf_b.end_hint is None and ex.end_hint is None
    t = ticket("new", 800)
    assert c.submit(t, 4.5) is None
    assert c.tick(4.5).paused == []  # the prior alone: 0.86 after a silence half the tools outlast
    c.lengths.hints["context_overflow"] = [10.0, 0.0]  # ten refused programs never came back
    res = c.tick(4.6)
    assert res.paused == [a] and a.dormant and t in res.dispatched and inf_b.active
    c.release("inf-a", 9.0)
    assert c.lengths.hints["context_overflow"] == [10.0 * 0.99 + 1.0, 0.0]


def test_a_request_surely_beyond_the_models_context_is_sent_at_once_and_never_waits_for_room():
    """``Controller._beyond_context``: a paused program's request that the engine will refuse
    whatever it holds (prompt + ``max_tokens`` beyond the model's context) is sent at once to
    the least-loaded backend, outside its program's accounting, instead of waiting to be
    restored; an inferred program's refusal still hints its end. Not when the estimate is
    within ``BEYOND_CONTEXT_MARGIN`` of the context, nor before the program's characters per
    token are learnt, nor with the context unknown on a backend."""
    from thunder_sgl.control.controller import BEYOND_CONTEXT_MARGIN

    c = make(hbm=3000, n=2)
    for b in c.backends.values():
        b.context_length = 4096
    for pid, inferred in (("inf-a", True), ("inf-b", True), ("x", False), ("y", False)):
        t = Ticket(pid, prompt_chars=5600, inferred=inferred)  # 1,400 tokens: two fit a backend
        if c.submit(t, 0.0) is None:
            assert t in c.tick(0.0).dispatched
        c.finish(t, 1.0, Usage(1400, 10))
    a = c.programs.get("inf-a")
    c.programs.pause(a, 2.0)
    assert a.paused and a.chars_per_token == 4.0
    # 3,800 tokens estimated + 400 asked: beyond 4,096 even at 2% fewer
    t = Ticket("inf-a", prompt_chars=3800 * 4, inferred=True, max_output=400)
    b = c.submit(t, 3.0)
    assert b is not None and t.beyond_context and a.paused and a.in_flight == 0
    assert c.stats.beyond_context == 1 and b.inflight == 1
    t.end_hint = "context_overflow"  # the engine's 400, as the proxy reads it
    assert c.finish(t, 3.1, None) == [] and a.end_hint == "context_overflow" and a.paused and a.steps == 1
    assert b.inflight == 0
    # beyond the context, but not by the margin: it waits for room as any paused program's request
    near = int((4096 - 400) / (1 - BEYOND_CONTEXT_MARGIN)) - 2
    assert near + 400 > 4096
    t2 = Ticket("inf-a", prompt_chars=near * 4, inferred=True, max_output=400)
    assert c.submit(t2, 4.0) is None and not t2.beyond_context and a.held
    # one the engine takes after all is served statelessly, its program untouched
    c.cancel(t2)
    t3 = Ticket("inf-a", prompt_chars=5000 * 4, inferred=True, max_output=8)
    assert c.submit(t3, 5.0) is not None and t3.beyond_context
    assert c.finish(t3, 6.0, Usage(4000, 8)) == [] and c.stats.beyond_context_served == 1 and a.steps == 1
    # no learnt characters per token (a first request): never judged, it waits for admission
    t4 = Ticket("new", prompt_chars=10_000 * 4, max_output=8)
    assert c.submit(t4, 7.0) is None and not t4.beyond_context
    # the context unknown on one backend: never judged
    c.backends["http://w1"].context_length = 0
    t5 = Ticket("inf-a", prompt_chars=9000 * 4, inferred=True, max_output=8)
    assert c.submit(t5, 8.0) is None and not t5.beyond_context


def test_a_dormant_program_that_asks_again_queues_from_its_request():
    """A dormant program that asks again queues from its request, not from when it went
    dormant: of two made dormant, the one that asks first goes first (counting the wait from
    the pause instead changed nothing in the DES, bench/results/inferred-des/README.md)."""
    c = _two_inferred_and_one_explicit()
    _tools_of_1_s_and_programs_of_1_or_2_steps(c)
    a, bb = c.programs.get("inf-a"), c.programs.get("inf-b")
    bb.last_active = 2.0
    for pid, now, gone in (("new-1", 3.5, a), ("new-2", 5.0, bb)):
        t = ticket(pid, 800)
        assert c.submit(t, now) is None
        res = c.tick(now)
        assert res.paused == [gone] and gone.dormant and t in res.dispatched
    assert c.submit(Ticket("inf-b", prompt_chars=3600, inferred=True), 6.0) is None
    assert c.submit(Ticket("inf-a", prompt_chars=3600, inferred=True), 7.0) is None
    assert (a.waiting_since, bb.waiting_since) == (7.0, 6.0)
    assert [p.id for p in queue.order(c.programs.waiting(), c.cfg.scheduler)] == ["inf-b", "inf-a"]


def test_a_program_paused_in_a_long_tool_counts_its_whole_silence_in_returns():
    """The dormant rule reads how long live clients stay silent (``Served.returns``), measured
    when the next request arrives: a program made dormant 1 s after its answer, that asks
    again at t = 31 while still dormant, shows 30 s there and as its longest silence (measured
    at its dispatch after the restore, as ``tool_hist`` is, it would show almost none)."""
    c = _two_inferred_and_one_explicit()
    b = c.backends["http://w0"]
    _tools_of_1_s_and_programs_of_1_or_2_steps(c)
    a = c.programs.get("inf-a")
    assert c.submit(ticket("new", 800), 3.5) is None
    assert c.tick(3.5).paused == [a] and a.dormant
    t = Ticket("inf-a", prompt_chars=3600, inferred=True)
    before = list(b.served.returns.weights)
    assert c.submit(t, 31.0) is None  # dormant: held until it is placed again
    assert a.max_tool_seconds == 30.0
    keep = b.served.returns.keep  # every add decays the older weights by this
    added = [i for i, (x, y) in enumerate(zip(before, b.served.returns.weights, strict=True)) if y > x * keep + 1e-9]
    assert len(added) == 1 and TOOL_BINS[added[0] - 1] < 30.0 <= TOOL_BINS[added[0]]
    assert b.served.returns.survival(20.0) > 0


def test_a_new_program_the_hbm_condition_keeps_out_waits_at_most_the_reservation_age():
    """Two programs cycle so that one of them always holds the HBM room a large new request
    would need. Before ``reserve_after_seconds`` the new program waits; then it is placed by the
    pool alone, its request goes first in line, and the cycling programs' next requests wait
    behind it (it waited for ever before: the real CPU engine with the file tier held such
    first requests 120–300 s)."""
    c = make()
    c.backends.clear()
    c.add_backend(Backend("http://w0", 0, Tiers(hbm_tokens=3000, host_tokens=27_000, host_inclusive=False)))
    c.kvdrop.confirm = 0
    for pid in ("a", "b"):
        step(c, pid, 500, 100, 0.0)
    big = ticket("big", 2000)
    current: dict[str, Ticket] = {}
    now, k = 1.0, 0
    while now < 90.0 and big.dispatched_at is None:
        if k == 4:
            assert c.submit(big, now) is None  # t = 4: a's or b's request always in flight
        c.tick(now)
        pid = ("a", "b")[k % 2]  # a and b overlap: each runs 1.5 s, one starts every 0.75 s
        t = current.get(pid)
        if t is not None and t.dispatched_at is not None:
            c.finish(t, now, Usage(1200, 100, 1100))
            t = None
        if t is None:
            current[pid] = ticket(pid, 1200)
            c.submit(current[pid], now)
        now, k = now + 0.75, k + 1
    assert big.dispatched_at is not None and 64.0 <= big.dispatched_at <= 67.0, big.dispatched_at  # 4 + 60 s
