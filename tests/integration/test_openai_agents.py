"""The OpenAI Agents SDK (``openai-agents``), unmodified, as the router's client
(``tests/agent_frameworks.py``): multi-turn agents on simulated workers, with the program id in
the SDK's ``ModelSettings.extra_body`` and with no id at all. The SDK rebuilds the chat history
from its own items every turn (assistant text as content parts, tool definitions attached), so
inference must match a history it did not send verbatim."""

from __future__ import annotations

import httpx
import pytest
from agent_frameworks import hit_rate, programs, run_openai_agents
from test_router_e2e import TS, metrics

pytest.importorskip("agents")

TURNS = 4


@pytest.fixture
def router(spawn):
    sim = spawn("sim", "tiny", workers=2, time_scale=TS)
    return spawn("thunder", sim.urls, time_scale=TS)


def tasks(n: int, tag: str) -> list[str]:
    return [f"Ticket {tag}-{i}: `make test` fails in module billing/{i}.py with a KeyError; find and fix it."
            for i in range(n)]


def test_openai_agents_land_in_one_program_each_with_explicit_and_inferred_ids(router):
    n = 6
    calls = run_openai_agents(router.url, tasks(n, "x"), TURNS, "tiny", [f"oa-{i}" for i in range(n)])
    assert calls == [TURNS] * n
    by_id = {p["id"]: p for p in programs(router.url)}
    assert all(by_id[f"oa-{i}"]["steps"] == TURNS for i in range(n))
    explicit_hit = hit_rate([by_id[f"oa-{i}"] for i in range(n)])
    for i in range(n):
        httpx.post(router.url + f"/programs/oa-{i}/release").raise_for_status()
    httpx.post(router.url + "/flush_cache").raise_for_status()  # both runs start from a cold cache

    assert run_openai_agents(router.url, tasks(n, "y"), TURNS, "tiny") == [TURNS] * n
    progs = programs(router.url)
    assert len(progs) == n and all(p["inferred"] and p["steps"] == TURNS for p in progs), progs
    m = metrics(router.url)
    assert m['thunder_inferred_requests_total{result="matched"}'] == n * (TURNS - 1)
    assert abs(hit_rate(progs) - explicit_hit) <= 0.02, (hit_rate(progs), explicit_hit)
