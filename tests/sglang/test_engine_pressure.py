"""Pause and restore for real: more programs than the engine's pool holds; held requests come
back and nothing is lost. Two engines, one killed mid-run: its programs migrate to the other.
Stock sglang_router and smg in front of the same engines (the drop-in comparison)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from openai import AsyncOpenAI

from thunder_sgl.textgen import text

X = {"ignore_eos": True}


def metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def agent(client: AsyncOpenAI, h: httpx.AsyncClient, url: str, pid: str, steps: int,
                task_tokens: int, obs_tokens: int, tool_s: float, on_step=None) -> int:  # noqa: ANN001
    msgs = [{"role": "system", "content": text(300, "sys-pressure")},
            {"role": "user", "content": text(task_tokens, f"task-{pid}")}]
    done = 0
    for step in range(steps):
        r = await client.chat.completions.create(model="default", messages=msgs, max_tokens=8,
                                                 extra_body={"program_id": pid, **X})
        assert r.usage.completion_tokens == 8
        done += 1
        if on_step is not None:
            await on_step(pid, step)
        msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                 {"role": "user", "content": text(obs_tokens, f"obs-{pid}-{step}")}]
        await asyncio.sleep(tool_s)
    assert (await h.post(f"{url}/programs/{pid}/release")).status_code == 200
    return done


def test_more_programs_than_the_pool_holds_pause_hold_restore_and_all_complete(start_cluster, routers):
    """8 programs growing to ~1.9 K tokens each (≈ 15 K together) on a 6 K-token pool: at most
    ~3 run at once, so acting programs are paused and their next requests held, then restored;
    every step of every program completes. The admission is held at the watermarks: on this
    engine the goodput rule may admit past them (recompute is cheap here) and pause nothing,
    and what this test checks is the pause, hold and restore machinery."""
    engine = start_cluster(1, max_total_tokens=6144)
    thunder = routers("thunder", engine.urls, extra=["--thunder-admission", "fixed"])

    async def main() -> list[int]:
        async with AsyncOpenAI(base_url=thunder.url + "/v1", api_key="none", max_retries=0, timeout=600) as client, \
                httpx.AsyncClient(timeout=30) as h:
            return await asyncio.gather(*(agent(client, h, thunder.url, f"p{i}", 5, 1000, 120, 0.3) for i in range(8)))

    assert asyncio.run(main()) == [5] * 8
    assert metric(thunder.url, "thunder_pauses_total") > 0
    assert metric(thunder.url, "thunder_restores_total") > 0
    assert metric(thunder.url, "thunder_held_total") > 8       # beyond the 8 first requests (admission)
    assert metric(thunder.url, "thunder_held_expired_total") == 0
    assert httpx.get(thunder.url + "/programs", timeout=10).json()["count"] == 0


def test_programs_migrate_off_an_engine_that_is_killed(start_cluster, routers):
    engines = start_cluster(2, max_total_tokens=8192)
    thunder = routers("thunder", engines.urls)
    killed: dict[str, str] = {}

    async def main() -> list[int]:
        async with AsyncOpenAI(base_url=thunder.url + "/v1", api_key="none", max_retries=0, timeout=600) as client, \
                httpx.AsyncClient(timeout=30) as h:
            async def on_step(pid: str, step: int) -> None:
                if pid == "m0" and step == 1 and not killed:
                    where = {p["id"]: p["backend"] for p in (await h.get(thunder.url + "/programs")).json()["data"]}
                    victim = where["m0"]
                    killed["url"] = victim
                    killed["programs"] = ",".join(sorted(k for k, v in where.items() if v == victim))
                    engines.kill(engines.urls.index(victim))

            return await asyncio.gather(*(agent(client, h, thunder.url, f"m{i}", 4, 600, 100, 1.0, on_step)
                                          for i in range(4)))

    assert asyncio.run(main()) == [4] * 4      # no program lost a step
    assert killed, "the engine was never killed"
    survivor = next(u for u in engines.urls if u != killed["url"])
    workers = {w["url"]: w for w in httpx.get(thunder.url + "/workers", timeout=10).json()["workers"]}
    assert workers[killed["url"]]["is_healthy"] is False
    assert workers[survivor]["is_healthy"] is True
    # Every program that was on the killed engine still had steps to run: each one moved.
    moved = killed["programs"].split(",")
    assert "m0" in moved and metric(thunder.url, "thunder_migrations_total") >= len(moved)


@pytest.fixture(scope="module")
def two_engines(start_cluster):
    return start_cluster(2, max_total_tokens=8192)


@pytest.mark.parametrize("stock", ["sglang_router-cache_aware", "smg-cache_aware"])
def test_stock_routers_serve_the_same_engines(two_engines, routers, stock):
    engines = two_engines
    r = routers(stock, engines.urls)
    model = httpx.get(r.url + "/v1/models", timeout=30).json()["data"][0]["id"]  # smg routes by model name
    msgs = [{"role": "user", "content": text(500, f"stock-{stock}")}]
    body = {"model": model, "messages": msgs, "max_tokens": 8, **X}
    a = httpx.post(r.url + "/v1/chat/completions", json=body, timeout=120)
    assert a.status_code == 200, a.text
    assert a.json()["usage"]["completion_tokens"] == 8
    b = httpx.post(r.url + "/v1/chat/completions", json=body, timeout=120).json()
    # cache_aware sends the same prompt to the same engine: a real prefix hit.
    assert b["usage"]["prompt_tokens_details"]["cached_tokens"] >= a.json()["usage"]["prompt_tokens"] - 2
    g = httpx.post(r.url + "/generate", timeout=120,
                   json={"text": text(100, "stock-gen"), "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}})
    assert g.status_code == 200 and g.json()["meta_info"]["completion_tokens"] == 4
    f = httpx.post(r.url + "/flush_cache", timeout=60)
    assert f.status_code == 200
