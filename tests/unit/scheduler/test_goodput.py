"""Admission from goodput (scheduler/goodput.py): the engine fit, the loop model, the choice of
level, and the measurement guard, driven by a synthetic backend whose counters follow a known
engine."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_scenarios import active, backend, new, place_all_within_bound

from thunder_sgl.backends import Backend, Tiers
from thunder_sgl.config import AdmissionConfig, SchedulerConfig
from thunder_sgl.programs import ProgramTable
from thunder_sgl.scheduler import ThunderScheduler
from thunder_sgl.scheduler.goodput import (
    SLACK_BUSY,
    AdmissionState,
    BackendView,
    DecodeFit,
    Engine,
    Loop,
    PrefillFit,
    _calibration,
    _choices,
    _slack,
    predict,
    update,
)
from thunder_sgl.scheduler.grouping import GroupPicker

CFG = SchedulerConfig()
AC = CFG.admission
POOL = 24_576
SHARED = 1_200.0
CONTEXT = 4_000.0

# A CPU-like engine: a step costs mostly the same whatever is cached, recompute is cheap,
# decode batches well: running more programs than fit pays.
CPU = Engine(d0=0.010, d1=0.004, a=0.15, b=3e-5)
# An engine whose batch gains nothing: each request costs the same alone or batched, and a
# recomputed token costs what a new one does; its requests (16 tokens × 0.2 s) outlast the
# tool calls, so the programs that fit keep it busy. (An engine left idle gains from more
# programs even without batching: that is not this case.)
SERIAL = Engine(d0=0.0, d1=0.2, a=0.0, b=4e-4)


def loop(refs: bool = True) -> Loop:
    return Loop(tool_s=3.0, context=CONTEXT, shared=SHARED, output=16.0, new_tokens=300.0, hbm=POOL,
                cache=POOL, refs=refs)


class Synthetic:
    """A backend whose engine counters and completed steps follow ``truth`` at whatever level
    the rule chose: each period, steps = rate × dt (Poisson when ``noise``), tokens and busy
    seconds from the engine ``e`` at that level's batch."""

    def __init__(self, truth: Engine, supply: int = 24, noise: bool = True, seed: int = 0,
                 rate: object = None, reports_busy: bool = False, cfg: SchedulerConfig = CFG,
                 steps_per_program: float | None = None) -> None:
        self.truth, self.supply, self.noise, self.cfg = truth, supply, noise, cfg
        self.steps_per_program = steps_per_program
        """When set, programs end after this many steps on average (``Served.ended``)."""
        self.ended_f = 0.0
        self.rng = random.Random(seed)
        self.rate = rate
        self.b = Backend("http://syn", 0, Tiers(hbm_tokens=POOL), session_refs=True)
        self.b.served.tool_s = 3.0
        self.b.live.reports_busy = reports_busy  # else the rule reads the engine as always busy
        self.st: AdmissionState | None = None
        self.now = 0.0
        self.steps_f = 0.0
        self.moments = [0.0] * 5
        self.history: list[AdmissionState] = []

    def n_of(self, st: AdmissionState | None) -> float:
        return st.n if st is not None and st.n > 0 else (0.95 * POOL - SHARED) / CONTEXT

    def view(self, n: float) -> BackendView:
        active_n = max(1, int(round(min(n, self.supply))))
        return BackendView(pool=float(POOL), fit_limit=0.95 * POOL, demand=SHARED + active_n * CONTEXT, shared=SHARED,
                           active=active_n, context=CONTEXT, output=16.0, supply=self.supply)

    def period(self) -> AdmissionState:
        dt = CFG.tick_seconds
        n = self.n_of(self.st)
        k = self.st.k if self.st is not None and self.st.n > 0 else n
        p = predict(n, k, self.truth, loop())
        rate = p.rate if self.rate is None else self.rate(self.st.level if self.st else 0, p.rate)  # type: ignore[operator]
        mean = rate * dt
        steps = self._poisson(mean) if self.noise else mean
        self.steps_f += steps
        s = self.b.served
        whole = int(self.steps_f) - s.steps
        s.steps += whole
        s.new_tokens += int(whole * 300)
        s.output_tokens += int(whole * 16)
        if self.steps_per_program:
            self.ended_f += whole / self.steps_per_program
            ended = int(self.ended_f) - s.ended
            s.ended += ended
            s.ended_steps = int(round(s.ended * self.steps_per_program))
        jitter = self.rng.uniform(0.6, 1.4) if self.noise else 1.0 + 0.3 * math.sin(self.now)
        tokens = whole * p.uncached * jitter
        lv = self.b.live
        lv.prefill_tokens_total += int(tokens)
        lv.prefill_busy_s_total += self.truth.a * whole + self.truth.b * tokens
        for bb in (max(1.0, p.batch * 0.7), max(1.0, p.batch * 1.3)):  # two halves: the slope is seen
            iters = whole * 16 / 2 / bb
            t = self.truth.d0 + self.truth.d1 * bb
            for i, x in enumerate((iters, iters * bb, iters * t, iters * bb * bb, iters * bb * t)):
                self.moments[i] += x
        lv.decode_moments = tuple(self.moments)
        self.now += dt
        self.st = update(self.st, self.b, self.view(n), self.now, self.cfg)
        self.history.append(self.st)
        return self.st

    def _poisson(self, mean: float) -> float:
        # normal approximation: enough for counts of tens
        return max(0.0, self.rng.gauss(mean, math.sqrt(max(mean, 1e-9))))

    def run(self, periods: int) -> list[AdmissionState]:
        self.st = update(None, self.b, self.view(self.n_of(None)), 0.0, self.cfg)
        for _ in range(periods):
            self.period()
        return self.history


def settled_levels(history: list[AdmissionState]) -> list[int]:
    """The level outside probes (what the rule chose, not what it was measuring)."""
    return [h.level for h in history if h.probe == 0]


# ---- the pieces -------------------------------------------------------------------------
def test_the_decode_fit_recovers_a_line_from_moments():
    f = DecodeFit()
    for b, n in ((2.0, 100.0), (6.0, 50.0), (10.0, 20.0)):
        t = 0.01 + 0.004 * b
        f = f.add((n, n * b, n * t, n * b * b, n * b * t), 1.0)
    d0, d1 = f.line()
    assert d0 == pytest.approx(0.01) and d1 == pytest.approx(0.004)


def test_the_prefill_fit_tells_per_step_from_per_token_costs_once_they_vary():
    f = PrefillFit()
    f = f.add(10, 3000, 10 * 0.4 + 3000 * 3e-5, 1.0)
    assert f.coefficients() == (0.0, pytest.approx((10 * 0.4 + 3000 * 3e-5) / 3000))  # one block: all per token
    f = f.add(10, 30_000, 10 * 0.4 + 30_000 * 3e-5, 1.0)
    a, b = f.coefficients()
    assert a == pytest.approx(0.4) and b == pytest.approx(3e-5)


def test_the_loop_model_sees_an_idle_engine_fill_and_then_saturate():
    lp = loop()
    rates = [predict(n, min(n, 5.0), CPU, lp).rate for n in (1, 3, 5, 8, 24)]
    assert rates[0] < rates[1] < rates[2]  # more programs fill the idle engine
    # no model runs beyond what the engine does alone at its largest batch
    assert max(rates) <= 1.0 / CPU.a + 1e-9


def test_with_no_batching_gain_more_programs_only_add_recompute():
    lp = loop()
    r = [predict(n, min(n, 5.0), SERIAL, lp).rate for n in (5, 8, 12, 24)]
    assert r == sorted(r, reverse=True)


# ---- the rule ---------------------------------------------------------------------------
def test_fixed_mode_keeps_no_state_and_the_tick_no_extra():
    cfg = dataclasses.replace(CFG, admission=AdmissionConfig(mode="fixed"))
    b = backend("a", POOL)
    t = ProgramTable()
    for i in range(5):
        active(t, f"p{i}", b, 5_000)
    b.admission = AdmissionState(extra=30_000.0, at=0.0)
    d = ThunderScheduler(cfg).tick(10.0, t, [b])
    assert d.admission == {} and d.unref == frozenset()


def test_on_a_cpu_like_engine_the_rule_admits_more_than_fits():
    syn = Synthetic(CPU, noise=False)
    hist = syn.run(60)
    assert hist[-1].level > 0 and hist[-1].n > 1.5 * syn.n_of(None)
    assert hist[-1].engine is not None and hist[-1].engine.a == pytest.approx(CPU.a, rel=0.05)


def test_on_an_engine_whose_batch_gains_nothing_it_is_the_fixed_watermarks():
    syn = Synthetic(SERIAL, noise=False)
    hist = syn.run(200)
    assert all(h.model_level == 0 for h in hist)
    assert settled_levels(hist) == [0] * len(settled_levels(hist))
    # probes up lose, and each loss doubles the wait: the rule spends little time off level 0
    off = sum(1 for h in hist if h.level != 0)
    assert off <= 0.25 * len(hist)
    assert all(h.extra == 0.0 for h in hist if h.level == 0)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_under_a_steady_load_it_converges_and_does_not_oscillate(seed):
    syn = Synthetic(CPU, noise=True, seed=seed)
    hist = syn.run(240)
    late = settled_levels(hist[120:])
    # once settled, no flip-flop: the chosen level may keep moving one way (probes that win
    # walk it towards what measurement prefers) but turns back at most twice (a probe that won
    # by chance, then one that corrects it)
    moves = [y - x for x, y in zip(late, late[1:], strict=False) if x != y]
    reversals = sum(1 for a, b in zip(moves, moves[1:], strict=False) if (a > 0) != (b > 0))
    assert reversals <= 2, late
    # and it is near the best the truth allows
    best = max(predict(n, min(n, 5.0), CPU, loop()).rate for n in range(1, 25))
    chosen = [h for h in hist if h.probe == 0][-1]  # what it holds, not a probe under way
    assert predict(chosen.n, chosen.k, CPU, loop()).rate >= 0.8 * best


UNCALIBRATED = dataclasses.replace(CFG, admission=dataclasses.replace(AC, calibrate=False))


def thrashing(level: int, r: float) -> float:
    """The steps measured fall with every level above the watermarks: a thrashing engine."""
    return r if level == 0 else r * (0.7 ** level)


def test_a_wrong_prediction_is_corrected_by_measurement():
    """The counters say a CPU-like engine (more programs pay), but the steps measured fall with
    every level above the watermarks (a thrashing engine). With the calibration off, probes
    down walk the bias to its bound, the next winning one caps the level (a fallback), and the
    cap holds most of the time (it expires after MAX_BACKOFF probe cycles, and the next probe
    down sets it again)."""
    syn = Synthetic(CPU, noise=False, rate=thrashing, cfg=UNCALIBRATED)
    hist = syn.run(300)
    assert hist[-1].fallbacks > 0 and hist[-1].bias == -AC.max_bias
    late = settled_levels(hist[150:])
    assert late.count(0) >= 0.6 * len(late)


def test_the_calibration_rates_each_arm_as_it_ran():
    """The same thrashing engine with the calibration on (the default): each visit above the
    watermarks measures below what the model gave it, the levels above are rated as they ran
    (their arm's factor well below level 0's), the choice stays at level 0 most of the time,
    and over three runs the loop runs more steps than with the model's predictions corrected
    by probes alone (one of the three runs fewer: evidence fades over the fit's half-life and
    the model tries the levels above again)."""
    cal_steps = plain_steps = 0.0
    for noise, seed in ((False, 0), (True, 3), (True, 7)):
        cal = Synthetic(CPU, noise=noise, seed=seed, rate=thrashing)
        hist = cal.run(300)
        plain = Synthetic(CPU, noise=noise, seed=seed, rate=thrashing, cfg=UNCALIBRATED)
        plain.run(300)
        cal_steps, plain_steps = cal_steps + cal.steps_f, plain_steps + plain.steps_f
        late = settled_levels(hist[100:])
        assert late.count(0) >= 0.8 * len(late)
        f0, f1 = hist[-1].factors
        assert f1 < 0.7 * f0
        assert hist[-1].view()["calibration_above"] == round(f1, 3)
    assert cal_steps > 1.1 * plain_steps


@pytest.mark.parametrize("worse", [0.6, 0.8])
def test_where_the_levels_above_run_below_their_prediction_but_still_win_they_are_kept(worse):
    """Calibration corrects how much the levels above pay, not whether: on the CPU-like truth
    whose levels above the watermarks run at 0.6-0.8 of the model's prediction and still beat
    level 0, the rule leaves level 0 as the uncalibrated rule does and runs as many steps;
    where the model is right it changes nothing at all."""
    def below(level: int, r: float) -> float:
        return r if level == 0 else worse * r

    for seed in (11, 12):
        cal = Synthetic(CPU, noise=True, seed=seed, rate=below)
        hist = cal.run(300)
        plain = Synthetic(CPU, noise=True, seed=seed, rate=below, cfg=UNCALIBRATED)
        plain.run(300)
        assert cal.steps_f == pytest.approx(plain.steps_f, rel=0.01)
        assert settled_levels(hist[100:]).count(0) == 0
    right = Synthetic(CPU, noise=False).run(240)
    uncorrected = Synthetic(CPU, noise=False, cfg=UNCALIBRATED).run(240)
    assert settled_levels(right)[-60:] == settled_levels(uncorrected)[-60:]


def test_an_arm_not_measured_yet_takes_the_factor_of_the_one_that_was():
    """A model found optimistic at level 0 (measured 60 steps where it predicted 100) must not
    make the levels never run look better than it: the empty arm takes the other's factor, so
    the two are rated alike until it has steps of its own. Factors stay within [1/2, 2], and
    an arm with few steps stays near the other's factor."""
    measured_low = (60.0, 50.0, 100.0)
    empty = (0.0, 0.0, 0.0)
    f0, f1 = _calibration(measured_low, empty, AC), _calibration(empty, measured_low, AC)
    assert f0 == pytest.approx(f1) and f0 < 0.7
    assert _calibration((1_000.0, 1.0, 10.0), empty, AC) == 2.0
    assert _calibration((0.0, 10.0, 1_000.0), empty, AC) == 0.5
    few = _calibration((1.0, 5.0, 4.0), (400.0, 100.0, 400.0), AC)  # 1 step of 4 predicted, beside a true model
    assert 0.75 < few < 1.0
    assert _calibration(empty, empty, AC) == 1.0


@settings(max_examples=150, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 40_000), st.floats(0.0, 20.0),
                                st.integers(0, 400), st.floats(1.0, 64.0)), min_size=1, max_size=40),
       supply=st.integers(1, 200), active_n=st.integers(1, 50), tool=st.floats(0.0, 60.0))
def test_state_stays_within_its_bounds_whatever_the_counters(steps, supply, active_n, tool):
    b = Backend("http://x", 0, Tiers(hbm_tokens=POOL), session_refs=True)
    b.served.tool_s = tool
    v = BackendView(pool=float(POOL), fit_limit=0.95 * POOL, demand=0.95 * POOL, shared=SHARED, active=active_n,
                    context=CONTEXT, output=16.0, supply=max(supply, active_n))
    s = update(None, b, v, 0.0, CFG)
    m = [0.0] * 5
    for i, (ds, dtok, dbusy, iters, batch) in enumerate(steps):
        b.served.steps += ds
        b.live.prefill_tokens_total += dtok
        b.live.prefill_busy_s_total += dbusy
        m = [m[0] + iters, m[1] + iters * batch, m[2] + iters * 0.02, m[3] + iters * batch * batch, m[4] + iters * batch * 0.02]
        b.live.decode_moments = tuple(m)
        s = update(s, b, v, (i + 1) * CFG.tick_seconds, CFG)
        assert 0 <= s.level <= AC.levels and abs(s.bias) <= AC.max_bias
        assert 0.0 <= s.extra <= AC.max_overcommit * POOL + 1e-6
        assert s.protect == math.inf or 0.0 <= s.protect <= POOL
        assert s.predicted >= 0.0 and s.measured >= 0.0


def test_no_update_before_a_whole_period():
    syn = Synthetic(CPU)
    s = update(None, syn.b, syn.view(5.0), 0.0, CFG)
    assert update(s, syn.b, syn.view(5.0), CFG.tick_seconds / 2, CFG) is s


def test_an_engine_restart_does_not_feed_negative_counters_to_the_fit():
    syn = Synthetic(CPU, noise=False)
    syn.run(20)
    before = syn.st
    syn.b.live.prefill_tokens_total = 0
    syn.b.live.prefill_busy_s_total = 0.0
    syn.b.live.decode_moments = (0.0,) * 5
    syn.now += CFG.tick_seconds
    after = update(syn.st, syn.b, syn.view(5.0), syn.now, CFG)
    assert after.pre == before.pre and after.dec == before.dec


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(500, 9_000), min_size=3, max_size=30), level=st.integers(0, 12),
       free_every=st.integers(1, 4))
def test_waits_stay_bounded_at_any_admission_level(sizes, level, free_every):
    """Whatever level the rule holds (frozen here), every waiting program is placed within the
    bound that aging and head-of-line reservation give at the fixed watermarks."""
    cfg = SchedulerConfig(default_output_tokens=1)
    b = backend("b", 20_000)
    table = ProgramTable()
    pol = ThunderScheduler(cfg, picker=GroupPicker())
    extra = level / AC.levels * AC.max_overcommit * 20_000
    for i, c in enumerate(sizes):
        new(table, f"w{i}", c, since=0.0)

    def frozen(now: float) -> None:
        b.admission = AdmissionState(extra=extra, at=math.inf, level=level)  # frozen: no update

    place_all_within_bound(table, pol, b, len(sizes), free_every, cfg, frozen)


def test_the_view_names_what_operators_read():
    syn = Synthetic(CPU, noise=False)
    syn.run(30)
    v = syn.st.view()
    for k in ("level", "model_level", "bias", "extra_tokens", "programs", "protected_programs",
              "predicted_steps_per_s", "predicted_fixed_steps_per_s", "measured_steps_per_s", "probe", "engine"):
        assert k in v
    assert v["probe"] in ("none", "up", "down")


def test_a_saturated_engine_whose_counters_arrive_in_lumps_reads_busy():
    """Counters can reach the router in lumps (polled between the iterations of a long decode):
    here every third period carries three periods of busy time. The busy share is the average,
    not each period's share clipped at 1 (which read such an engine as a third idle and let
    probes up run on a saturated GPU)."""
    b = Backend("http://lumps", 0, Tiers(hbm_tokens=POOL), session_refs=True)
    b.live.reports_busy = True
    view = BackendView(pool=float(POOL), fit_limit=0.95 * POOL, demand=SHARED + 5 * CONTEXT, shared=SHARED,
                       active=5, context=CONTEXT, output=16.0, supply=24)
    dt = CFG.tick_seconds
    st_ = update(None, b, view, 0.0, CFG)
    for i in range(1, 200):
        if i % 3 == 0:
            b.live.prefill_busy_s_total += 3 * dt
        b.served.steps += 10
        st_ = update(st_, b, view, i * dt, CFG)
    assert 0.9 <= st_.busy <= 1.1


def test_probe_comparisons_allow_for_counts_that_vary_more_than_poisson():
    """The same two windows: with steps/period that stay near their mean (Poisson-like) the
    higher rate wins; with the same totals but counts that swing period to period (programs
    that start and end together), it does not."""
    from thunder_sgl.scheduler.goodput import _beats, _dispersion

    steady = AdmissionState(win_steps=400, win_n=20, win_sq=20 * 20.0 ** 2 + 20 * 20.0)  # mean 20, variance 20
    swinging = AdmissionState(win_steps=400, win_n=20, win_sq=10 * 5.0 ** 2 + 10 * 35.0 ** 2)  # 5 and 35
    assert _dispersion(steady) == pytest.approx(1.0, abs=0.1)
    assert _dispersion(swinging) > 10
    assert _beats(1.3, 520, 1.0, 400, 0.05, 1.5, _dispersion(steady))
    assert not _beats(1.3, 520, 1.0, 400, 0.05, 1.5, _dispersion(swinging))


def test_the_states_fast_copy_equals_dataclasses_replace():
    from thunder_sgl.scheduler.goodput import _with
    s = AdmissionState(extra=1.5, protect=7.0, level=3, bias=-1, smoothed=(1.0, 2.0), at=4.0, snap=(1.0,),
                       engine=CPU, block=(1.0, 2.0, 3.0), ceiling=2, confirm=True, n=3.5)
    for changes in ({}, {"at": 5.0}, {"level": 0, "win_steps": 0, "win_s": 0.0, "settle": 1},
                    {"dec": DecodeFit(), "pre": PrefillFit(), "engine": None, "protect": math.inf}):
        fast, slow = _with(s, **changes), dataclasses.replace(s, **changes)
        assert type(fast) is AdmissionState and fast == slow
        assert all(getattr(fast, f.name) is getattr(slow, f.name) for f in dataclasses.fields(AdmissionState))
    assert s == AdmissionState(extra=1.5, protect=7.0, level=3, bias=-1, smoothed=(1.0, 2.0), at=4.0, snap=(1.0,),
                               engine=CPU, block=(1.0, 2.0, 3.0), ceiling=2, confirm=True, n=3.5)  # not written
    with pytest.raises((AttributeError, TypeError)):
        _with(s, no_such_field=1)


def test_update_never_writes_the_state_it_is_given():
    """``update`` copies the state once a period and writes the period's steps into the copy
    (``_write``): the state it was given, kept by whoever holds it, is the same afterwards —
    through probes up and down, lost and won, and a fallback."""
    for syn in (Synthetic(CPU, noise=True, seed=5), Synthetic(CPU, noise=False, rate=thrashing, cfg=UNCALIBRATED),
                Synthetic(CPU, noise=True, seed=5, rate=thrashing)):
        syn.st = update(None, syn.b, syn.view(syn.n_of(None)), 0.0, syn.cfg)
        for _ in range(300):
            given = syn.st
            kept = dataclasses.replace(given)
            new = syn.period()
            assert new is not given or new.at == kept.at  # a new state, unless the period was not whole
            assert given == kept
            assert all(getattr(given, f.name) is getattr(kept, f.name) for f in dataclasses.fields(AdmissionState))
        if syn.cfg is UNCALIBRATED:
            assert syn.st.probes > 2 and syn.st.probes_won > 0 and syn.st.fallbacks > 0
        else:
            assert syn.st.probes + syn.st.changes > 2


def test_a_dip_of_the_busy_average_inside_a_busy_window_is_not_idle_time():
    """Probes up (``probe_up: idle``) need the engine idle both lately and over the window the
    probe would be compared with: a saturated engine whose average dips below the threshold for
    a moment (every admitted program in a tool at once) does not probe up; one idle over its
    window does."""
    from thunder_sgl.scheduler.goodput import _idle

    dip = AdmissionState(busy=0.85, win_busy=99.0, win_s=100.0)
    idle = AdmissionState(busy=0.85, win_busy=70.0, win_s=100.0)
    busy_lately = AdmissionState(busy=0.95, win_busy=70.0, win_s=100.0)
    assert not _idle(dip, AC)
    assert _idle(idle, AC)
    assert not _idle(busy_lately, AC)
    assert _idle(AdmissionState(busy=0.5), AC)  # no window yet: the average alone


def test_the_window_counts_the_engines_busy_seconds_and_a_level_change_restarts_it():
    syn = Synthetic(CPU, noise=False)
    hist = syn.run(40)
    for h in hist:
        assert 0.0 <= h.win_busy <= 1.5 * h.win_s + 1e-9
        if h.win_s == 0.0:
            assert h.win_busy == 0.0


def test_the_model_takes_a_new_choice_only_after_it_held_a_program_cycle():
    """A level acts only once its programs have run a whole cycle (tool + request): the model's
    choice follows a preference only after it held that long (at least ``MODEL_HOLD`` periods),
    so predictions that swing faster do not move the level back and forth."""
    from thunder_sgl.scheduler.goodput import MODEL_HOLD

    syn = Synthetic(CPU, noise=False)
    syn.b.served.tool_s = 60.0
    hist = syn.run(120)
    cycle = max(MODEL_HOLD, math.ceil((60.0 + syn.b.served.request_s) / CFG.tick_seconds))
    changes = [h for a, h in zip(hist, hist[1:], strict=False) if h.model_level != a.model_level]
    assert changes, "the CPU-like engine admits more than fits"
    assert all(h.model_streak >= cycle for h in changes)


def test_the_choice_leaves_level_0_at_min_gain_and_returns_only_below_half_of_it():
    """A band, not one threshold both ways: a smoothed gain hovering near ``min_gain`` must not
    flip the choice between level 0 and a high level every few periods."""
    from thunder_sgl.scheduler.goodput import _best

    g = AC.min_gain
    near = [1.0, 1.0, 1.0 + 0.8 * g]  # the top level 0.8·min_gain above level 0
    assert _best(near, g, 0) == 0  # not enough to leave level 0
    assert _best(near, g, 2) == 2  # but enough to stay
    below = [1.0, 1.0, 1.0 + 0.4 * g]
    assert _best(below, g, 2) == 0  # under half of it: back to the watermarks
    far = [1.0, 1.0, 1.0 + 2 * g]
    assert _best(far, g, 0) == 2
    assert _best([1.0, 1.0 + 2 * g, 1.0 + 4 * g], g, 1) == 2  # a better level beyond the band wins


def test_a_negative_bias_expires_a_level_at_a_time_and_a_positive_one_stays():
    """From below the model's choice a probe up may be unmeasurable or barred, so a probe down
    won once (in a transient, say) must not hold the level down for good: without a probe
    that moves it, a negative bias returns one level per ``MAX_BACKOFF`` probe intervals.
    A positive bias was confirmed by a fresh window and stays."""
    from thunder_sgl.scheduler.goodput import MAX_BACKOFF

    expiry = MAX_BACKOFF * AC.probe_every_periods
    for start, expect in ((-2, 0), (1, 1)):
        syn = Synthetic(CPU, noise=False)
        syn.run(30)
        syn.st = dataclasses.replace(syn.st, bias=start, bias_at=syn.now)
        t0 = syn.now
        hist = [syn.period() for _ in range(2 * expiry + 20)]
        biases = [h.bias for h in hist]
        if start < 0:
            # it stood a whole expiry interval, then moved up one level at a time
            assert biases[expiry - 2] == start
            assert biases[-1] == expect
            moves = [(a, h) for a, h in zip(hist, hist[1:], strict=False) if h.bias != a.bias]
            assert all(h.bias == a.bias + 1 and h.bias_at - t0 > expiry * CFG.tick_seconds - 1e-9 for a, h in moves)
        else:
            assert hist[-1].probes_won == hist[0].probes_won  # no probe moved it (the truth is the model)
            assert set(biases) == {start}


# ---- several backends ----------------------------------------------------------------------
def _two_backends_over_the_watermarks(extra: float) -> tuple[ThunderScheduler, ProgramTable, Backend, Backend]:
    """b0 runs 8 short programs, b1 two long ones; both held (frozen) at a level ``extra``
    tokens above the watermarks. By free pool b0 has more room than b1."""
    cfg = SchedulerConfig(default_output_tokens=1)
    b0, b1 = backend("b0", 20_000), backend("b1", 20_000)
    table = ProgramTable()
    for i in range(8):
        active(table, f"s{i}", b0, 500)
    for i in range(2):
        active(table, f"l{i}", b1, 9_000)
    for b in (b0, b1):
        b.admission = AdmissionState(extra=extra, at=math.inf, level=AC.levels)  # frozen: no update
    for i in range(4):
        new(table, f"n{i}", 300)
    return ThunderScheduler(cfg), table, b0, b1


def test_above_the_watermarks_each_backend_takes_its_share_of_the_programs():
    """Admitted beyond the watermarks, a backend takes programs only up to its share (by pool)
    of all the programs there are: with the free pool alone, the backend running more (short)
    programs had the more room and drew every new one (DES, two engines, cell
    ctx10-tool2-out16-x2: 32 programs on one engine, 9 on the other, the second idle 40% of
    the time). 14 programs on two equal backends: 7 each."""
    pol, table, b0, b1 = _two_backends_over_the_watermarks(extra=60_000.0)
    d = pol.tick(1.0, table, [b0, b1])
    assert sorted(pl.backend for pl in d.placements) == [b1.key] * 4
    # at the fixed watermarks (no extra) the share does not bind: the free pool decides
    pol, table, b0, b1 = _two_backends_over_the_watermarks(extra=0.0)
    d = pol.tick(1.0, table, [b0, b1])
    assert [pl.backend for pl in d.placements].count(b0.key) >= 1


def test_the_rule_sees_its_backends_share_of_the_supply():
    """The supply the rule plans for is the backend's share of every program there is (its
    own if more); with one backend, all of them."""
    cfg = SchedulerConfig(default_output_tokens=1)
    pol = ThunderScheduler(cfg)
    seen: dict[str, int] = {}
    orig = pol._view

    def spy(ld, supply):
        seen[ld.backend.key] = supply
        return orig(ld, supply)

    pol._view = spy  # type: ignore[method-assign]
    _, table, b0, b1 = _two_backends_over_the_watermarks(extra=0.0)
    for b in (b0, b1):
        b.admission = None
    pol.tick(1.0, table, [b0, b1])
    assert seen == {b0.key: 8, b1.key: 7}  # 14 programs: b0 keeps its 8, b1 may grow to 7
    seen.clear()
    table2 = ProgramTable()
    solo = backend("solo", 20_000)
    for i in range(3):
        active(table2, f"a{i}", solo, 1_000)
    for i in range(5):
        new(table2, f"w{i}", 300)
    pol.tick(1.0, table2, [solo])
    assert seen == {solo.key: 8}


def _view(n: int) -> BackendView:
    return BackendView(pool=float(POOL), fit_limit=0.95 * POOL, demand=SHARED + n * CONTEXT, shared=SHARED,
                       active=n, context=CONTEXT, output=16.0, supply=24)


def test_the_slack_is_the_cycle_time_the_model_does_not_see():
    lp, n, secs = loop(), 5, 600.0
    x = predict(n, n, CPU, lp).rate
    # the loop runs as the model says: nothing unseen
    assert _slack(CPU, lp, (x * secs, secs, n * secs), _view(n), 0.0) == pytest.approx(0.0, abs=0.05)
    # it runs 20% slower with the engine idle: the slack is the time each cycle lost, and the
    # model with it predicts the rate measured
    slow = 0.8 * x
    d = _slack(CPU, lp, (slow * secs, secs, n * secs), _view(n), 0.0)
    assert d > 0.3
    seen = dataclasses.replace(lp, slack=d)
    assert predict(n, n, CPU, seen).rate == pytest.approx(slow, rel=0.05)
    # it costs a level whose engine idles more than one that keeps it saturated
    many = 24
    assert predict(many, 5.0, CPU, seen).rate / predict(many, 5.0, CPU, lp).rate > 0.95 > 0.8 + 0.05
    # never more than the tool time, never negative
    assert _slack(CPU, lp, (0.01 * x * secs, secs, n * secs), _view(n), 0.0) == pytest.approx(lp.tool_s)
    assert _slack(CPU, lp, (2 * x * secs, secs, n * secs), _view(n), 0.0) == 0.0


def test_the_slack_is_read_only_while_the_engine_idles():
    """The same loop, 40% slower than the model says: read while the engine's counters show
    it idle, not where the engine is busy (here: an engine that reports no busy time, which
    the rule reads as always busy): there the gap is the engine's, not the loop's."""
    def slow(level: int, r: float) -> float:
        return 0.6 * r
    idle = Synthetic(CPU, noise=False, rate=slow, reports_busy=True).run(120)
    assert any(h.slack > 0.0 for h in idle)
    assert all(h.slack == 0.0 for h in idle if h.loop[0] < 2 * AC.probe_min_steps)  # not before enough steps
    busy = Synthetic(CPU, noise=False, rate=slow, reports_busy=False).run(120)
    assert all(h.busy >= SLACK_BUSY and h.slack == 0.0 for h in busy)


def test_programs_likely_ended_are_counted_out_of_the_programs_that_cycle():
    """``BackendView.ended`` (Σ ``Program.ended_p``: admitted inferred programs whose clients
    have been silent for long): the tick passes it on; each level keeps its places (its n) but
    is predicted with that many fewer programs cycling; the measured loop counts program-seconds
    of the others only. (Counted as cycling, the ended agents made the loop look slower than it
    ran, and the fixed watermarks, some of whose places they held, as good as admitting all.)"""
    pol = ThunderScheduler(CFG)
    seen: list[BackendView] = []
    orig = pol._view

    def spy(ld, supply):
        v = orig(ld, supply)
        seen.append(v)
        return v

    pol._view = spy  # type: ignore[method-assign]
    table = ProgramTable()
    b = backend("b", POOL)
    for i, p_end in enumerate((0.0, 0.3, 0.9)):
        active(table, f"a{i}", b, 1_000).ended_p = p_end
    pol.tick(1.0, table, [b])
    assert seen[-1].active == 3 and seen[-1].ended == pytest.approx(1.2)

    v0 = dataclasses.replace(_view(8), supply=8)
    v2 = dataclasses.replace(v0, ended=2.0)
    c0, _ = _choices(v0, loop(), CPU, AC, 0, 0.0)
    c2, _ = _choices(v2, loop(), CPU, AC, 0, 0.0)
    assert [c.n for c in c2] == [c.n for c in c0]  # the same places at every level
    for c in c2:
        cycling = max(1.0, c.n - 2.0)
        assert c.rate == pytest.approx(predict(cycling, min(c.k, cycling), CPU, loop()).rate)  # k = 0: none protected
    assert c2[0].rate < c0[0].rate

    class Silent(Synthetic):
        def view(self, n: float) -> BackendView:
            return dataclasses.replace(super().view(n), ended=2.0)

    a, q = Synthetic(CPU, noise=False, reports_busy=True), Silent(CPU, noise=False, reports_busy=True)
    a.run(1)
    q.run(1)
    la, lq = a.history[-1].loop, q.history[-1].loop
    assert la[:2] == lq[:2] and lq[2] == pytest.approx(la[2] - 2.0 * CFG.tick_seconds)


def test_probes_down_wait_while_the_engine_idles():
    """A probe down asks whether fewer programs relieve a saturated engine, so it runs only
    while the engine is busy at least ``probe_down_busy`` of the time, lately or over the
    window. The same loop, whose levels above the watermarks run slower than the model says:
    on an engine that reads busy, probes down are made; on one that idles, none is, unless
    ``probe_down_busy`` is 0. (The calibration off: the probes are under test.)"""
    from thunder_sgl.scheduler.goodput import _busy

    def worse(level: int, r: float) -> float:  # a slower loop than the model's, slower still above level 0
        return 0.6 * r * 0.8 ** level

    def downs(hist: list[AdmissionState]) -> list[AdmissionState]:
        return [h for a, h in zip(hist, hist[1:], strict=False) if h.probe == -1 and a.probe != -1]

    busy = Synthetic(CPU, noise=False, rate=worse, reports_busy=False, cfg=UNCALIBRATED).run(200)
    assert downs(busy), "a saturated engine probes down"
    idle = Synthetic(CPU, noise=False, rate=worse, reports_busy=True, cfg=UNCALIBRATED).run(200)
    assert not any(_busy(h, AC.probe_down_busy) for h in idle[10:])  # the synthetic engine idles throughout
    assert not downs(idle)
    always = dataclasses.replace(UNCALIBRATED, admission=dataclasses.replace(UNCALIBRATED.admission, probe_down_busy=0.0))
    assert downs(Synthetic(CPU, noise=False, rate=worse, reports_busy=True, cfg=always).run(200)), \
        "with probe_down_busy 0 the idle engine is probed down as before"


def test_an_open_stream_of_programs_runs_at_the_top_level():
    """Programs that end after a step or two (conversations that arrive, take a turn and
    leave) are an open stream, not the closed loop the model is of: there the steps per
    second are the arrivals' whatever the level, so the model's choice is the top level and
    nothing queues at the router while the engine has room. The same loop whose levels above
    the watermarks run slower than the model says: as a closed loop (agents of 15 steps, or
    no program ended yet) the rule keeps below the top; as an open stream it goes to the top
    within a few periods and stays there, without probes."""
    def worse(level: int, r: float) -> float:
        return 0.6 * r * 0.8 ** level

    top = AC.levels
    none = Synthetic(CPU, noise=False, rate=worse, reports_busy=True).run(200)
    agents = Synthetic(CPU, noise=False, rate=worse, reports_busy=True, steps_per_program=15).run(200)
    assert not any(h.open_stream for h in agents)
    assert [h.level for h in agents] == [h.level for h in none], "a closed loop that ends programs: unchanged"
    assert top not in settled_levels(none)[50:]
    chat = Synthetic(CPU, noise=False, rate=worse, reports_busy=True, steps_per_program=1.5).run(200)
    first = next(i for i, h in enumerate(chat) if h.open_stream)
    assert first < 40, "judged open once OPEN_MIN_ENDS programs have ended"
    assert all(h.open_stream for h in chat[first:])
    assert all(h.level == top and h.model_level == top for h in chat[first + 2:])
    assert chat[-1].view()["open_stream"] is True
    assert chat[-1].hbm_extra == math.inf and agents[-1].hbm_extra == agents[-1].extra  # no HBM gate: request-level
    assert chat[-1].view()["steps_per_ended_program"] == pytest.approx(1.5, abs=0.1)
    # no probes either way, even on a saturated engine: the rate is the arrivals' at every
    # level, and a probe down only queues conversations at the router for its window
    busy = Synthetic(CPU, noise=False, rate=worse, reports_busy=False, steps_per_program=1.5).run(200)
    first = next(i for i, h in enumerate(busy) if h.open_stream)
    assert all(h.probe == 0 and h.level == top for h in busy[first + 2:])
