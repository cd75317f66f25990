"""Program inference through the router (``control.conversations``): unmodified OpenAI-SDK
agents, no program id anywhere, simulated workers, a real router process."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from openai import AsyncOpenAI
from test_router_e2e import TS, metrics, text


@pytest.fixture
def cluster(spawn):
    sim = spawn("sim", "tiny", workers=2, time_scale=TS)
    router = spawn("thunder", sim.urls, time_scale=TS)
    return sim, router


async def agent(client: AsyncOpenAI, steps: int, stream: bool, program_id: str | None = None,
                temperature: float | None = 1.0) -> list[int]:
    """One agent loop: a shared system prompt and task, then its answers and observations;
    returns the cached tokens of each step."""
    msgs = [{"role": "system", "content": text(400, "sys")}, {"role": "user", "content": text(200, "task")}]
    extra = {"program_id": program_id} if program_id else None
    kw = {"temperature": temperature} if temperature is not None else {}
    cached = []
    for step in range(steps):
        if stream:
            parts, usage = [], None
            async for ch in await client.chat.completions.create(
                    model="tiny", messages=msgs, max_tokens=24, stream=True, stream_options={"include_usage": True},
                    extra_body=extra, **kw):
                if ch.choices and ch.choices[0].delta.content:
                    parts.append(ch.choices[0].delta.content)
                usage = ch.usage or usage
            answer = "".join(parts)
        else:
            r = await client.chat.completions.create(model="tiny", messages=msgs, max_tokens=24, extra_body=extra, **kw)
            answer, usage = r.choices[0].message.content, r.usage
        cached.append(usage.prompt_tokens_details.cached_tokens)
        msgs = [*msgs, {"role": "assistant", "content": answer}, {"role": "user", "content": text(120, f"obs{step}")}]
    return cached


def test_unmodified_agents_sharing_a_prompt_and_a_task_each_land_in_one_inferred_program(cluster):
    _, router = cluster
    async def main() -> list[list[int]]:
        async with AsyncOpenAI(base_url=router.url + "/v1", api_key="none") as client:
            return await asyncio.gather(*(agent(client, 4, stream=i % 2 == 1) for i in range(6)))

    cached = asyncio.run(main())
    progs = httpx.get(router.url + "/programs").json()["data"]
    assert len(progs) == 6, progs
    assert all(p["inferred"] and p["id"].startswith("inf-") and p["steps"] == 4 for p in progs)
    assert sorted(p["tokens"]["cached"] for p in progs) == sorted(sum(c) for c in cached)
    m = metrics(router.url)
    assert m['thunder_inferred_requests_total{result="new"}'] == 6
    assert m['thunder_inferred_requests_total{result="matched"}'] == 18
    assert m['thunder_inferred_requests_total{result="ambiguous"}'] == 0
    assert all(c > 0 for cs in cached for c in cs[1:])  # every later step hits its own history


def test_greedy_agents_answered_alike_are_routed_statelessly_never_merged(cluster):
    """Without a temperature the simulator answers identical prompts identically (as greedy
    decoding does): four identical agents get four programs at their first steps (nothing to
    match yet), whose expectations are then equal; the second steps of two of them match all
    four, so they go statelessly and are counted; nothing is merged."""
    _, router = cluster
    async def main() -> None:
        async with AsyncOpenAI(base_url=router.url + "/v1", api_key="none") as client:
            await agent(client, 1, stream=False, temperature=None)
            await agent(client, 1, stream=False, temperature=None)
            await asyncio.gather(agent(client, 2, stream=False, temperature=None),
                                 agent(client, 2, stream=True, temperature=None))

    asyncio.run(main())
    progs = httpx.get(router.url + "/programs").json()["data"]
    assert len(progs) == 4 and all(p["steps"] == 1 for p in progs)
    m = metrics(router.url)
    assert m['thunder_inferred_requests_total{result="new"}'] == 4
    assert m['thunder_inferred_requests_total{result="ambiguous"}'] == 2
    assert m['thunder_inferred_requests_total{result="matched"}'] == 0


def test_a_one_shot_request_is_a_program_of_one_step_released_by_its_idle_timeout(spawn):
    sim = spawn("sim", "tiny", workers=1, time_scale=TS)
    # 60 s at least, divided by the time scale: 6 s
    router = spawn("thunder", sim.urls, time_scale=TS)
    r = httpx.post(router.url + "/v1/chat/completions", timeout=60, json={
        "model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "one question"}]})
    assert r.status_code == 200
    (p,) = httpx.get(router.url + "/programs").json()["data"]
    assert p["inferred"] and p["steps"] == 1
    from thunder_sgl.children import wait_until

    wait_until(lambda: httpx.get(router.url + "/programs").json()["count"] == 0, 20, "the idle release")
    assert metrics(router.url)["thunder_released_idle_total"] == 1


def test_an_explicit_id_wins_and_inference_can_be_turned_off(spawn):
    sim = spawn("sim", "tiny", workers=1, time_scale=TS)
    router = spawn("thunder", sim.urls, time_scale=TS, extra=["--thunder-infer-program-ids", "off"])

    async def run(program_id: str | None) -> None:  # a client per event loop, closed in it
        async with AsyncOpenAI(base_url=router.url + "/v1", api_key="none") as client:
            await agent(client, 2, stream=False, program_id=program_id)

    asyncio.run(run(None))
    assert httpx.get(router.url + "/programs").json()["count"] == 0
    asyncio.run(run("mine"))
    progs = httpx.get(router.url + "/programs").json()["data"]
    assert [(p["id"], p["inferred"], p["steps"]) for p in progs] == [("mine", False, 2)]
    assert "thunder_inferred_requests_total" not in httpx.get(router.url + "/metrics").text


def test_a_new_conversation_the_router_has_no_room_to_track_goes_statelessly(spawn, tmp_path):
    cfg = tmp_path / "thunder.yaml"
    cfg.write_text("programs:\n  max_programs: 2\n")
    sim = spawn("sim", "tiny", workers=1, time_scale=TS)
    router = spawn("thunder", sim.urls, time_scale=TS, extra=["--thunder-config", str(cfg)])

    async def main() -> None:
        async with AsyncOpenAI(base_url=router.url + "/v1", api_key="none") as client:
            await asyncio.gather(*(agent(client, 1, stream=False) for _ in range(2)))
            await agent(client, 2, stream=False)  # a third: answered, statelessly, never refused

    asyncio.run(main())
    assert httpx.get(router.url + "/programs").json()["count"] == 2
    m = metrics(router.url)
    assert m['thunder_inferred_requests_total{result="overflow"}'] == 2
    assert m['thunder_inferred_requests_total{result="new"}'] == 2  # each request counted once
    assert m['thunder_inferred_requests_total{result="matched"}'] == 0


async def prompt_agent(http: httpx.AsyncClient, url: str, steps: int, kind: str, i: int) -> int:
    """One agent over a prompt route, no id: the previous prompt plus the answer relayed plus
    an observation each step (``conversations`` rule 6); kind: completions, completions-stream,
    generate-text or generate-ids. Returns its steps."""
    prompt: str | list[int] = text(400, "sys") + text(200, "task")
    if kind == "generate-ids":
        prompt = [(ord(c) % 200) + 10 for c in prompt]
    for step in range(steps):
        if kind.startswith("completions"):
            body = {"model": "tiny", "prompt": prompt, "max_tokens": 24, "temperature": 1.0}
            if kind.endswith("stream"):
                parts = []
                async with http.stream("POST", url + "/v1/completions", json={**body, "stream": True}) as r:
                    assert r.status_code == 200
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            ch = httpx.Response(200, content=line[6:]).json()
                            parts += [c.get("text") or "" for c in ch.get("choices") or []]
                answer = "".join(parts)
            else:
                r = await http.post(url + "/v1/completions", json=body)
                assert r.status_code == 200, r.text
                answer = r.json()["choices"][0]["text"]
            prompt = prompt + answer + text(120, f"obs{i}-{step}")
        else:
            key = "input_ids" if kind == "generate-ids" else "text"
            r = await http.post(url + "/generate", json={key: prompt, "sampling_params": {"max_new_tokens": 24, "temperature": 1.0}})
            assert r.status_code == 200, r.text
            out = r.json()
            if key == "input_ids":
                prompt = [*prompt, *out["output_ids"], *[(ord(c) % 200) + 10 for c in text(120, f"obs{i}-{step}")]]
            else:
                prompt = prompt + out["text"] + text(120, f"obs{i}-{step}")
    return steps


def test_prompt_agents_without_ids_each_land_in_one_inferred_program(cluster):
    """``/v1/completions`` (plain and streamed) and ``/generate`` (text and token ids) agents
    that share a system prompt and a task, no id anywhere: each lands in one program, made at
    its second step (a first prompt goes statelessly, its answer recorded); nothing is
    ambiguous; an echoed prompt (its answer repeats it) goes statelessly."""
    _, router = cluster
    kinds = ["completions", "completions-stream", "generate-text", "generate-ids"] * 2

    async def main() -> None:
        async with httpx.AsyncClient(timeout=120) as http:
            await asyncio.gather(*(prompt_agent(http, router.url, 4, k, i) for i, k in enumerate(kinds)))
            r = await http.post(router.url + "/v1/completions", json={"model": "tiny", "max_tokens": 4, "echo": True,
                                                                        "prompt": "x " * 50})
            assert r.status_code == 200, r.text

    asyncio.run(main())
    progs = httpx.get(router.url + "/programs").json()["data"]
    assert len(progs) == len(kinds), progs
    assert all(p["inferred"] and p["steps"] == 3 for p in progs), progs
    m = metrics(router.url)
    assert m['thunder_inferred_requests_total{result="new"}'] == len(kinds)
    assert m['thunder_inferred_requests_total{result="matched"}'] == 3 * len(kinds)
    assert m['thunder_inferred_requests_total{result="ambiguous"}'] == 0


def test_an_answer_that_calls_none_of_the_offered_tools_hints_the_end_until_the_agent_asks_again(cluster):
    """``conversations`` rule 7 through the router: the simulated model answers in text, so a
    request that offers tools gets an answer calling none: a plain end hint, shown in
    ``/programs`` (streamed or not) until the program's next request; none without tools."""
    _, router = cluster
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}]

    def hint_of(task: str, stream: bool, offer: bool) -> list[str | None]:
        msgs = [{"role": "system", "content": text(300, "sys")}, {"role": "user", "content": text(100, task)}]
        seen = []
        for step in range(2):
            body = {"model": "tiny", "messages": msgs, "max_tokens": 16, **({"tools": tools} if offer else {})}
            if stream:
                parts = []
                with httpx.stream("POST", router.url + "/v1/chat/completions", json={**body, "stream": True},
                                  timeout=60) as r:
                    for line in r.iter_lines():
                        if line.startswith("data: ") and line != "data: [DONE]":
                            ch = json.loads(line[6:])
                            if ch.get("choices") and ch["choices"][0]["delta"].get("content"):
                                parts.append(ch["choices"][0]["delta"]["content"])
                answer = "".join(parts)
            else:
                r = httpx.post(router.url + "/v1/chat/completions", json=body, timeout=60)
                assert r.status_code == 200, r.text
                answer = r.json()["choices"][0]["message"]["content"]
            progs = [p for p in httpx.get(router.url + "/programs").json()["data"] if p["inferred"]]
            mine = [p for p in progs if p["steps"] == step + 1 and p["id"] not in seen_ids]
            assert len(mine) == 1, progs
            seen.append(mine[0]["end_hint"])
            msgs = [*msgs, {"role": "assistant", "content": answer}, {"role": "user", "content": text(60, f"obs{step}")}]
        seen_ids.update(p["id"] for p in httpx.get(router.url + "/programs").json()["data"])
        return seen

    seen_ids: set[str] = set()
    assert hint_of("a", stream=False, offer=True) == ["plain", "plain"]
    assert hint_of("b", stream=True, offer=True) == ["plain", "plain"]
    assert hint_of("c", stream=False, offer=False) == [None, None]
    m = metrics(router.url)
    assert m['thunder_inferred_requests_total{result="matched"}'] == 3  # every second step continued its program
    # two plain answers were followed by another request: the learnt share falls below its prior
    assert m['thunder_inferred_end_hint_share{kind="plain"}'] < 0.25
    assert m['thunder_inferred_end_hint_share{kind="sign"}'] == 0.75


def test_a_request_the_engine_refuses_for_its_context_hints_its_programs_end(cluster):
    """``conversations`` rule 7, *context overflow*, through the router: an unmodified agent's
    second request asks more than the model's context (32,768 tokens on the simulated worker,
    which refuses it with SGLang's 400); the client gets that 400 in OpenAI's shape, streamed or
    not, and the program keeps its one step with the hint, shown in ``/programs``. Another bad
    request hints nothing."""
    _, router = cluster

    def run(task: str, stream: bool, max_tokens: int) -> tuple[httpx.Response, dict]:
        msgs = [{"role": "system", "content": text(300, "sys")}, {"role": "user", "content": text(100, task)}]
        r = httpx.post(router.url + "/v1/chat/completions", timeout=60,
                       json={"model": "tiny", "messages": msgs, "max_tokens": 16, "temperature": 1.0})
        assert r.status_code == 200, r.text
        msgs = [*msgs, r.json()["choices"][0]["message"], {"role": "user", "content": text(60, "obs")}]
        r = httpx.post(router.url + "/v1/chat/completions", timeout=60, json={
            "model": "tiny", "messages": msgs, "max_tokens": max_tokens, "stream": stream, "temperature": 1.0})
        (p,) = [p for p in httpx.get(router.url + "/programs").json()["data"] if p["id"] not in seen]
        seen.add(p["id"])
        return r, p

    seen: set[str] = set()
    for task, stream in (("a", False), ("b", True)):
        r, p = run(task, stream, 40_000)
        assert r.status_code == 400 and "maximum context length" in r.json()["error"]["message"], r.text
        assert p["inferred"] and p["steps"] == 1 and p["end_hint"] == "context_overflow", p
    r, p = run("c", False, -5)  # refused too, for another reason
    assert r.status_code == 400 and "context" not in r.text, r.text
    assert p["steps"] == 1 and p["end_hint"] is None, p
    m = metrics(router.url)
    assert m['thunder_inferred_end_hint_share{kind="context_overflow"}'] == 0.75
    # the router knew: 40,000 asked beyond the worker's 32,768 (its /server_info), so both were
    # sent at once, outside admission (``Controller._beyond_context``), and refused
    assert m["thunder_beyond_context_total"] == 2 and m["thunder_beyond_context_served_total"] == 0
