"""The thunder router as users run it: real sim workers, real router process, official OpenAI client."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI

from thunder_sgl.children import free_port, http_ok, wait_until

TS = 10.0  # simulated workers run at 10x real time; the router's time constants are divided by 10
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


def text(tokens: int, salt: str) -> str:
    """About ``tokens`` tokens of text (the simulator's tokenizer: ~4 characters per token)."""
    words, i = [], 0
    while len(" ".join(words)) < tokens * 4:
        words.append(f"{WORDS[i % len(WORDS)]}{salt}" if i % 7 == 0 else WORDS[(i * 5) % len(WORDS)])
        i += 1
    return " ".join(words)


def metrics(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("thunder_") and " " in line:
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


@pytest.fixture
def cluster(spawn):
    sim = spawn("sim", "tiny", workers=2, time_scale=TS)
    router = spawn("thunder", sim.urls, time_scale=TS, variant="paper", extra=["--thunder-decay-base", "1"])
    return sim, router


def test_a_programs_steps_are_served_with_growing_cache_hits(cluster):
    _, router = cluster
    client = OpenAI(base_url=router.url + "/v1", api_key="none")
    msgs = [{"role": "system", "content": text(500, "sys")}, {"role": "user", "content": text(300, "task")}]
    cached = []
    for _ in range(4):
        r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=32, extra_body={"program_id": "agent-1"})
        cached.append(r.usage.prompt_tokens_details.cached_tokens)
        msgs += [{"role": "assistant", "content": r.choices[0].message.content}, {"role": "user", "content": text(200, "obs")}]
    assert cached[0] == 0 and all(c > 0 for c in cached[1:])
    p = httpx.get(router.url + "/programs/agent-1").json()
    assert p["steps"] == 4 and p["state"] == "active" and p["phase"] == "acting"
    assert p["tokens"]["cached"] == sum(cached)
    # Release frees the accounting; a second release is a clear 404.
    assert httpx.post(router.url + "/programs/agent-1/release").json()["released"] is True
    assert httpx.get(router.url + "/programs/agent-1").status_code == 404
    r = httpx.post(router.url + "/programs/release", json={"program_id": "agent-1"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "program_not_found"


def test_requests_without_program_id_pass_through_statelessly(cluster):
    _, router = cluster
    client = OpenAI(base_url=router.url + "/v1", api_key="none")
    r = client.completions.create(model="tiny", prompt=text(50, "x"), max_tokens=8)
    assert r.usage.completion_tokens == 8
    g = httpx.post(router.url + "/generate", json={"text": "hello", "sampling_params": {"max_new_tokens": 4}}).json()
    assert g["meta_info"]["completion_tokens"] == 4
    assert httpx.get(router.url + "/programs").json()["count"] == 0


def test_under_kv_pressure_programs_pause_hold_and_complete(cluster):
    """10 programs grow to ~14 K tokens each on 2 workers of 32 K (paper variant: pool = HBM,
    no decay): at most ~4 fit at once, so acting programs are paused, their next requests
    held until a finished program is released, and every step of every program completes."""
    _, router = cluster
    seen_paused: set[str] = set()

    async def agent(i: int, client: AsyncOpenAI, h: httpx.AsyncClient) -> int:
        pid = f"load-{i}"
        msgs = [{"role": "system", "content": text(800, f"s{i}")}, {"role": "user", "content": text(4000, f"t{i}")}]
        for _ in range(6):
            r = await client.chat.completions.create(model="tiny", messages=msgs, max_tokens=48,
                                                     extra_body={"program_id": pid})
            msgs += [{"role": "assistant", "content": r.choices[0].message.content},
                     {"role": "user", "content": text(1500, f"o{i}")}]
            await asyncio.sleep(0.3)  # the tool call (3 s simulated)
        await h.post(f"{router.url}/programs/{pid}/release")
        return len(msgs)

    async def watch(stop: asyncio.Event, h: httpx.AsyncClient) -> None:
        while not stop.is_set():
            for p in (await h.get(router.url + "/programs")).json()["data"]:
                if p["state"] == "paused":
                    seen_paused.add(p["id"])
            await asyncio.sleep(0.05)

    async def main() -> list[int]:
        # closed here: an SDK client left to the collector closes itself in whatever loop runs
        # then, and a later test's loop logs the failure
        async with AsyncOpenAI(base_url=router.url + "/v1", api_key="none", max_retries=0, timeout=120) as client, \
                httpx.AsyncClient() as h:
            stop = asyncio.Event()
            w = asyncio.create_task(watch(stop, h))
            try:
                return await asyncio.gather(*(agent(i, client, h) for i in range(10)))
            finally:
                stop.set()
                await w

    lengths = asyncio.run(main())
    assert lengths == [14] * 10                     # every step of every program completed
    m = metrics(router.url)
    # Held requests beyond the 10 first ones (new programs wait for admission) are requests
    # of paused programs; each of them was restored before it completed.
    assert m["thunder_pauses_total"] > 0 and m["thunder_held_total"] > 10, m
    assert m["thunder_restores_total"] >= m["thunder_held_total"] - 10
    assert seen_paused, "no program was seen paused in /programs"
    assert httpx.get(router.url + "/programs").json()["count"] == 0   # all released
    assert m["thunder_released_total"] == 10


def test_a_paused_program_is_restored_on_another_worker_when_its_own_is_full(cluster):
    sim, router = cluster
    client = OpenAI(base_url=router.url + "/v1", api_key="none")

    def ask(pid: str, tokens: int, salt: str) -> None:
        client.chat.completions.create(model="tiny", max_tokens=16, extra_body={"program_id": pid},
                                       messages=[{"role": "user", "content": text(tokens, salt)}])

    ask("p1", 12_000, "a")   # -> worker A (both empty: the first)
    ask("p2", 12_000, "b")   # -> worker B (most free pool)
    ask("p3", 12_000, "c")   # -> A or B (equal room)
    where = {pid: httpx.get(f"{router.url}/programs/{pid}").json()["backend"] for pid in ("p1", "p2", "p3")}
    mate = "p1" if where["p3"] == where["p1"] else "p2"   # shares p3's worker
    other = "p2" if mate == "p1" else "p1"
    # The mate grows to ~24 K: its worker (32 K) can no longer hold p3 (acting): p3 is paused.
    ask(mate, 24_000, "grow")
    wait_until(lambda: httpx.get(f"{router.url}/programs/p3").json()["state"] == "paused", 10, "p3 paused")
    # p3's next request is held, then restored on the other worker (12 K + 12 K fit in 32 K).
    ask("p3", 12_100, "c")
    p3 = httpx.get(f"{router.url}/programs/p3").json()
    assert p3["backend"] == where[other] and p3["migrations"] == 1 and p3["restores"] == 1
    assert metrics(router.url)["thunder_migrations_total"] >= 1


@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_aborts_the_upstream_request(cluster, stream):
    sim, router = cluster
    body = {"model": "tiny", "stream": stream, "max_tokens": 30000, "program_id": "quitter",
            "messages": [{"role": "user", "content": text(200, "q")}]}
    if stream:
        with httpx.Client(timeout=30) as h, h.stream("POST", router.url + "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            for i, _ in enumerate(r.iter_lines()):
                if i > 5:
                    break  # leave with ~30000 tokens (≈ 30 s wall) still to generate
    else:
        with pytest.raises(httpx.ReadTimeout):  # give up after 0.5 s (≈ 5 s simulated of ~300)
            httpx.post(router.url + "/v1/chat/completions", json=body, timeout=httpx.Timeout(30, read=0.5))
    def idle() -> bool:
        loads = [httpx.get(u + "/v1/loads").json()["loads"][0] for u in sim.urls]
        return all(x["num_running_reqs"] == 0 and x["num_waiting_reqs"] == 0 for x in loads)
    # within 2 s: the request would run ~4 s more if the router missed the disconnect
    wait_until(idle, 2, "the worker to drop the aborted request")
    p = httpx.get(router.url + "/programs/quitter").json()
    assert p["in_flight"] == 0 and p["phase"] == "acting"
    # The program can continue.
    r = httpx.post(router.url + "/v1/chat/completions", json={**body, "stream": False, "max_tokens": 4})
    assert r.status_code == 200


def test_policy_cache_aware_starts_the_stock_router(spawn, log_dir):
    sim = spawn("sim", "tiny", workers=1, time_scale=TS)
    port = free_port()
    p = subprocess.Popen(
        [sys.executable, "-m", "thunder_sgl.launch_router", "--policy", "cache_aware", "--host", "127.0.0.1",
         "--port", str(port), "--worker-urls", sim.urls[0], "--log-level", "warn",
         "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()), "--thunder-time-scale", "10"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_ok(url + "/readiness"), 60, "stock router readiness")
        info = httpx.get(url + "/get_server_info").json()
        assert info == {"router_manager": True, "routers_count": 1, "workers_count": 1} or "policy" not in info
        body = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
        # The stock router may answer its first request or two with 5xx while it settles.
        wait_until(lambda: httpx.post(url + "/v1/chat/completions", json=body).status_code == 200, 20, "a stock chat")
        r = httpx.post(url + "/v1/chat/completions", json=body)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        assert httpx.get(url + "/programs").status_code == 404  # not ours: the stock router
    finally:
        import os
        import signal
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)


def test_each_dp_rank_is_a_backend_and_requests_are_pinned_to_it(spawn, tmp_path):
    from thunder_sgl.config import CONFIG_DIR

    cfg = tmp_path / "tiny-dp2.yaml"
    base = (CONFIG_DIR / "sim" / "tiny.yaml").read_text()
    cfg.write_text(base.replace("server:\n", "server:\n  dp_size: 2\n", 1))
    sim = spawn("sim", str(cfg), workers=1, time_scale=TS)
    router = spawn("thunder", sim.urls, time_scale=TS)
    keys = [b["key"] for b in httpx.get(router.url + "/workers").json()["workers"][0]["backends"]]
    assert keys == [sim.urls[0], sim.urls[0] + "#dp1"]
    client = OpenAI(base_url=router.url + "/v1", api_key="none")
    for pid in ("r0", "r1"):
        client.chat.completions.create(model="tiny", max_tokens=8, extra_body={"program_id": pid},
                                       messages=[{"role": "user", "content": text(3000, pid)}])
    placed = {httpx.get(f"{router.url}/programs/{pid}").json()["backend"] for pid in ("r0", "r1")}
    assert placed == set(keys)                   # one program per rank (most free pool)
    # num_total_tokens: device tokens in use, cached prefixes included (sim/exposition.py).
    held = [x["num_total_tokens"] for x in httpx.get(sim.urls[0] + "/v1/loads").json()["loads"]]
    assert all(u > 2500 for u in held), held     # each rank holds its program's KV: pinned, not balanced
