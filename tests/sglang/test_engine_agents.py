"""mini-swe-agent and the OpenAI Agents SDK, unmodified, in front of a real SGLang CPU server
through thunder (``tests/agent_frameworks.py``): program ids through each framework's own
configuration, and none at all."""

from __future__ import annotations

import pytest
from agent_frameworks import explicit_then_inferred, run_agents, run_openai_agents

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

    def run(tag: str, ids: list[str | None] | None) -> list[int]:
        # one agent at a time: concurrent first requests find the shared prefix cached or not by timing
        return [a["calls"] for a in run_agents(thunder.url, tasks(tag), STEPS, "default", ids, max_tokens=16, threads=1)]

    _, explicit, inferred = explicit_then_inferred(thunder.url, run, N, STEPS, "msa")
    assert explicit > 0.3 and abs(inferred - explicit) <= 0.02, (inferred, explicit)


def test_openai_agents_sdk_through_thunder_with_explicit_and_inferred_ids(engine, routers):
    pytest.importorskip("agents")
    thunder = routers("thunder", engine.urls)
    turns = 3
    _, explicit, inferred = explicit_then_inferred(
        thunder.url, lambda tag, ids: run_openai_agents(thunder.url, tasks(tag), turns, "default", ids, max_tokens=16,
                                                        concurrent=False, temperature=0.0),
        N, turns, "oa")
    assert explicit > 0.3 and abs(inferred - explicit) <= 0.02, (inferred, explicit)
