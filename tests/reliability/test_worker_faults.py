"""Worker faults with real processes: crash mid-stream, dropped streams, silence, slowness."""

from __future__ import annotations

import asyncio
import threading
import time

import aiohttp
import httpx
import orjson
import pytest

from thunder_sgl.children import wait_until

TS = 10.0


def chat(url: str, pid: str | None, content: str, max_tokens: int = 16, stream: bool = False, timeout: float = 60):
    body = {"model": "tiny", "max_tokens": max_tokens, "stream": stream,
            "messages": [{"role": "user", "content": content}]}
    if pid:
        body["program_id"] = pid
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=timeout)


def workers(router_url: str) -> dict[str, dict]:
    return {w["url"]: w for w in httpx.get(router_url + "/workers").json()["workers"]}


def faults(worker_url: str, **kw) -> None:
    r = httpx.post(worker_url + "/sim/faults", json=kw, timeout=5)
    assert r.status_code == 200, r.text


@pytest.fixture
def two(spawn):
    """Two workers in two processes (a crash takes one down, not both) behind one router."""
    a, b = spawn("sim", "tiny", workers=1, time_scale=TS), spawn("sim", "tiny", workers=1, time_scale=TS)
    r = spawn("thunder", [a.url, b.url], time_scale=TS)
    return a, b, r


def test_worker_dying_mid_stream_gives_a_clear_error_and_its_programs_continue_elsewhere(two):
    a, b, r = two
    pids = [f"agent-{i}" for i in range(4)]
    for pid in pids:
        assert chat(r.url, pid, f"task of {pid} " * 40).status_code == 200
    on_a = [pid for pid in pids if httpx.get(f"{r.url}/programs/{pid}").json()["backend"] == a.url]
    assert on_a, "placement should spread four programs over two workers"
    victim = on_a[0]
    faults(a.url, die_mid_stream_after_tokens=3, die_mid_stream_mode="exit")
    with httpx.stream("POST", r.url + "/v1/chat/completions", timeout=60, json={
            "model": "tiny", "max_tokens": 200, "stream": True, "program_id": victim,
            "messages": [{"role": "user", "content": f"task of {victim} " * 40}]}) as s:
        events = [line for line in s.iter_lines() if line.startswith("data:")]
    assert events[-1] == "data: [DONE]"
    err = orjson.loads(events[-2][5:])
    assert err["error"]["type"] == "upstream_error" and "mid-stream" in err["error"]["message"]
    assert a.popen.wait(10) is not None                      # the worker process really died
    wait_until(lambda: not workers(r.url)[a.url]["is_healthy"], 15, "the dead worker to be marked unhealthy")
    # Every program, including those that lived on the dead worker, keeps going on the other one.
    for pid in pids:
        for _ in range(2):
            resp = chat(r.url, pid, f"task of {pid} " * 40 + " next")
            assert resp.status_code == 200, resp.text
        assert httpx.get(f"{r.url}/programs/{pid}").json()["backend"] == b.url
    assert httpx.get(r.url + "/programs").json()["count"] == len(pids)   # none lost


def test_a_stream_dropped_before_its_first_token_is_retried_transparently_on_its_worker(two):
    """The worker answered, so it is reachable: the retry goes to it again (where the program's
    KV is), under a fresh rid, and it stays healthy."""
    a, b, r = two
    assert chat(r.url, "p", "hello " * 30).status_code == 200
    home = httpx.get(f"{r.url}/programs/p").json()["backend"]
    faults(home, die_mid_stream_after_tokens=0, die_mid_stream_mode="drop")
    with httpx.stream("POST", r.url + "/v1/chat/completions", timeout=60, json={
            "model": "tiny", "max_tokens": 20, "stream": True, "program_id": "p",
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "hello " * 30 + " again"}]}) as s:
        events = [line for line in s.iter_lines() if line.startswith("data:")]
    assert events[-1] == "data: [DONE]" and not any('"error"' in e for e in events)
    assert sum('"role"' in e for e in events) == 1                # one answer, not a broken one plus a retry
    usage = orjson.loads(events[-2][5:])["usage"]
    assert usage["completion_tokens"] == 20 and usage["prompt_tokens_details"]["cached_tokens"] > 0
    assert httpx.get(f"{r.url}/programs/p").json()["backend"] == home
    assert all(w["is_healthy"] for w in workers(r.url).values())


async def _streams(url: str, clients: int, per_client: int) -> list[tuple[float, bool, list[bytes]]]:
    """``clients`` programs, each sending ``per_client`` streamed steps one after the other
    (every other one asks for the usage chunk): (seconds, usage asked, SSE data) per stream."""
    out: list[tuple[float, bool, list[bytes]]] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:

        async def program(i: int) -> None:
            for j in range(per_client):
                body = {"model": "tiny", "max_tokens": 8, "stream": True, "program_id": f"agent-{i}",
                        "messages": [{"role": "user", "content": f"task {i} " * 30 + f" step {j}"}]}
                if j % 2:
                    body["stream_options"] = {"include_usage": True}
                t0 = time.monotonic()
                async with http.post(url + "/v1/chat/completions", json=body) as resp:
                    assert resp.status == 200
                    raw = await resp.read()
                out.append((time.monotonic() - t0, bool(j % 2), [e[6:] for e in raw.split(b"\n\n") if e.startswith(b"data: ")]))

        await asyncio.gather(*(program(i) for i in range(clients)))
    return out


def test_streams_a_worker_breaks_under_concurrency_end_promptly_and_leave_no_program_reasoning(spawn):
    """One worker (nowhere to fail over to) breaking 30% of its streams, before or after their
    first event, under 32 concurrent programs. The router runs on production time constants
    (5 s ticks, 1 s polls): a stream that waited on a poll or a tick it did not need shows."""
    sim = spawn("sim", "tiny", workers=1, time_scale=TS)
    r = spawn("thunder", sim.urls, time_scale=1.0)
    faults(sim.url, break_streams_rate=0.3)
    results = asyncio.run(_streams(r.url, clients=32, per_client=6))
    complete = failed = 0
    for secs, usage_asked, events in results:
        assert secs < 2.0, f"a stream took {secs:.1f}s"
        assert events[-1] == b"[DONE]" and events.count(b"[DONE]") == 1
        objs = [orjson.loads(e) for e in events[:-1]]            # every event is whole JSON
        if "error" in objs[-1]:
            assert objs[-1]["error"]["type"] == "upstream_error" and "mid-stream" in objs[-1]["error"]["message"]
            content = objs[:-1]
            failed += 1
        else:
            usage = [o for o in objs if "usage" in o]                # hidden unless asked
            assert len(usage) == usage_asked and (not usage or usage[0]["usage"]["completion_tokens"] == 8)
            assert objs[-1 - usage_asked]["choices"][0]["finish_reason"] == "length"
            content = [o for o in objs if o["choices"] and o["choices"][0]["finish_reason"] is None]
            assert len(content) == 8
            complete += 1
        # one answer from its start, never a broken start glued to a retry
        assert not content or content[0]["choices"][0]["delta"].get("role") == "assistant"
        assert all("role" not in o["choices"][0]["delta"] for o in content[1:])
    assert complete + failed == 32 * 6 and complete > failed > 0
    assert "retrying the stream" in r.log_tail(100_000)           # streams broken before their first event
    progs = httpx.get(r.url + "/programs").json()["data"]
    assert len(progs) == 32
    assert all(p["phase"] == "acting" and p["in_flight"] == 0 and p["state"] == "active" for p in progs), progs
    assert all(w["is_healthy"] for w in workers(r.url).values())


def test_a_silent_worker_is_marked_unhealthy_in_bounded_time_and_rejoins(two):
    a, b, r = two
    faults(a.url, stop_answering=True)
    t0 = time.monotonic()
    wait_until(lambda: not workers(r.url)[a.url]["is_healthy"], 20, "the silent worker to be marked unhealthy")
    took = time.monotonic() - t0
    # failure_threshold (3) × (poll interval 1 s + request timeout 2 s) = 9 s, plus one poll of slack.
    assert took < 10.5, took
    # Work goes to the healthy worker meanwhile.
    assert chat(r.url, "meanwhile", "x " * 50).status_code == 200
    assert httpx.get(f"{r.url}/programs/meanwhile").json()["backend"] == b.url
    faults(a.url, stop_answering=False)
    wait_until(lambda: workers(r.url)[a.url]["is_healthy"], 10, "the worker to rejoin")


def test_a_slow_worker_gets_less_stateless_work(two):
    """Requests without a program id go to the backend with the fewest requests in flight:
    a worker that answers 300 ms slower accumulates in-flight requests and gets fewer.
    (``/v1/completions``: a chat request without an id is an inferred program's.)"""
    a, b, r = two
    faults(a.url, added_latency_ms=300)

    def served(url: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in httpx.get(url + "/metrics").text.splitlines()
                   if line.startswith("sglang:num_requests_total"))

    def client(i: int) -> None:
        for j in range(6):
            body = {"model": "tiny", "max_tokens": 4, "prompt": f"question {i}-{j} " * 10}
            assert httpx.post(r.url + "/v1/completions", json=body, timeout=60).status_code == 200

    before = {u: served(u) for u in (a.url, b.url)}
    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    got = {u: served(u) - before[u] for u in (a.url, b.url)}
    assert sum(got.values()) == 48 and got[a.url] < got[b.url] / 2, got
