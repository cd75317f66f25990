"""mini-swe-agent, unmodified, as the router's client (``tests/agent_frameworks.py``): in front of
simulated workers, with the program id passed through the framework's own configuration and
with no id at all (inferred, ``control.conversations``)."""

from __future__ import annotations

import httpx
import pytest
from agent_frameworks import hit_rate, programs, run_agents
from test_router_e2e import TS, metrics

pytest.importorskip("minisweagent")
# litellm's response model types SGLang's ``metadata.weight_versions`` (a list of spans) as a
# string and warns on every answer; the suite turns warnings into errors, a user sees a warning.
pytestmark = pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")

STEPS = 5


@pytest.fixture
def router(spawn):
    sim = spawn("sim", "tiny", workers=2, time_scale=TS)
    return spawn("thunder", sim.urls, time_scale=TS)


def tasks(n: int, tag: str) -> list[str]:
    return [f"Issue {tag}-{i}: the function parse_date in utils/dates.py returns None for ISO dates "
            f"with a timezone offset. Make it return an aware datetime (case {i})." for i in range(n)]


def test_agents_land_in_one_program_each_with_explicit_and_inferred_ids_and_the_same_hit_rate(router):
    n = 8
    explicit = run_agents(router.url, tasks(n, "x"), STEPS, "tiny", [f"msa-{i}" for i in range(n)])
    assert all(a["calls"] == STEPS and a["exit"] == "LimitsExceeded" for a in explicit)
    by_id = {p["id"]: p for p in programs(router.url)}
    assert all(by_id[f"msa-{i}"]["steps"] == STEPS and not by_id[f"msa-{i}"]["inferred"] for i in range(n))
    explicit_hit = hit_rate([by_id[f"msa-{i}"] for i in range(n)])
    for i in range(n):
        assert httpx.post(router.url + f"/programs/msa-{i}/release").status_code == 200
    httpx.post(router.url + "/flush_cache").raise_for_status()  # both runs start from a cold cache

    inferred = run_agents(router.url, tasks(n, "y"), STEPS, "tiny")
    assert all(a["calls"] == STEPS for a in inferred)
    progs = programs(router.url)
    assert len(progs) == n and all(p["inferred"] and p["steps"] == STEPS for p in progs)
    m = metrics(router.url)
    assert m['thunder_inferred_requests_total{result="new"}'] == n
    assert m['thunder_inferred_requests_total{result="matched"}'] == n * (STEPS - 1)
    assert abs(hit_rate(progs) - explicit_hit) <= 0.02, (hit_rate(progs), explicit_hit)


def test_32_agents_sharing_a_system_prompt_and_a_task_are_never_misattributed(router):
    """Every request of these agents is byte for byte every other's (one task, and the
    unparseable answers left out of the history): each first request starts a conversation
    (statelessly), and every later one continues all 32, so it goes statelessly and is
    counted — no program is made of two agents' steps."""
    n = 32
    run_agents(router.url, tasks(1, "z") * n, STEPS, "tiny", threads=16)
    assert programs(router.url) == []
    m = metrics(router.url)
    assert m['thunder_inferred_requests_total{result="new"}'] == n
    assert m['thunder_inferred_requests_total{result="matched"}'] == 0
    assert m['thunder_inferred_requests_total{result="ambiguous"}'] == n * (STEPS - 1)
