"""Groups on the request path: membership from the first request, mismatches refused without
harm, the task prompt learned from cache hits, completion per group."""

from __future__ import annotations

import pytest

from thunder_sgl.backends import Backend, Tiers
from thunder_sgl.config import RouterConfig, SchedulerConfig
from thunder_sgl.control.controller import Controller
from thunder_sgl.control.tickets import Ticket
from thunder_sgl.errors import BadRequest
from thunder_sgl.programs import Phase, Usage


def make(policy: str = "thunder", n: int = 2) -> Controller:
    cfg = RouterConfig(scheduler=SchedulerConfig(default_output_tokens=100, lambda_max=1.0, lambda_min=1.0))
    c = Controller(cfg, policy)
    for i in range(n):
        c.add_backend(Backend(f"http://w{i}", 0, Tiers(hbm_tokens=100_000)))
    return c


def ticket(pid: str, tokens: int, group: str | None = None, task_tokens: int = 0) -> Ticket:
    return Ticket(pid, prompt_chars=4 * tokens, prefix_key="sys", prefix_chars=4 * 1000,
                  group_id=group, group_chars=4 * task_tokens)


def run(c: Controller, t: Ticket, now: float, usage: Usage) -> None:
    if c.submit(t, now) is None:
        assert t in c.tick(now).dispatched
    c.finish(t, now + 1, usage)


def test_the_first_request_makes_the_program_a_member_with_its_task_prompt_estimated():
    c = make()
    c.submit(ticket("t-0", 3000, "t", task_tokens=1800), 0.0)
    p = c.programs.get("t-0")
    assert p.group.id == "t" and p.group_key == p.group.key and p.group.prefix_tokens == 1800
    assert c.programs.groups.get("t").live == 1


def test_members_are_admitted_onto_one_backend():
    c = make(n=4)
    for i in range(4):
        c.submit(ticket(f"t-{i}", 3000, "t", task_tokens=1800), 0.0)
    res = c.tick(0.0)
    assert len(res.dispatched) == 4 and len({t.backend.key for t in res.dispatched}) == 1


def test_a_request_naming_another_group_is_refused_and_the_program_is_untouched():
    c = make()
    first = ticket("t-0", 3000, "t")
    c.submit(first, 0.0)
    c.tick(0.0)
    p = c.programs.get("t-0")
    assert p.in_flight == 1
    with pytest.raises(BadRequest) as e:
        c.submit(ticket("t-0", 3500, "other"), 0.5)
    assert (e.value.status, e.value.code, e.value.param) == (400, "group_mismatch", "group_id")
    assert (p.in_flight, p.held, p.group.id, first.dispatched_at) == (1, 0, "t", 0.0)
    c.finish(first, 1.0, Usage(3000, 100))  # the accepted request ends as usual
    assert p.phase is Phase.ACTING and p.steps == 1
    # the same group, or none, is fine on later requests
    run(c, ticket("t-0", 3500, "t"), 2.0, Usage(3500, 100))
    run(c, ticket("t-0", 4000), 3.0, Usage(4000, 100))
    assert p.steps == 3


def test_a_program_without_a_group_cannot_join_one_later():
    c = make()
    run(c, ticket("solo", 3000), 0.0, Usage(3000, 100))
    with pytest.raises(BadRequest):
        c.submit(ticket("solo", 3500, "t"), 2.0)
    assert c.programs.get("solo").group is None and c.programs.groups.get("t") is None


def test_the_task_prompt_is_learned_from_a_later_members_cached_tokens():
    c = make()
    run(c, ticket("t-0", 3000, "t", task_tokens=500), 0.0, Usage(3000, 100, cached_tokens=1000))
    assert c.programs.get("t-0").shared_prefix_tokens == 1000  # the system prompt, learned
    run(c, ticket("t-1", 3000, "t", task_tokens=500), 5.0, Usage(3000, 100, cached_tokens=2900))
    g = c.programs.groups.get("t")
    assert g.learned and g.prefix_tokens == 1900
    # the cached task prompt did not make the system prompt look longer
    assert c.programs.get("t-1").shared_prefix_tokens == 1000
    run(c, ticket("solo", 3000), 6.0, Usage(3000, 100, cached_tokens=1000))
    assert c.programs.get("solo").shared_prefix_tokens == 1000


def test_releases_report_completion_per_group():
    c = make()
    for i in range(3):
        run(c, ticket(f"t-{i}", 3000, "t"), 0.0, Usage(3000, 100))
    for i, when in enumerate((10.0, 20.0, 40.0)):
        c.release(f"t-{i}", when)
    g = c.programs.groups.find("t")
    d = g.describe()
    assert d["complete"] and (d["first_done_seconds"], d["last_done_seconds"], d["spread_seconds"]) == (10.0, 40.0, 30.0)


def test_thunder_paper_tracks_groups_but_does_not_count_their_prompt():
    c = make("thunder-paper")
    c.submit(ticket("t-0", 3000, "t", task_tokens=1800), 0.0)
    p = c.programs.get("t-0")
    assert p.group.id == "t" and p.group_key is None


def test_a_group_keeps_its_home_after_its_members_leave_until_that_engine_drops_its_kv():
    c = make(n=0)
    c.add_backend(Backend("http://big", 0, Tiers(hbm_tokens=200_000)))
    c.add_backend(Backend("http://small", 0, Tiers(hbm_tokens=100_000)))
    run(c, ticket("t-0", 3000, "t", task_tokens=1800), 0.0, Usage(3000, 10, 0))
    g = c.programs.groups.get("t")
    home = c.programs.get("t-0").backend
    assert home == "http://big@0" or home.startswith("http://big")
    c.release("t-0", 2.0)
    assert g.home == home and g.live == 0
    run(c, Ticket("x", prompt_chars=4 * 150_000), 2.5, Usage(150_000, 10, 0))  # most room: big
    assert c.programs.get("x").backend == home  # now small has the most room
    t1 = ticket("t-1", 3000, "t", task_tokens=1800)
    run(c, t1, 3.0, Usage(3000, 10, 2800))
    assert t1.backend.key == home  # the group came back to where its task was cached
    c.release("t-1", 5.0)
    c.reset_kv([home], 6.0)
    assert c.programs.groups.find("t").home is None
