"""Groups through the real router on simulated workers: members co-located, their task prompt
cached for the later members, completion per group, malformed group ids refused cleanly."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from openai import AsyncOpenAI

from thunder_sgl.children import http_ok, wait_until

TS = 10.0
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


def text(tokens: int, salt: str) -> str:
    words, i = [], 0
    while len(" ".join(words)) < tokens * 4:
        words.append(f"{WORDS[i % len(WORDS)]}{salt}" if i % 5 == 0 else WORDS[(i * 3) % len(WORDS)])
        i += 1
    return " ".join(words)


@pytest.fixture
def cluster(spawn):
    sim = spawn("sim", "tiny", workers=2, time_scale=TS)
    router = spawn("thunder", sim.urls, time_scale=TS, extra=["--thunder-group-id-pattern", r"^(.+)-s\d+$"])
    return sim, router


async def _member(client: AsyncOpenAI, url: str, pid: str, task: str, steps: int, how: str,
                  release: bool = True) -> list[int]:
    msgs = [{"role": "system", "content": text(400, "sys")}, {"role": "user", "content": task}]
    extra: dict = {"program_id": pid}
    headers: dict = {}
    if how == "body":
        extra["group_id"] = pid.rsplit("-s", 1)[0]
    elif how == "header":
        headers["X-Group-Id"] = pid.rsplit("-s", 1)[0]
    cached = []
    for _ in range(steps):
        r = await client.chat.completions.create(model="tiny", messages=msgs, max_tokens=16, extra_body=extra,
                                                 extra_headers=headers)
        cached.append(r.usage.prompt_tokens_details.cached_tokens)
        msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                 {"role": "user", "content": text(60, pid)}]
    if release:
        await _release(url, pid)
    return cached


async def _release(url: str, pid: str) -> None:
    async with httpx.AsyncClient() as h:
        assert (await h.post(f"{url}/programs/{pid}/release")).status_code == 200


def test_members_share_a_backend_and_their_task_prompt_and_groups_report_completion(cluster):
    _, router = cluster
    tasks = {g: text(600, g) for g in ("taskA", "taskB")}

    async def main():
        client = AsyncOpenAI(base_url=router.url + "/v1", api_key="none", max_retries=0)
        # the first member of each group alone, so its task prompt is cached for the others; it
        # stays live (acting) while they run: placement co-locates with live members first
        # (grouping.py)
        firsts = await asyncio.gather(*[_member(client, router.url, f"{g}-s0", t, 1, "body", release=False)
                                        for g, t in tasks.items()])
        # a second step of the others, named three ways: body field, header, derived from the id
        hows = ["body", "header", "derived"]
        rest = await asyncio.gather(*[_member(client, router.url, f"{g}-s{i + 1}", t, 2, hows[i])
                                      for g, t in tasks.items() for i in range(3)])
        for g in tasks:
            await _release(router.url, f"{g}-s0")
        await client.close()
        return firsts, rest

    # record where members ran while they are live: ask the router before release
    firsts, rest = asyncio.run(main())
    task_tokens = 600
    # Every later member found system + task cached on its first request: co-located with the
    # first member, whose backend holds the task prompt.
    assert all(c[0] >= 400 + task_tokens * 0.9 for c in rest), rest
    groups = httpx.get(router.url + "/groups").json()
    done = {g["id"]: g for g in groups["completed"]}
    assert set(done) == {"taskA", "taskB"} and groups["live"] == []
    for g in done.values():
        assert g["members"] == 4 and g["done"] == 4 and g["complete"]
        assert g["prefix_learned"] and g["prefix_tokens"] >= task_tokens * 0.9
        assert 0 < g["first_done_seconds"] <= g["median_done_seconds"] <= g["last_done_seconds"]
    one = httpx.get(router.url + "/groups/taskA").json()
    assert one["id"] == "taskA" and one["done"] == 4
    assert httpx.get(router.url + "/groups/nope").json()["error"]["code"] == "group_not_found"


def test_malformed_group_ids_are_400s_and_lose_nothing_already_accepted(cluster):
    _, router = cluster
    msgs = [{"role": "system", "content": text(200, "sys")}, {"role": "user", "content": text(100, "t")}]

    async def main():
        async with httpx.AsyncClient(base_url=router.url, timeout=60) as h:
            # an accepted request in flight, a long one
            inflight = asyncio.create_task(h.post("/v1/chat/completions", json={
                "model": "tiny", "messages": msgs, "max_tokens": 400, "program_id": "good-s0", "group_id": "good"}))
            await asyncio.sleep(0.3)
            bad = [
                {"program_id": "p1", "group_id": True},
                {"program_id": "p2", "group_id": "white space"},
                {"program_id": "p3", "group_id": "x" * 300},
                {"group_id": "orphan"},                      # no program
                {"program_id": "good-s0", "group_id": "other"},  # its program is in group "good"
            ]
            answers = [await h.post("/v1/chat/completions", json={"model": "tiny", "messages": msgs,
                                                                   "max_tokens": 4, **b}) for b in bad]
            ok = await inflight
            return answers, ok

    answers, ok = asyncio.run(main())
    for r in answers:
        assert r.status_code in (400, 409), r.text
        err = r.json()["error"]
        assert err["param"] == "group_id" or err["code"] == "program_busy"
        assert set(err) >= {"message", "type", "code", "param"}
    assert [r.json()["error"]["code"] for r in answers[:4]] == ["invalid_group_id"] * 4
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 400
    p = httpx.get(router.url + "/programs/good-s0").json()
    assert (p["group"], p["steps"], p["in_flight"]) == ("good", 1, 0)
    assert httpx.get(router.url + "/programs/p1").status_code == 404  # refused: never created
    wait_until(lambda: http_ok(router.url + "/health"), 5, "router alive")
