"""One table or test per scheduling rule of design.md (policy ``thunder``)."""

from __future__ import annotations

import dataclasses

import pytest
from sched_scenarios import active, backend, naive_demand, new, paused

from thunder_sgl.config import SchedulerConfig
from thunder_sgl.programs import ProgramTable
from thunder_sgl.scheduler import ThunderScheduler, apply, least_loaded
from thunder_sgl.scheduler.capacity import BackendLoad
from thunder_sgl.backends.backend import ToolTimes
from thunder_sgl.scheduler.core import TABLE_TICKS
from thunder_sgl.scheduler.cost import decay_weights, returns_weights
from thunder_sgl.scheduler.cost import weight as program_weight

CFG = SchedulerConfig()  # paper defaults: Δt = 5 s, x = 2, λ = 1


def policy(**kw) -> ThunderScheduler:
    """The default policy, except that programs without history expect 1 output token (not
    256), so that with HBM = pool the HBM condition coincides with the pool condition unless
    a test is about it."""
    kw.setdefault("default_output_tokens", 1)
    kw.setdefault("lambda_max", 1.0)  # the paper's watermarks: limits equal the pool, plain arithmetic
    kw.setdefault("lambda_min", 1.0)
    return ThunderScheduler(dataclasses.replace(CFG, **kw))


# ---- time decay ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("acting_for", "x", "expected"),
    [
        (0.0, 2.0, 1.0),
        (4.99, 2.0, 1.0),      # k = 0 until a whole tick has passed
        (5.0, 2.0, 0.5),
        (12.0, 2.0, 0.25),     # k = 2
        (15.0, 4.0, 4.0**-3),
        (5.0 * 64, 2.0, 0.0),  # past max_decay_ticks the weight is exactly 0
        (30.0, 1.0, 1.0),      # x = 1 disables decay
    ],
)
def test_acting_weight_is_x_to_the_minus_whole_ticks(acting_for, x, expected):
    cfg = dataclasses.replace(CFG, decay_base=x)
    t = ProgramTable()
    p = active(t, "a", backend("b", 1000), 100, acting_since=0.0)
    assert program_weight(p, acting_for, cfg.tick_seconds, decay_weights(cfg)) == pytest.approx(expected)


def _silences(seconds: list[float]) -> ToolTimes:
    h = ToolTimes(keep=1.0)
    for x in seconds:
        h.add(x)
    return h


def test_returns_decay_is_the_paper_table_before_enough_silences_or_a_request_time():
    paper = decay_weights(CFG)
    long_tools = _silences([60.0] * 50)
    assert returns_weights(CFG, paper, _silences([60.0] * 10), 20.0) == paper  # < RETURNS_MIN_SAMPLES
    assert returns_weights(CFG, paper, long_tools, 0.0) == paper               # no request time yet


def test_returns_decay_keeps_a_long_tools_room_and_is_never_below_the_paper():
    paper = decay_weights(CFG)
    # every tool takes 20 s (histogram bin 14.6-21.9 s), requests 15 s
    h = _silences([20.0] * 50)
    w = returns_weights(CFG, paper, h, 15.0)
    assert len(w) == len(paper) and all(a >= b for a, b in zip(w, paper, strict=True))
    assert w[3] == pytest.approx(1.0)        # silent 15 s: S(30) = 0, so back within 15 s for sure
    assert w[1] == pytest.approx(1 - h.survival(20.0) / h.survival(5.0)) and w[1] > 0.7 > paper[1]
    assert w[0] == paper[0] == 1.0           # the paper's first tick, whole
    assert w[20] == paper[20]                # beyond the longest silence seen: the paper's x^-k
    # tools that end within a tick: the paper's table wherever it is above the chance to return
    short = returns_weights(CFG, paper, _silences([0.5] * 50), 10.0)
    assert short[:2] == paper[:2]


def test_returns_decay_table_is_read_per_backend_and_renewed_each_table_ticks():
    cfg = dataclasses.replace(CFG, decay="returns")
    s = ThunderScheduler(cfg)
    b = backend("b", 1000)
    assert s._table(b, 0.0) == s._decay  # nothing measured yet
    for _ in range(50):
        b.served.returns.add(20.0)
    b.served.request_s = 15.0
    assert s._table(b, 1.0) == s._decay  # the memo holds until TABLE_TICKS ticks have passed
    renewed = s._table(b, TABLE_TICKS * cfg.tick_seconds)
    assert renewed != s._decay and renewed[3] > s._decay[3]
    # the weight of a program in a 20-s tool, 15 s in, counts (almost) whole in the demand
    t = ProgramTable()
    active(t, "a", b, 500, acting_since=TABLE_TICKS * cfg.tick_seconds - 15.0)
    ld = BackendLoad.for_backend(b, cfg)
    now = TABLE_TICKS * cfg.tick_seconds
    ld.account(t.on_backend(b.key), now, cfg.tick_seconds, s._table(b, now), 1.0)
    assert ld.demand == pytest.approx(500 * renewed[3])
    # a worker added again under the same key starts afresh, and a removed one's table goes
    again = backend("b", 1000)
    assert s._table(again, now + 1.0) == s._decay
    c = backend("c", 1000)
    s.tick(now + 2.0, ProgramTable(), [c])
    assert set(s._tables) == {c.key}
    assert SchedulerConfig().decay == "paper"  # opt-in


def test_reasoning_and_held_programs_weigh_one_whatever_their_idle_time():
    t = ProgramTable()
    b = backend("b", 1000)
    r = active(t, "r", b, 100, acting_since=-100.0, reasoning=True)
    h = active(t, "h", b, 100, acting_since=-100.0, held=1)
    for p in (r, h):
        assert program_weight(p, 0.0, 5.0, decay_weights(CFG)) == 1.0


# ---- pool condition ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("hbm", "host", "storage", "inclusive", "tier_aware", "pool"),
    [
        (1000, 0, 0, True, True, 1000),
        (1000, 2000, 0, True, True, 2000),     # write_through: host holds a copy of HBM
        (1000, 2000, 0, False, True, 3000),    # write_back: tiers add up
        (1000, 2000, 5000, True, True, 5000),  # storage backs up host
        (1000, 2000, 5000, False, False, 1000),  # paper variant: HBM only
    ],
)
def test_pool_counts_tiers_by_write_policy(hbm, host, storage, inclusive, tier_aware, pool):
    b = backend("b", hbm, host, storage, inclusive)
    assert BackendLoad.for_backend(b, dataclasses.replace(CFG, tier_aware=tier_aware)).pool == pool


def test_no_pause_while_demand_fits_the_pool():
    t = ProgramTable()
    b = backend("b", 1000)
    for i in range(4):
        active(t, f"p{i}", b, 250)
    assert policy().tick(0.0, t, [b]).pauses == ()


def test_acting_demand_decays_so_the_same_programs_stop_thrashing_later():
    t = ProgramTable()
    b = backend("b", 1000)
    for i in range(6):
        active(t, f"p{i}", b, 250, acting_since=0.0)
    assert len(policy().tick(0.0, t, [b]).pauses) == 2   # 1500 > 1000: free 500
    assert len(policy().tick(5.0, t, [b]).pauses) == 0   # 1500 × 0.5 = 750 fits


# ---- whom to pause -------------------------------------------------------------------------
def test_pause_prefers_acting_then_lowest_weight_then_shortest_context():
    t = ProgramTable()
    b = backend("b", 1000)
    active(t, "reasoning", b, 400, reasoning=True)
    active(t, "held", b, 100, held=1)                   # held by the HBM gate: paused last
    active(t, "fresh-short", b, 150, acting_since=10.0)  # weight 1
    active(t, "old-long", b, 500, acting_since=0.0)      # weight 0.5 at t = 10 -> 250
    active(t, "fresh-long", b, 300, acting_since=10.0)   # weight 1
    # demand = 400 + 100 + 150 + 250 + 300 = 1200; excess 200.
    d = policy().tick(10.0, t, [b])
    # lowest weight first: old-long frees 250 >= 200.
    assert d.pauses == ("old-long",)


def test_shortest_context_breaks_ties_in_weight():
    t = ProgramTable()
    b = backend("b", 1000)
    active(t, "a", b, 600)
    active(t, "b", b, 300)
    active(t, "c", b, 200)
    # demand 1100, excess 100: c (200) is the shortest; b alone would also do but costs more.
    assert policy().tick(0.0, t, [b]).pauses == ("c",)


def test_pause_never_frees_more_than_the_excess():
    t = ProgramTable()
    b = backend("b", 1000)
    active(t, "small", b, 50)
    active(t, "big", b, 400)
    active(t, "mid", b, 650)
    # demand 1100, excess 100. Greedy by context takes small (50) then big (400); small is
    # then unnecessary (big alone frees 400 >= 100), so only big is paused... and mid is never
    # touched. The reference code's bug paused everything.
    d = policy().tick(0.0, t, [b])
    assert d.pauses == ("big",)


def test_reasoning_programs_are_never_paused_even_when_nothing_else_is_left():
    t = ProgramTable()
    b = backend("b", 1000)
    active(t, "r1", b, 700, reasoning=True)
    active(t, "r2", b, 700, reasoning=True)
    assert policy().tick(0.0, t, [b]).pauses == ()


def test_unavailable_backend_sends_every_idle_program_back_to_the_queue():
    t = ProgramTable()
    dead, live = backend("dead", 1000), backend("live", 1000)
    active(t, "idle", dead, 100)
    active(t, "busy", dead, 100, reasoning=True)  # its request finishes (or fails) first
    dead.healthy = False
    d = policy().tick(0.0, t, [dead, live])
    assert d.pauses == ("idle",)


def test_programs_on_a_removed_backend_are_paused():
    t = ProgramTable()
    gone, live = backend("gone", 1000), backend("live", 1000)
    active(t, "orphan", gone, 100)
    assert policy().tick(0.0, t, [live]).pauses == ("orphan",)


# ---- shared prefix -------------------------------------------------------------------------
def test_shared_prefix_is_counted_once_per_backend():
    t = ProgramTable()
    b = backend("b", 1000)
    for i in range(4):
        active(t, f"p{i}", b, 300, prefix=("sys", 200))
    # 4 × (300 − 200) + 200 = 600, not 1200: no pause.
    d = policy().tick(0.0, t, [b])
    assert d.pauses == () and d.demand[b.key] == 600


def test_pausing_frees_the_shared_prefix_only_with_the_last_program_of_its_key():
    t = ProgramTable()
    b = backend("b", 750)
    active(t, "a", b, 300, prefix=("sys", 200))
    active(t, "b", b, 300, prefix=("sys", 200))
    active(t, "c", b, 500)
    # demand = 100 + 100 + 200 (prefix once) + 500 = 900, excess 150. Shortest first: pausing
    # a frees only its private 100 (b still holds the prefix); b then frees 100 + 200. Were the
    # prefix freed with a, a alone (300) would have been enough.
    d = policy().tick(0.0, t, [b])
    assert d.pauses == ("a", "b")
    assert d.demand[b.key] == 500


# ---- whom and where to restore -------------------------------------------------------------
def test_restore_order_is_held_then_idle_then_new():
    t = ProgramTable()
    b = backend("b", 1000)
    new(t, "new", 300, since=0.0)
    paused(t, "idle", b, 300, since=0.0)
    paused(t, "held", b, 300, since=0.0, held=1)
    active(t, "x", b, 500, reasoning=True)
    d = policy().tick(1.0, t, [b])  # room for one program of 300 (500 + 300 <= 1000)
    assert [p.program_id for p in d.placements] == ["held"]


def test_aging_lets_a_long_waiting_new_program_pass_a_fresh_held_one():
    t = ProgramTable()
    b = backend("b", 1000)
    new(t, "old-new", 300, since=0.0)
    paused(t, "fresh-held", b, 300, since=100.0, held=1)
    active(t, "x", b, 500, reasoning=True)
    # scores: old-new 101 s + 0; fresh-held 1 s + 60 s bonus.
    d = policy().tick(101.0, t, [b])
    assert [p.program_id for p in d.placements] == ["old-new"]


def test_restore_prefers_the_previous_backend_when_it_has_room():
    t = ProgramTable()
    home, roomy = backend("home", 1000), backend("roomy", 10_000)
    paused(t, "p", home, 300, held=1)
    d = policy().tick(1.0, t, [roomy, home])
    assert d.placements[0].backend == home.key and not d.placements[0].migrated


def test_restore_migrates_to_the_backend_with_most_free_pool_when_home_is_full():
    t = ProgramTable()
    home, a, b = backend("home", 1000), backend("a", 1000), backend("b", 1000)
    active(t, "h", home, 900, reasoning=True)
    active(t, "x", a, 500, reasoning=True)
    active(t, "y", b, 200, reasoning=True)
    paused(t, "p", home, 300, held=1)
    d = policy().tick(1.0, t, [home, a, b])
    assert d.placements[0].backend == b.key and d.placements[0].migrated


def test_a_restore_never_overflows_its_target():
    t = ProgramTable()
    b = backend("b", 1000)
    active(t, "x", b, 600, reasoning=True)
    paused(t, "too-big", b, 500, held=1)
    paused(t, "fits", b, 390, held=1, since=1.0)
    d = policy().tick(2.0, t, [b])
    assert [p.program_id for p in d.placements] == ["fits"]


def test_low_watermark_blocks_restores_until_demand_falls_below_it():
    t = ProgramTable()
    b = backend("b", 1000)
    active(t, "x", b, 850, reasoning=True)
    paused(t, "p", b, 100, held=1)
    assert policy(lambda_min=0.8).tick(1.0, t, [b]).placements == ()  # 850 >= 800
    assert len(policy(lambda_min=0.9).tick(1.0, t, [b]).placements) == 1


def test_an_empty_backend_accepts_a_program_larger_than_its_pool():
    t = ProgramTable()
    b = backend("b", 1000)
    new(t, "huge", 5000)
    d = policy().tick(0.0, t, [b])
    assert [p.program_id for p in d.placements] == ["huge"]


def test_hbm_condition_gates_held_requests_in_tier_aware_mode_only():
    t = ProgramTable()
    b = backend("b", 1000, host=4000, inclusive=False)  # pool 5000, HBM 1000
    active(t, "r", b, 700, reasoning=True)              # reasoning KV 700 + 1 expected output
    paused(t, "p", b, 300, held=1)
    assert policy(hbm_lambda=1.0).tick(1.0, t, [b]).placements == ()  # 701 + 301 > 1000 HBM (pool 5000 has room)
    # The paper variant sees only HBM as the pool (700 + 300 <= 1000) and no gate.
    assert len(policy(tier_aware=False).tick(1.0, t, [b]).placements) == 1


def test_the_admission_level_raises_the_hbm_condition_by_its_hbm_extra():
    """goodput admits programs beyond the pool to run best-effort: their requests go to the
    engine (whose scheduler queues what its KV cannot hold) instead of waiting at the router.
    The previous rule (occupancy) keeps the condition at hbm_lambda·HBM."""
    from thunder_sgl.scheduler.gate import RequestGate
    from thunder_sgl.scheduler.goodput import AdmissionState
    from thunder_sgl.scheduler.occupancy import OccupancyState

    pol = policy(hbm_lambda=1.0)
    for state, placed in ((None, 0), (OccupancyState(extra=500.0), 0), (AdmissionState(extra=500.0), 1)):
        t = ProgramTable()
        b = backend("b", 1000, host=4000, inclusive=False)  # pool 5000, HBM 1000
        b.admission = state
        r = active(t, "r", b, 700, reasoning=True)
        p = paused(t, "p", b, 300, held=1)
        # the restore of a held request (the tick) and one request of an active program (the gate)
        assert len(pol.tick(1.0, t, [b]).placements) == placed, state
        assert RequestGate(pol.cfg).admits(p, 300, b, [r]) is bool(placed), state


def test_head_of_line_reservation_stops_placements_behind_a_long_waiter():
    t = ProgramTable()
    b = backend("b", 1000)
    active(t, "x", b, 600, reasoning=True)
    paused(t, "big", b, 500, since=0.0, held=1)      # does not fit (600 + 500 > 1000)
    paused(t, "small", b, 100, since=50.0, held=1)   # would fit
    assert [p.program_id for p in policy().tick(55.0, t, [b]).placements] == ["small"]
    d = policy().tick(61.0, t, [b])                  # big has waited 61 s >= 60 s
    assert d.placements == () and d.reserved_for == "big"


def test_a_long_waiter_held_back_only_by_the_hbm_condition_is_placed_by_the_pool_alone():
    """Reserving would not help it: the placed programs' requests keep taking the HBM room as it
    frees. Past ``reserve_after_seconds`` it is placed where the pool has room, ahead of what
    waited less, and its request waits at that backend's gate first in line (a request held
    that long makes newer ones wait behind it: ``scheduler.gate``)."""
    t = ProgramTable()
    b = backend("b", 1000, host=4000, inclusive=False)  # pool 5000, HBM 1000
    active(t, "r", b, 700, reasoning=True)               # reasoning KV 701
    paused(t, "big", b, 400, since=0.0, held=1)          # pool has room, HBM does not (701 + 401 > 1000)
    paused(t, "small", b, 100, since=50.0)               # idle: not gated, fits
    assert [p.program_id for p in policy(hbm_lambda=1.0).tick(55.0, t, [b]).placements] == ["small"]
    d = policy(hbm_lambda=1.0).tick(61.0, t, [b])
    assert [p.program_id for p in d.placements] == ["big", "small"] and d.reserved_for is None


def test_a_long_waiter_that_no_pool_has_room_for_still_reserves():
    t = ProgramTable()
    b = backend("b", 1000, host=1000, inclusive=False)   # pool 2000, HBM 1000
    active(t, "r", b, 1500, reasoning=True)
    paused(t, "big", b, 800, since=0.0, held=1)          # 1501 + 801 > 2000: the pool has no room
    paused(t, "small", b, 100, since=50.0)
    d = policy(hbm_lambda=1.0).tick(61.0, t, [b])
    assert d.placements == () and d.reserved_for == "big"


def test_placements_backfill_past_a_held_program_the_shrunken_hbm_room_no_longer_takes():
    t = ProgramTable()
    b = backend("b", 1000, host=4000, inclusive=False)  # pool 5000, HBM 1000
    active(t, "r", b, 300, reasoning=True)               # reasoning KV 301
    paused(t, "h1", b, 500, since=0.0, held=1)           # 301 + 501 <= 1000: placed
    paused(t, "h2", b, 300, since=1.0, held=1)           # 802 + 301 > 1000 now: skipped
    paused(t, "i", b, 200, since=2.0)                    # idle: placed behind it
    d = policy(hbm_lambda=1.0).tick(10.0, t, [b])
    assert [p.program_id for p in d.placements] == ["h1", "i"] and d.reserved_for is None


@pytest.mark.parametrize("long_waiter", [False, True])
def test_a_long_run_of_programs_that_no_longer_fit_is_skipped_without_losing_order(long_waiter):
    """Hundreds of held programs stop fitting the HBM room once h1 is placed: the queue walk
    drops them in bulk, and still places what fits behind them, or stops at a long waiter."""
    t = ProgramTable()
    b = backend("b", 1000, host=4000, inclusive=False)  # pool 5000, HBM 1000
    active(t, "r", b, 300, reasoning=True)               # reasoning KV 301
    paused(t, "h1", b, 500, since=0.0, held=1)           # 301 + 501 <= 1000: placed first
    for i in range(400):                                 # 802 + 301 > 1000 afterwards; waited < 60 s
        paused(t, f"h2-{i:03d}", b, 300, since=45.0 + 0.01 * i, held=1)
    if long_waiter:                                      # idle, waited 80 s, larger than the room left
        paused(t, "old", b, 4500, since=20.0)
    paused(t, "i", b, 200, since=21.0)                   # idle, fits
    d = policy(hbm_lambda=1.0).tick(100.0, t, [b])
    if long_waiter:
        assert [p.program_id for p in d.placements] == ["h1"] and d.reserved_for == "old"
    else:
        assert [p.program_id for p in d.placements] == ["h1", "i"] and d.reserved_for is None


def test_backend_reporting_queueing_or_retraction_gets_no_restores():
    t = ProgramTable()
    b = backend("b", 1000)
    paused(t, "p", b, 100, held=1)
    b.live.retracted_reqs = 2
    assert policy().tick(1.0, t, [b]).placements == ()
    b.live.retracted_reqs, b.live.waiting_reqs = 0, CFG.pressure_waiting_reqs + 1
    assert policy().tick(1.0, t, [b]).placements == ()


def test_a_backend_serving_an_open_stream_takes_programs_whatever_its_engine_queues():
    """``BackendLoad.request_level`` (the goodput rule on an open stream):
    placements ignore the engine's own queue, as request-level routing does; other backends
    under pressure still take none."""
    from thunder_sgl.scheduler.placement import open_backends

    b = backend("b", 1000)
    b.live.waiting_reqs = CFG.pressure_waiting_reqs + 1
    ld = BackendLoad.for_backend(b, CFG)
    assert open_backends({"b": ld}, 1.0, 10.0, CFG) == {}
    ld.request_level = True
    assert open_backends({"b": ld}, 1.0, 10.0, CFG) == {"b": ld}


def test_stale_monitored_backend_counts_as_full():
    t = ProgramTable()
    b = backend("b", 1000)
    b.monitored = True
    b.live.updated_at = 0.0
    active(t, "idle", b, 100)
    new(t, "n", 100)
    d = ThunderScheduler(policy().cfg, stale_after=10.0).tick(11.0, t, [b])
    assert d.pauses == ("idle",) and d.placements == ()


# ---- apply ---------------------------------------------------------------------------------
def test_apply_skips_programs_that_changed_since_the_tick():
    t = ProgramTable()
    b = backend("b", 1000)
    p = active(t, "p", b, 600)
    active(t, "q", b, 600)
    d = policy().tick(0.0, t, [b])
    assert d.pauses == ("p",)
    p.start_request(0.1, 700)            # the program's next request arrived in between
    paused_now, _ = apply(d, t, 0.2)
    assert paused_now == [] and p.active


def test_tick_demand_matches_an_independent_reference():
    t = ProgramTable()
    b = backend("b", 100_000)
    for i in range(20):
        active(t, f"p{i}", b, 1000 + 137 * i, acting_since=-3.0 * i,
               reasoning=i % 3 == 0, prefix=("sys", 300) if i % 2 else None)
    d = policy().tick(7.0, t, [b])
    assert d.demand[b.key] == pytest.approx(naive_demand(t, b, 7.0, 5.0, 2.0, 64))


# ---- stateless fallback --------------------------------------------------------------------
def test_stateless_requests_go_to_the_least_loaded_available_backend():
    a, b, c = backend("a", 1000), backend("b", 1000), backend("c", 1000)
    a.inflight, b.inflight, c.inflight = 3, 1, 0
    c.healthy = False
    assert least_loaded([a, b, c], 0.0, 10.0) is b
    b.live.waiting_reqs = 5
    assert least_loaded([a, b, c], 0.0, 10.0) is a
    assert least_loaded([c], 0.0, 10.0) is None


def test_a_program_known_only_by_its_sandbox_is_not_admitted_before_its_first_request():
    t = ProgramTable()
    b = backend("b", 1000)
    t.create("sandbox-first", 0.0)               # no request yet: no size, nothing to run
    assert policy().tick(1.0, t, [b]).placements == ()
    t.get("sandbox-first").hold(2.0, 300)        # its first request arrives
    assert [p.program_id for p in policy().tick(2.0, t, [b]).placements] == ["sandbox-first"]
