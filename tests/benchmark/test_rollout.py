"""The rollout benchmark in DES mode (``benchmark.rollout``: ``spec``, ``des``) on the small cluster of
``test_des``: groups share their task, batches wait for each other, weight updates lose
nothing, and what is measured is what happened."""

from __future__ import annotations

import pytest
from test_des import CLUSTER, PROFILE

from thunder_sgl.benchmark.des.tokens import TokenLayout
from thunder_sgl.benchmark.rollout.des import RolloutRun
from thunder_sgl.benchmark.rollout.spec import ProgramDone, RolloutSpec, batch_measures, task_specs

SYNC = RolloutSpec(mode="sync", tasks=4, group_size=4, batches=2, update_every_s=20.0, update_seconds=4.0)


def sync_run(router: str, spec: RolloutSpec = SYNC) -> RolloutRun:
    run = RolloutRun(CLUSTER, 2, router, PROFILE, spec.batch_programs, 4 * 3600.0, rollout=spec, seed=3)
    run.result_ = run.run()  # type: ignore[attr-defined]
    return run


@pytest.fixture(scope="module")
def runs() -> dict[str, RolloutRun]:
    return {r: sync_run(r) for r in ("thunder", "sglang-cache_aware")}


def test_the_samples_of_a_task_share_its_instance_tokens_and_nothing_else():
    a, b = task_specs(PROFILE, 3, task=5, group_size=2)
    assert a.group_id == b.group_id == f"{PROFILE.name}-3-t5" and a.program_id != b.program_id
    assert a.instance_tokens == b.instance_tokens and a.steps != b.steps
    layout = TokenLayout(PROFILE, 3)
    pa, pb = layout.program(a).prompt, layout.program(b).prompt
    assert pa == pb  # system + task: the whole first prompt
    other = task_specs(PROFILE, 3, task=6, group_size=1)[0]
    n = layout.shared_tokens * 4
    assert layout.program(other).prompt[:n] == pa[:n] and layout.program(other).prompt != pa


@pytest.mark.parametrize("router", ["thunder", "sglang-cache_aware"])
def test_every_batch_completes_and_the_next_starts_only_when_it_has(runs, router):
    run = runs[router]
    r = run.result_
    batches = r.rollout["batches"]
    assert [b["programs"] for b in batches] == [16, 16] and r.rollout["batches_done"] == 2
    end0 = max(d.end for d in run.done if d.batch == 0)
    assert batches[1]["released_s"] == pytest.approx(end0)
    assert run.final_ledger["programs"] == run.final_ledger["programs_accounted"] == 32
    assert run.final_ledger["requests"] == run.final_ledger["requests_accounted"]
    assert sum(b["steps"] for b in batches) == r.steps_completed == sum(len(s.steps) for s in _specs(run))


def _specs(run: RolloutRun):
    return [s for t in range(run.task) for s in task_specs(PROFILE, 3, t, SYNC.group_size)]


@pytest.mark.parametrize("router", ["thunder", "sglang-cache_aware"])
def test_weight_updates_pause_every_engine_and_lose_no_request(runs, router):
    run = runs[router]
    ro = run.result_.rollout
    assert ro["windows"] >= 2 and ro["requests_lost"] == 0 and ro["programs_failed"] == 0 and ro["held_left"] == 0
    for w in run.windows:
        assert w["flushed"] == 2  # both workers took the new weights with a flush
        # nothing is answered while the engines are paused
        assert not [c for c in run.rec.calls if w["start"] < c[0] < w["end"]]
    assert {w.weight_version for w in run.workers} == {f"step-{len(run.windows)}"}


def test_thunder_holds_requests_during_a_window_and_answers_them_after(runs):
    run = runs["thunder"]
    assert run.result_.rollout["window_held"] > 0
    for w in run.windows:
        sent_inside = [c for c in run.rec.calls if w["start"] < c[1] < w["end"]]
        assert all(c[0] >= w["end"] for c in sent_inside)
    assert run.router.ctl.stats.expired == 0 and run.router.ctl.stats.kv_resets > 0


def test_stock_routers_requests_wait_at_the_paused_engines_door(runs):
    assert runs["sglang-cache_aware"].result_.rollout["window_door"] > 0


def test_an_abort_pause_resends_what_it_aborted_and_loses_nothing():
    spec = RolloutSpec(mode="sync", tasks=4, group_size=4, batches=1, update_every_s=15.0, update_seconds=3.0,
                       update_pause="abort")
    run = sync_run("thunder", spec)
    ro = run.result_.rollout
    assert ro["resent_after_abort"] > 0 and ro["requests_lost"] == 0 and ro["batches_done"] == 1
    assert run.final_ledger["requests"] == run.final_ledger["requests_accounted"]


def test_async_rollout_keeps_n_in_flight_in_whole_groups():
    spec = RolloutSpec(mode="async", group_size=4, update_every_s=0.0)
    run = RolloutRun(CLUSTER, 2, "thunder", PROFILE, 18, 400.0, warmup_s=100.0, rollout=spec, seed=3)
    r = run.run()
    assert run.counts["started"] % 4 == 0 and len(run.agents) <= 18
    released: dict[str, set[float]] = {}
    for d in run.done:
        released.setdefault(d.group, set()).add(d.released)
    assert all(len(times) == 1 for times in released.values())  # a group's members start together
    assert r.rollout["groups"] > 0
    assert r.steps_per_min > 0 and r.rollout["requests_lost"] == 0


def test_batch_measures_from_known_programs():
    done = [ProgramDone("g1", 0, 10.0, 11.0, 40.0, 3, True), ProgramDone("g1", 0, 10.0, 12.0, 50.0, 3, True),
            ProgramDone("g1", 0, 10.0, 12.0, 90.0, 3, True), ProgramDone("g2", 0, 10.0, 15.0, 30.0, 1, False)]
    m = batch_measures(0, 10.0, done, steps=10)
    assert m["makespan_s"] == 80.0 and m["steps_per_min"] == pytest.approx(7.5)
    assert m["first_response_max_s"] == 5.0 and m["programs_failed"] == 1 and m["groups"] == 2
    # g1: completions 30, 40, 80 -> spread 50, last/median 2.0; g2: one member -> 0, 1.0
    assert (m["group_spread_max_s"], m["last_over_median_max"]) == (50.0, 2.0)


def test_a_sync_rollout_sweep_runs_exactly_its_batch_from_time_zero():
    from thunder_sgl.benchmark.harness import BenchSpec

    spec = RolloutSpec(mode="sync", tasks=3, group_size=4)
    assert BenchSpec(mode="des", programs=(12,), warmup_s=0.0, rollout=spec).results_name.startswith("rollout-sync-")
    for bad in ({"programs": (24,), "warmup_s": 0.0}, {"programs": (12,), "warmup_s": 60.0}):
        with pytest.raises(ValueError, match="sync rollout"):
            BenchSpec(mode="des", rollout=spec, **bad)


@pytest.mark.parametrize("kw", [{"mode": "batch"}, {"update_pause": "stop"}, {"group_size": 0},
                                {"update_every_s": 30.0, "update_seconds": 30.0}])
def test_bad_rollout_specs_are_refused(kw):
    with pytest.raises(ValueError):
        RolloutSpec(**kw)
