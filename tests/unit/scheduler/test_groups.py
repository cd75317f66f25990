"""Groups in the scheduler: the task prompt counted once per backend, members placed together,
groups aged in the queue, completion per group."""

from __future__ import annotations

import dataclasses

import pytest
from sched_scenarios import active, backend, naive_demand, new, paused

from thunder_sgl.config import SchedulerConfig
from thunder_sgl.programs import GroupTable, ProgramTable
from thunder_sgl.scheduler import ThunderScheduler, make_policy
from thunder_sgl.scheduler.capacity import BackendLoad
from thunder_sgl.scheduler.grouping import GroupPicker
from thunder_sgl.scheduler.queue import order

CFG = SchedulerConfig(default_output_tokens=1, lambda_max=1.0, lambda_min=1.0, tier_aware=False)
SYS = ("sys", 1000)


def grouped(**kw) -> ThunderScheduler:
    return ThunderScheduler(dataclasses.replace(CFG, **kw), picker=GroupPicker())


def load_of(table: ProgramTable, b, now: float = 0.0) -> BackendLoad:
    ld = BackendLoad.for_backend(b, CFG)
    ld.account(table.on_backend(b.key), now, CFG.tick_seconds, [1.0], 1.0)
    return ld


# ---- the shared task prompt ----------------------------------------------------------------
def test_a_groups_task_prompt_is_counted_once_per_backend():
    t = ProgramTable()
    b = backend("b", 100_000)
    for i in range(3):
        active(t, f"m{i}", b, 5000, prefix=SYS, group=("task", 2000))
    # private = 5000 − (1000 + 2000) each; the system and the task prompt once each
    assert load_of(t, b).demand == 3 * 2000 + 1000 + 2000
    assert load_of(t, b).demand == naive_demand(t, b, 0.0, 5.0, 2.0, 64)


def test_members_of_different_groups_share_only_the_system_prompt():
    t = ProgramTable()
    b = backend("b", 100_000)
    active(t, "a", b, 5000, prefix=SYS, group=("task-a", 2000))
    active(t, "b", b, 5000, prefix=SYS, group=("task-b", 2000))
    assert load_of(t, b).demand == 2 * 2000 + 1000 + 2 * 2000


def test_only_the_last_member_to_leave_frees_the_task_prompt():
    t = ProgramTable()
    b = backend("b", 100_000)
    a = active(t, "a", b, 5000, prefix=SYS, group=("task", 2000))
    active(t, "b", b, 5000, prefix=SYS, group=("task", 2000))
    ld = load_of(t, b)
    first = next(m for m in ld.members() if m.program is a)
    assert ld.freed_by(first) == 2000  # its private part only
    ld.remove(first)
    last = next(m for m in ld.members() if m.program is not a)
    assert ld.freed_by(last) == 2000 + 1000 + 2000  # private, system, task


def test_pausing_counts_the_task_prompt_freed_by_the_groups_last_member():
    # Pool 10_000. Four acting members of 3500 (system 1000 + task 2000 shared, private 500,
    # weight 1/2 after one tick: 250 each) and a reasoning program of 8500 (private 7500):
    # demand 1000 + 2000 + 4·250 + 7500 = 11_500, excess 1500. Three members free only 750;
    # the fourth also frees the task prompt: all four are paused, and that is minimal.
    t = ProgramTable()
    b = backend("b", 10_000)
    for i in range(4):
        active(t, f"m{i}", b, 3500, prefix=SYS, group=("task", 2000), acting_since=-6.0)
    active(t, "big", b, 8500, prefix=SYS, reasoning=True)
    d = grouped().tick(0.0, t, [b])
    assert sorted(d.pauses) == ["m0", "m1", "m2", "m3"]
    assert d.demand[b.key] == 1000 + 7500


# ---- placement -----------------------------------------------------------------------------
def test_a_member_goes_where_its_group_runs_even_with_less_room_there():
    t = ProgramTable()
    home, other = backend("home", 100_000), backend("other", 100_000)
    active(t, "m0", home, 30_000, prefix=SYS, group=("task", 2000))
    active(t, "x", other, 1000, prefix=SYS)
    new(t, "m1", 3100, group=("task", 2000))
    d = grouped().tick(0.0, t, [home, other])
    assert [(p.program_id, p.backend) for p in d.placements] == [("m1", home.key)]


def test_without_groups_the_same_member_goes_to_the_most_room():
    t = ProgramTable()
    home, other = backend("home", 100_000), backend("other", 100_000)
    active(t, "m0", home, 30_000, prefix=SYS, group=("task", 2000))
    active(t, "x", other, 1000, prefix=SYS)
    new(t, "m1", 3100)  # no group
    d = grouped().tick(0.0, t, [home, other])
    assert [(p.program_id, p.backend) for p in d.placements] == [("m1", other.key)]


def test_colocation_never_crosses_the_watermark():
    t = ProgramTable()
    home, other = backend("home", 10_000), backend("other", 100_000)
    active(t, "m0", home, 8000, prefix=SYS, group=("task", 2000), reasoning=True)
    new(t, "m1", 5000, group=("task", 2000))  # private 5000 − 2000 > 10_000 − 8000 room
    d = grouped().tick(0.0, t, [home, other])
    assert [(p.program_id, p.backend) for p in d.placements] == [("m1", other.key)]


def test_a_member_returns_to_its_previous_backend_before_its_groups():
    t = ProgramTable()
    home, prev = backend("home", 100_000), backend("prev", 100_000)
    active(t, "m0", home, 5000, group=("task", 2000))
    active(t, "m1", home, 5000, group=("task", 2000))
    paused(t, "m2", prev, 5000, group=("task", 2000), held=1)
    d = grouped().tick(0.0, t, [home, prev])
    assert [(p.program_id, p.backend) for p in d.placements] == [("m2", prev.key)]


def test_the_backend_with_most_members_of_the_group_wins():
    t = ProgramTable()
    one, two = backend("one", 100_000), backend("two", 100_000)
    active(t, "a", one, 5000, group=("task", 2000))
    active(t, "b", two, 5000, group=("task", 2000))
    active(t, "c", two, 5000, group=("task", 2000))
    new(t, "d", 2500, group=("task", 2000))
    d = grouped().tick(0.0, t, [one, two])
    assert [p.backend for p in d.placements] == [two.key]


def test_with_no_member_left_running_a_member_goes_to_its_groups_home():
    """The group's last member was placed on ``home`` and released: the next member goes
    where the task prompt was cached last, though ``other`` has more room; a member of a
    group without a home goes to the most room."""
    t = ProgramTable()
    home, other = backend("home", 100_000), backend("other", 100_000)
    active(t, "m0", home, 30_000, prefix=SYS, group=("task", 2000))
    active(t, "x", home, 20_000, prefix=SYS)
    t.remove("m0", 1.0)
    assert t.groups.find("task").home == home.key and t.groups.find("task").live == 0
    new(t, "m1", 3100, group=("task", 2000), since=2.0)
    new(t, "y1", 3100, group=("other-task", 2000), since=2.0)
    d = grouped().tick(2.0, t, [home, other])
    assert sorted((p.program_id, p.backend) for p in d.placements) == [("m1", home.key), ("y1", other.key)]


def test_a_home_without_room_is_passed_over():
    t = ProgramTable()
    home, other = backend("home", 10_000), backend("other", 100_000)
    active(t, "m0", home, 2000, group=("task", 2000))
    active(t, "x", home, 7000)
    t.remove("m0", 1.0)
    new(t, "m1", 5000, group=("task", 2000), since=2.0)
    d = grouped().tick(2.0, t, [home, other])
    assert [(p.program_id, p.backend) for p in d.placements] == [("m1", other.key)]


def test_a_whole_new_group_lands_on_one_backend_when_it_fits():
    t = ProgramTable()
    bs = [backend(f"b{i}", 100_000) for i in range(4)]
    for i in range(8):
        new(t, f"g-{i}", 2600, group=("g", 2000))
    d = grouped().tick(0.0, t, bs)
    assert len(d.placements) == 8 and len({p.backend for p in d.placements}) == 1


# ---- queue order ---------------------------------------------------------------------------
def _members(table: ProgramTable, gid: str, n: int) -> list[str]:
    return [table.create(f"{gid}-done-{i}", 0.0, gid).id for i in range(n)]


@pytest.mark.parametrize(
    ("done", "member_since", "expected_first"),
    [
        (7, 80.0, "member"),   # 7 of 8 finished: head start 120·7/8 = 105 s > 80 s later
        (7, 110.0, "other"),   # ... but not more than that: aging is bounded
        (0, 1.0, "other"),     # no member finished: no head start
        (1, 50.0, "member"),   # 1 of 2 finished: 60 s
        (1, 70.0, "other"),
    ],
)
def test_a_groups_last_members_go_before_newer_work(done, member_since, expected_first):
    t = ProgramTable()
    b = backend("b", 10_000)
    finished = _members(t, "task", done)
    paused(t, "other", b, 1000, since=0.0, held=1)
    paused(t, "member", b, 1000, since=member_since, held=1, group=("task", 0))
    for pid in finished:
        t.remove(pid, 1.0)
    assert order(t.waiting(), CFG)[0].id == expected_first


def test_the_group_head_start_is_off_when_groups_are_not_counted():
    t = ProgramTable()
    b = backend("b", 10_000)
    finished = _members(t, "task", 7)
    paused(t, "other", b, 1000, since=0.0, held=1)
    paused(t, "member", b, 1000, since=80.0, held=1, group=("task", 0))
    for pid in finished:
        t.remove(pid, 1.0)
    assert order(t.waiting(), dataclasses.replace(CFG, groups=False))[0].id == "other"


def test_thunder_paper_places_members_without_regard_to_their_group():
    pol = make_policy("thunder-paper", SchedulerConfig())
    assert not pol.cfg.groups and not isinstance(pol.picker, GroupPicker)  # type: ignore[attr-defined]
    assert isinstance(make_policy("thunder", SchedulerConfig()).picker, GroupPicker)  # type: ignore[attr-defined]


# ---- completion per group ------------------------------------------------------------------
def test_a_group_reports_its_members_completion_and_spread():
    table = GroupTable(keep=2)
    g = table.join("task", 10.0)
    for _ in range(3):
        table.join("task", 11.0)
    for when in (40.0, 50.0, 70.0):
        table.leave(g, when)
    live = g.describe()
    assert live["members"] == 4 and live["live"] == 1 and not live["complete"]
    table.leave(g, 110.0)
    done = table.find("task").describe()  # type: ignore[union-attr]
    assert done["complete"] and table.get("task") is None
    assert (done["first_done_seconds"], done["median_done_seconds"], done["last_done_seconds"]) == (30.0, 50.0, 100.0)
    assert done["spread_seconds"] == 70.0


def test_completed_groups_are_kept_up_to_the_bound():
    table = GroupTable(keep=2)
    for gid in ("a", "b", "c"):
        table.leave(table.join(gid, 0.0), 1.0)
    assert [g.id for g in table.completed] == ["b", "c"] and table.completed_total == 3
    assert table.find("a") is None


def test_a_group_learns_its_task_prompt_from_the_second_members_cache_hit():
    g = GroupTable().join("task", 0.0, prefix_tokens=500)  # estimated from characters
    assert g.first_step(cached=1000, system_tokens=1000) is False  # the first member: system only
    assert g.first_step(cached=3100, system_tokens=1000) is True
    assert g.prefix_tokens == 2100 and g.learned
    g.first_step(cached=1000, system_tokens=1000)  # ran alongside the first: no task hit
    assert g.prefix_tokens == 2100


def test_a_member_joining_a_completed_group_reopens_it():
    table = GroupTable()
    g = table.join("task", 0.0)
    table.leave(g, 5.0)
    assert table.completed_total == 1
    again = table.join("task", 9.0)
    assert again is g and table.get("task") is g and table.completed_total == 0
    table.leave(g, 20.0)
    assert g.describe()["members"] == 2 and g.completions == [5.0, 20.0]
