"""Real agent frameworks as clients of the router, unmodified: mini-swe-agent (``DefaultAgent``
with ``LitellmModel``, pointed at the router by ``api_base``). Shared by the tests on simulated
workers and on the real SGLang CPU engine.

A random-weight (or simulated) model never answers with a valid bash tool call, so every step
is a format error: the agent adds the error to its history (mini-swe-agent 2.x leaves the
unparseable answer out) and asks again, until its ``step_limit``
(``max_consecutive_format_errors: 0`` keeps it going). Each agent therefore makes exactly
``step_limit`` calls.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of the price list (no network)
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")


EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "mini_swe_agent_thunder.py"


def mini_config() -> dict[str, Any]:
    """mini-swe-agent's own ``mini.yaml``, not interactive: the example's own reading of it
    (``examples/mini_swe_agent_thunder.py``), so tests and example agree."""
    import importlib.util
    import sys

    mod = sys.modules.get("mini_swe_agent_thunder")
    if mod is None:
        spec = importlib.util.spec_from_file_location("mini_swe_agent_thunder", EXAMPLE)
        mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules["mini_swe_agent_thunder"] = mod
        spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod.mini_config()  # type: ignore[no-any-return]


def run_agents(router_url: str, tasks: list[str], steps: int, model: str, program_ids: list[str | None] | None = None,
               max_tokens: int = 24, threads: int = 8) -> list[dict[str, Any]]:
    """Run one mini-swe-agent per task against the router, ``steps`` model calls each; a
    program id, where given, goes through the framework's own configuration
    (``model_kwargs.extra_body``). Returns each agent's exit info and call count."""
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.environments.local import LocalEnvironment
    from minisweagent.models.litellm_model import LitellmModel

    cfg = mini_config()
    ids = program_ids or [None] * len(tasks)

    def one(task: str, pid: str | None) -> dict[str, Any]:
        kwargs = {**cfg["model"].get("model_kwargs", {}), "api_base": router_url + "/v1", "api_key": "none",
                  "max_tokens": max_tokens, "temperature": 1.0}
        if pid is not None:
            kwargs["extra_body"] = {"program_id": pid}
        model_cfg = {k: v for k, v in cfg["model"].items() if k != "model_kwargs"}
        agent = DefaultAgent(LitellmModel(model_name=f"openai/{model}", model_kwargs=kwargs, **model_cfg),
                             LocalEnvironment(**cfg.get("environment", {})),
                             **{**cfg["agent"], "step_limit": steps, "cost_limit": 0, "max_consecutive_format_errors": 0})
        info = agent.run(task)
        assert info.get("exit_status") == "LimitsExceeded", info  # every step a format error, to the limit
        return {"exit": info.get("exit_status"), "calls": agent.n_calls, "pid": pid}

    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(one, tasks, ids))


def programs(router_url: str) -> list[dict[str, Any]]:
    return httpx.get(router_url + "/programs").json()["data"]


def hit_rate(progs: list[dict[str, Any]]) -> float:
    prompt = sum(p["tokens"]["prompt"] for p in progs)
    return sum(p["tokens"]["cached"] for p in progs) / prompt if prompt else 0.0


def run_openai_agents(router_url: str, tasks: list[str], turns: int, model: str,
                      program_ids: list[str | None] | None = None, max_tokens: int = 24,
                      concurrent: bool = True, temperature: float = 1.0) -> list[int]:
    """One OpenAI Agents SDK agent per task (``Agent`` + ``Runner`` on
    ``OpenAIChatCompletionsModel`` at the router), each a conversation of ``turns`` runs: the
    SDK's own history (``RunResult.to_input_list()``) plus a new user message each turn. A
    program id, where given, goes through ``ModelSettings.extra_body``. Returns each agent's
    model calls (the model never calls the tool here, so one per turn). ``concurrent`` False:
    one agent after the other (whether concurrent first requests find their shared prefix
    cached depends on timing, a few points of hit rate either way)."""
    import asyncio

    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # no trace export (no network)

    @function_tool
    def run_bash(command: str) -> str:
        """Run a bash command in the repository and return its output."""
        return f"ran: {command}"

    async def one(client: AsyncOpenAI, task: str, pid: str | None) -> int:
        settings = ModelSettings(max_tokens=max_tokens, temperature=temperature,
                                 extra_body={"program_id": pid} if pid is not None else None)
        agent = Agent(name="coder", instructions="You are a coding agent. Use run_bash to inspect and fix the repo.",
                      model=OpenAIChatCompletionsModel(model=model, openai_client=client), model_settings=settings,
                      tools=[run_bash])
        items: Any = task
        calls = 0
        for turn in range(turns):
            result = await Runner.run(agent, items)
            calls += len(result.raw_responses)
            items = [*result.to_input_list(), {"role": "user", "content": f"The tests still fail (attempt {turn})."}]
        return calls

    async def main() -> list[int]:
        ids = program_ids or [None] * len(tasks)
        # closed here, in its own loop: left to the garbage collector, its connection pool's
        # close runs later in another test's loop and logs an error there
        async with AsyncOpenAI(base_url=router_url + "/v1", api_key="none", max_retries=0) as client:
            if not concurrent:
                return [await one(client, t, p) for t, p in zip(tasks, ids, strict=True)]
            return list(await asyncio.gather(*(one(client, t, p) for t, p in zip(tasks, ids, strict=True))))

    return asyncio.run(main())


def explicit_then_inferred(router_url: str, run: Callable[[str, list[str | None] | None], list[int]], n: int,
                           steps: int, prefix: str) -> tuple[list[dict[str, Any]], float, float]:
    """Run ``n`` agents of a framework twice through the router, each run from a cold cache:
    with program ids ``prefix-i`` in the framework's configuration, then with none. Both runs
    send the same tasks, so a framework run at temperature 0 sends the same prompts twice and
    the two hit rates differ only by what inference loses (with different tasks and sampled
    answers they differed by up to 0.03 from run to run, on a busy machine).
    ``run(tag, ids)`` runs one agent per task of ``tag`` and returns their model calls. Checks
    that every agent made ``steps`` calls and landed in exactly one program of ``steps`` steps
    both times; returns the inferred programs and the two KV hit rates (explicit, inferred)."""
    ids: list[str | None] = [f"{prefix}-{i}" for i in range(n)]
    assert run("x", ids) == [steps] * n
    by_id = {p["id"]: p for p in programs(router_url)}
    assert all(by_id[i]["steps"] == steps and not by_id[i]["inferred"] for i in ids), by_id
    explicit = hit_rate([by_id[i] for i in ids])
    for i in ids:
        httpx.post(f"{router_url}/programs/{i}/release").raise_for_status()
    httpx.post(router_url + "/flush_cache").raise_for_status()
    assert run("x", None) == [steps] * n
    progs = programs(router_url)
    assert len(progs) == n and all(p["inferred"] and p["steps"] == steps for p in progs), progs
    return progs, explicit, hit_rate(progs)
