"""Overload: bounded queues answer 429/503 with Retry-After; nothing accepted is lost;
waits are bounded by aging and the longest is reported."""

from __future__ import annotations

import asyncio

import httpx

TS = 10.0


def test_bounded_waiting_queue_answers_503_with_retry_after_and_loses_nothing(spawn, tmp_path):
    cfg = tmp_path / "thunder.yaml"
    cfg.write_text("gateway:\n  max_waiting_programs: 6\n  retry_after_seconds: 20\n")  # 2 s real at time scale 10
    sim = spawn("sim", "tiny", workers=1, time_scale=TS)
    r = spawn("thunder", sim.urls, time_scale=TS,
              extra=["--thunder-config", str(cfg), "--thunder-variant", "paper", "--thunder-decay-base", "1"])
    filler = "f" * 4 * 30_000   # ~30 K tokens: the 32 K worker is full, everything new must wait
    assert httpx.post(r.url + "/v1/chat/completions", timeout=60, json={
        "model": "tiny", "max_tokens": 4, "program_id": "filler",
        "messages": [{"role": "user", "content": filler}]}).status_code == 200

    async def one(i: int) -> httpx.Response:
        async with httpx.AsyncClient(timeout=60) as c:
            return await c.post(r.url + "/v1/chat/completions", json={
                "model": "tiny", "max_tokens": 4, "program_id": f"new-{i}",
                "messages": [{"role": "user", "content": f"{i} " * 6000}]})  # ~3 K tokens: none fits beside the filler

    async def main() -> list[httpx.Response]:
        tasks = [asyncio.create_task(one(i)) for i in range(10)]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15.0     # a loaded machine may take a while to send all ten
        while sum(t.done() for t in tasks) < 4 and loop.time() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)          # all ten have arrived: 6 are queued (held >= 1 s), 4 were refused
        refused = [t for t in tasks if t.done()]
        assert len(refused) == 4, [t.done() for t in tasks]
        async with httpx.AsyncClient() as c:
            await c.post(r.url + "/programs/filler/release")
        return await asyncio.gather(*tasks)

    results = asyncio.run(main())
    codes = sorted(x.status_code for x in results)
    assert codes == [200] * 6 + [503] * 4, codes
    for x in results:
        if x.status_code == 503:
            assert x.headers["retry-after"] == "2" and x.json()["error"]["type"] == "overloaded_error"
    m = httpx.get(r.url + "/metrics").text
    assert "thunder_held_requests 0.0" in m and "thunder_waiting_programs 0.0" in m
    waits = {line.split()[0]: float(line.split()[1]) for line in m.splitlines()
             if line.startswith("thunder_held_wait_max_seconds")}
    assert 0.9 < waits["thunder_held_wait_max_seconds"] < 30     # reported (held >= 1 s), and bounded


def test_held_requests_past_their_timeout_get_503_and_the_program_stays_queued(spawn, tmp_path):
    cfg = tmp_path / "thunder.yaml"
    cfg.write_text("gateway:\n  held_timeout_seconds: 20\n")   # 2 s real at time scale 10
    sim = spawn("sim", "tiny", workers=1, time_scale=TS)
    r = spawn("thunder", sim.urls, time_scale=TS,
              extra=["--thunder-config", str(cfg), "--thunder-variant", "paper", "--thunder-decay-base", "1"])
    assert httpx.post(r.url + "/v1/chat/completions", timeout=60, json={
        "model": "tiny", "max_tokens": 4, "program_id": "filler",
        "messages": [{"role": "user", "content": "f" * 4 * 30_000}]}).status_code == 200
    x = httpx.post(r.url + "/v1/chat/completions", timeout=60, json={
        "model": "tiny", "max_tokens": 4, "program_id": "late",
        "messages": [{"role": "user", "content": "late " * 3000}]})
    assert x.status_code == 503 and x.json()["error"]["code"] == "held_timeout" and "retry-after" in x.headers
    p = httpx.get(r.url + "/programs/late").json()
    assert (p["state"], p["held_requests"]) == ("new", 0)
