"""mini-swe-agent, unmodified, as the router's client (``tests/agent_frameworks.py``): in front of
simulated workers, with the program id passed through the framework's own configuration and
with no id at all (inferred, ``control.conversations``)."""

from __future__ import annotations

import pytest
from agent_frameworks import explicit_then_inferred, programs, run_agents
from test_router_e2e import metrics

pytest.importorskip("minisweagent")
# litellm's response model types SGLang's ``metadata.weight_versions`` (a list of spans) as a
# string and warns on every answer; the suite turns warnings into errors, a user sees a warning.
pytestmark = pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")

STEPS = 5


def tasks(n: int, tag: str) -> list[str]:
    return [f"Issue {tag}-{i}: the function parse_date in utils/dates.py returns None for ISO dates "
            f"with a timezone offset. Make it return an aware datetime (case {i})." for i in range(n)]


def test_agents_land_in_one_program_each_with_explicit_and_inferred_ids_and_the_same_hit_rate(thunder_on_sim):
    router = thunder_on_sim
    n = 8

    def run(tag: str, ids: list[str | None] | None) -> list[int]:
        return [a["calls"] for a in run_agents(router.url, tasks(n, tag), STEPS, "tiny", ids)]

    _, explicit, inferred = explicit_then_inferred(router.url, run, n, STEPS, "msa")
    m = metrics(router.url)
    assert m['thunder_inferred_requests_total{result="new"}'] == n
    assert m['thunder_inferred_requests_total{result="matched"}'] == n * (STEPS - 1)
    assert abs(inferred - explicit) <= 0.02, (inferred, explicit)


def test_32_agents_sharing_a_system_prompt_and_a_task_are_never_misattributed(thunder_on_sim):
    router = thunder_on_sim
    """Every request of these agents is byte for byte every other's (one task, and the
    unparseable answers left out of the history): each first request starts a program, and
    every later one continues all 32, so it goes statelessly and is counted — no program gets
    another agent's step."""
    n = 32
    run_agents(router.url, tasks(1, "z") * n, STEPS, "tiny", threads=16)
    progs = programs(router.url)
    assert len(progs) == n and all(p["inferred"] for p in progs)
    m = metrics(router.url)
    count = {k: m[f'thunder_inferred_requests_total{{result="{k}"}}']
             for k in ("new", "matched", "ambiguous", "busy", "overflow")}
    assert count["new"] == n and sum(count.values()) == n * STEPS, count
    # On a busy machine an agent's second request can arrive while its program is the only
    # one yet answered: it continues that one alone and is matched, rightly (a matched one
    # whose program has a request out goes statelessly as busy). Every other continuation is
    # ambiguous and contests its head, so no program ever holds more steps than its agent made
    # (CI once saw one program take 33: the others' later steps continued it alone).
    assert sum(p["steps"] for p in progs) == n + count["matched"], count
    assert max(p["steps"] for p in progs) <= STEPS, ([p["steps"] for p in progs], count)
