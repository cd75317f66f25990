"""mini-swe-agent and the OpenAI Agents SDK, unmodified, in front of a real SGLang CPU server
through thunder (``tests/agent_frameworks.py``): program ids through each framework's own
configuration, and none at all."""

from __future__ import annotations

import httpx
import pytest
from agent_frameworks import hit_rate, programs, run_agents, run_openai_agents

pytest.importorskip("minisweagent")
# litellm's response model types SGLang's ``metadata.weight_versions`` (a list of spans) as a
# string and warns on every answer; the suite turns warnings into errors, a user sees a warning.
pytestmark = pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")

STEPS = 4
N = 4


@pytest.fixture(scope="module")
def engine(start_cluster):
    return start_cluster(1, max_total_tokens=16384)


def tasks(tag: str) -> list[str]:
    return [f"Issue {tag}-{i}: the CSV export in reports/export.py drops the last row when the file "
            f"has no trailing newline. Fix it and add a test (case {i})." for i in range(N)]


def test_mini_swe_agents_through_thunder_with_explicit_and_inferred_ids(engine, routers):
    thunder = routers("thunder", engine.urls)
    explicit = run_agents(thunder.url, tasks("x"), STEPS, "default", [f"msa-{i}" for i in range(N)], max_tokens=16)
    assert all(a["calls"] == STEPS for a in explicit)
    by_id = {p["id"]: p for p in programs(thunder.url)}
    assert all(by_id[f"msa-{i}"]["steps"] == STEPS for i in range(N))
    explicit_hit = hit_rate([by_id[f"msa-{i}"] for i in range(N)])
    for i in range(N):
        httpx.post(thunder.url + f"/programs/msa-{i}/release").raise_for_status()
    httpx.post(thunder.url + "/flush_cache").raise_for_status()  # both runs start from a cold cache

    inferred = run_agents(thunder.url, tasks("y"), STEPS, "default", max_tokens=16)
    assert all(a["calls"] == STEPS for a in inferred)
    progs = programs(thunder.url)
    assert len(progs) == N and all(p["inferred"] and p["steps"] == STEPS for p in progs), progs
    assert explicit_hit > 0.3 and abs(hit_rate(progs) - explicit_hit) <= 0.02, (hit_rate(progs), explicit_hit)


def test_openai_agents_sdk_through_thunder_with_explicit_and_inferred_ids(engine, routers):
    pytest.importorskip("agents")
    thunder = routers("thunder", engine.urls)
    turns = 3
    assert run_openai_agents(thunder.url, tasks("a"), turns, "default", [f"oa-{i}" for i in range(N)],
                             max_tokens=16) == [turns] * N
    by_id = {p["id"]: p for p in programs(thunder.url)}
    assert all(by_id[f"oa-{i}"]["steps"] == turns for i in range(N))
    explicit_hit = hit_rate([by_id[f"oa-{i}"] for i in range(N)])
    for i in range(N):
        httpx.post(thunder.url + f"/programs/oa-{i}/release").raise_for_status()
    httpx.post(thunder.url + "/flush_cache").raise_for_status()

    assert run_openai_agents(thunder.url, tasks("b"), turns, "default", max_tokens=16) == [turns] * N
    progs = programs(thunder.url)
    assert len(progs) == N and all(p["inferred"] and p["steps"] == turns for p in progs), progs
    assert explicit_hit > 0.3 and abs(hit_rate(progs) - explicit_hit) <= 0.02, (hit_rate(progs), explicit_hit)
