"""The previous default admission rule (scheduler/occupancy.py, ``admission.mode: occupancy``):
a controller on engine occupancy."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_scenarios import active, backend, paused

from thunder_sgl.config import AdmissionConfig, SchedulerConfig
from thunder_sgl.programs import ProgramTable
from thunder_sgl.scheduler import ThunderScheduler
from thunder_sgl.scheduler.goodput import BackendView
from thunder_sgl.scheduler.occupancy import OccupancyState as AdmissionState
from thunder_sgl.scheduler.occupancy import update

CFG = SchedulerConfig(admission=AdmissionConfig(mode="occupancy", max_overcommit=1.0))
A = CFG.admission
POOL = 100_000.0


def view(occupied_pool: bool = True, waiting: bool = True, mean: float = 5000.0) -> BackendView:
    lo = CFG.lambda_min * POOL
    return BackendView(pool=POOL, fit_limit=CFG.lambda_max * POOL, demand=lo + 1 if occupied_pool else lo - 10_000,
                       shared=0.0, active=10, context=mean, output=256.0, supply=11 if waiting else 10, limit_lo=lo,
                       mean_tokens=mean)


def period(b, st: AdmissionState, occupancy: float, now: float, steps: int = 10, busy_per_step: float = 1.0,
           prefill_s_per_token: float = 1e-4, cfg: SchedulerConfig = CFG, v: BackendView | None = None) -> AdmissionState:
    """Advance the backend's counters by one period of ``cfg.tick_seconds`` and update."""
    dt = cfg.tick_seconds
    b.served.occupied_s += occupancy * dt
    b.served.steps += steps
    b.live.reports_busy = True
    b.live.engine_busy_s_total += busy_per_step * steps
    b.live.prefill_tokens_total += 10_000
    b.live.prefill_busy_s_total += 10_000 * prefill_s_per_token
    return update(st, b, v or view(), now + dt, cfg)


def started(b, cfg: SchedulerConfig = CFG) -> AdmissionState:
    b.served.request_s, b.served.tool_s = 4.0, 6.0
    return update(None, b, view(), 0.0, cfg)


def test_fixed_admission_never_goes_beyond_the_watermarks():
    cfg = dataclasses.replace(CFG, admission="fixed")
    b = backend("a", int(POOL))
    t = ProgramTable()
    for i in range(10):
        active(t, f"p{i}", b, 10_000)
    paused(t, "w", b, 5_000, since=-100.0, held=1)
    sched = ThunderScheduler(cfg)
    for i in range(10):
        b.served.occupied_s += 0.2 * cfg.tick_seconds
        d = sched.tick(i * cfg.tick_seconds, t, [b])
        assert d.admission == {}  # no rule runs: the watermarks alone
    assert b.admission is None


def test_an_idle_engine_with_programs_waiting_admits_what_fills_the_idle_time():
    b = backend("a", int(POOL))
    st = started(b)
    st = period(b, st, 0.55, 0.0)
    # w = 1 s per step + 5,000 tokens × 0.1 ms = 1.5 s; cycle 10 s; idle to fill 0.95 − 0.55
    expected = 1.0 * (0.95 - 0.55) * 10.0 / 1.5 * 5000.0
    assert st.extra == pytest.approx(min(expected, A.max_step * POOL))
    assert st.occupancy == pytest.approx(0.55) and st.step_s == pytest.approx(1.0) and st.token_s == pytest.approx(1e-4)


@pytest.mark.parametrize(("why", "v"), [
    ("nothing waits", view(waiting=False)),
    ("the pool limit does not bind", view(occupied_pool=False)),
])
def test_no_increase_when_more_admission_would_not_run_anything(why, v):
    b = backend("a", int(POOL))
    st = started(b)
    st = period(b, st, 0.3, 0.0, v=v)
    assert st.extra == 0.0, why


def test_a_saturated_engine_gives_back_extra_admission_multiplicatively():
    b = backend("a", int(POOL))
    st = dataclasses.replace(started(b), extra=40_000.0)
    st = period(b, st, 1.0, 0.0)
    assert st.extra == pytest.approx(40_000.0 * (1 - A.decrease))
    for i in range(30):
        st = period(b, st, 1.0, (i + 1) * CFG.tick_seconds)
    assert 0.0 <= st.extra < 100


def test_within_the_deadband_nothing_moves():
    b = backend("a", int(POOL))
    st = dataclasses.replace(started(b), extra=12_345.0)
    for i, occ in enumerate((0.93, 0.97, 0.95, 0.94, 0.96)):
        st = period(b, st, occ, i * CFG.tick_seconds)
        assert st.extra == 12_345.0


def test_no_update_before_a_whole_period():
    b = backend("a", int(POOL))
    st = started(b)
    b.served.occupied_s += 0.0
    assert update(st, b, view(), CFG.tick_seconds / 2, CFG) is st


@settings(max_examples=200, deadline=None)
@given(occs=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=40),
       busy=st.floats(0.01, 20.0), tok=st.floats(0.0, 1e-2), mean=st.floats(100.0, 50_000.0))
def test_extra_stays_within_bounds_and_moves_at_most_one_step_per_period(occs, busy, tok, mean):
    b = backend("a", int(POOL))
    st = started(b)
    v = view(mean=mean)
    for i, occ in enumerate(occs):
        before = st.extra
        st = period(b, st, occ, i * CFG.tick_seconds, busy_per_step=busy, prefill_s_per_token=tok, v=v)
        assert 0.0 <= st.extra <= A.max_overcommit * POOL
        assert st.extra - before <= A.max_step * POOL + 1e-6


@settings(max_examples=100, deadline=None)
@given(occ=st.floats(0.0, 1.0), n=st.integers(2, 30), start=st.floats(0.0, POOL))
def test_under_a_steady_load_extra_moves_one_way_only(occ, n, start):
    """No oscillation: with the same occupancy every period, extra is monotone."""
    b = backend("a", int(POOL))
    st = dataclasses.replace(started(b), extra=start)
    seen = [st.extra]
    for i in range(n):
        st = period(b, st, occ, i * CFG.tick_seconds)
        seen.append(st.extra)
    diffs = [y - x for x, y in zip(seen, seen[1:], strict=False)]
    assert all(d >= -1e-9 for d in diffs) or all(d <= 1e-9 for d in diffs)


def test_the_tick_applies_the_extra_and_pauses_only_the_excess_over_it():
    """With extra admission 20 K on a 100 K pool, 105 K of acting demand is within the high
    watermark (95 K + 20 K): nothing is paused; at 125 K exactly the excess over 115 K is."""
    b = backend("a", 100_000)
    b.admission = AdmissionState(extra=20_000.0, at=0.0)
    t = ProgramTable()
    for i in range(7):
        active(t, f"p{i}", b, 15_000)
    d = ThunderScheduler(CFG).tick(1.0, t, [b])
    assert d.pauses == () and d.admission[b.key].extra == 20_000.0
    for i in range(7, 8):
        active(t, f"p{i}", b, 20_000)  # 125 K
    d = ThunderScheduler(CFG).tick(1.0, t, [b])
    freed = sum(t.get(pid).context_tokens for pid in d.pauses)
    assert 125_000 - freed <= 115_000 < 125_000 - freed + min(t.get(pid).context_tokens for pid in d.pauses)


def test_programs_beyond_what_fits_are_overcommitted_and_lose_their_kv_reference():
    b = backend("a", 100_000)
    b.admission = AdmissionState(extra=30_000.0, at=0.0)
    t = ProgramTable()
    sizes = [16_000, 16_000, 16_000, 10_000, 16_000, 12_000, 16_000]
    for i, c in enumerate(sizes):
        active(t, f"p{i}", b, c)
    d = ThunderScheduler(CFG).tick(0.0, t, [b])
    # 102 K of demand, 95 K fits: the 7 K beyond go, in pause order, to the shortest context
    assert d.pauses == ()
    assert d.unref == frozenset({"p3"})
    b.admission = AdmissionState(extra=0.0, at=0.0)
    for i in range(7, 9):
        active(t, f"p{i}", b, 1_000)
    d = ThunderScheduler(CFG).tick(0.0, t, [b])
    assert d.unref == frozenset()  # no extra admission: everything on the backend fits or is paused


def test_a_restored_program_is_placed_against_the_extra_admission():
    b = backend("a", 100_000)
    b.admission = AdmissionState(extra=30_000.0, at=0.0)
    t = ProgramTable()
    for i in range(5):
        active(t, f"p{i}", b, 18_000)  # 90 K: over λ_min·pool (85 K), under 85 K + 30 K
    paused(t, "w", b, 20_000, since=-100.0, held=1)
    d = ThunderScheduler(CFG).tick(0.0, t, [b])
    assert [pl.program_id for pl in d.placements] == ["w"]
    d2 = ThunderScheduler(dataclasses.replace(CFG, admission="fixed")).tick(0.0, t, [b])
    assert d2.placements == ()
