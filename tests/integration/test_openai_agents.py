"""The OpenAI Agents SDK (``openai-agents``), unmodified, as the router's client
(``tests/agent_frameworks.py``): multi-turn agents on simulated workers, with the program id in
the SDK's ``ModelSettings.extra_body`` and with no id at all. The SDK rebuilds the chat history
from its own items every turn (assistant text as content parts, tool definitions attached), so
inference must match a history it did not send verbatim."""

from __future__ import annotations

import pytest
from agent_frameworks import explicit_then_inferred, run_openai_agents
from test_router_e2e import metrics

pytest.importorskip("agents")

TURNS = 4


def tasks(n: int, tag: str) -> list[str]:
    return [f"Ticket {tag}-{i}: `make test` fails in module billing/{i}.py with a KeyError; find and fix it."
            for i in range(n)]


def test_openai_agents_land_in_one_program_each_with_explicit_and_inferred_ids(thunder_on_sim):
    router = thunder_on_sim
    n = 6
    _, explicit, inferred = explicit_then_inferred(
        router.url, lambda tag, ids: run_openai_agents(router.url, tasks(n, tag), TURNS, "tiny", ids), n, TURNS, "oa")
    m = metrics(router.url)
    assert m['thunder_inferred_requests_total{result="matched"}'] == n * (TURNS - 1)
    assert abs(inferred - explicit) <= 0.02, (inferred, explicit)
