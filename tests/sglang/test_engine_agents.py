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


def test_a_request_the_real_engine_refuses_for_its_context_hints_its_programs_end(engine, routers):
    """``conversations`` rule 7, *context overflow*, against the real engine: an unmodified
    client's second step carries an observation longer than the model's context; SGLang refuses
    it with a 400, thunder relays it in OpenAI's shape and hints the program's end. And
    mini-swe-agent, unmodified, stops on that refusal (litellm's ``ContextWindowExceededError``,
    one of its abort exceptions): it never asks again."""
    import httpx
    from agent_frameworks import programs
    from test_engine_pressure import metric

    thunder = routers("thunder", engine.urls)
    msgs = [{"role": "system", "content": "You are a shell agent."}, {"role": "user", "content": tasks("ctx")[0]}]
    r = httpx.post(thunder.url + "/v1/chat/completions", timeout=120,
                   json={"model": "default", "messages": msgs, "max_tokens": 8, "temperature": 1.0})
    assert r.status_code == 200, r.text
    msgs = [*msgs, r.json()["choices"][0]["message"], {"role": "user", "content": "line of output\n" * 6000}]
    r = httpx.post(thunder.url + "/v1/chat/completions", timeout=120,
                   json={"model": "default", "messages": msgs, "max_tokens": 8, "temperature": 1.0})
    assert r.status_code == 400 and "longer than the model's context length" in r.json()["error"]["message"], r.text
    (p,) = programs(thunder.url)
    assert p["inferred"] and p["steps"] == 1 and p["end_hint"] == "context_overflow", p
    # the router read the context (16,384) from the engine's /v1/models and the prompt's size
    # from the program's learnt characters per token: it sent the request at once
    assert metric(thunder.url, "thunder_beyond_context_total") == 1
    assert metric(thunder.url, "thunder_beyond_context_served_total") == 0

    from agent_frameworks import mini_config
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.environments.local import LocalEnvironment
    from minisweagent.models.litellm_model import LitellmModel
    cfg = mini_config()
    model_cfg = {k: v for k, v in cfg["model"].items() if k != "model_kwargs"}
    kwargs = {**cfg["model"].get("model_kwargs", {}), "api_base": thunder.url + "/v1", "api_key": "none",
              "max_tokens": 16_000, "temperature": 1.0}  # its first prompt plus 16,000 exceed 16,384
    agent = DefaultAgent(LitellmModel(model_name="openai/default", model_kwargs=kwargs, **model_cfg),
                         LocalEnvironment(**cfg.get("environment", {})),
                         **{**cfg["agent"], "step_limit": 4, "cost_limit": 0, "max_consecutive_format_errors": 0})
    with pytest.raises(Exception) as e:
        agent.run(tasks("ctx")[1])
    assert type(e.value).__name__ == "ContextWindowExceededError" and agent.n_calls == 1, e.value
    mine = [q for q in programs(thunder.url) if q["id"] != p["id"]]
    assert [(q["steps"], q["end_hint"]) for q in mine] == [(0, "context_overflow")], mine
