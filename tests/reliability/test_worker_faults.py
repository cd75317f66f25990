"""Worker faults with real processes: crash mid-stream, dropped streams, silence, slowness."""

from __future__ import annotations

import threading
import time

import httpx
import orjson
import pytest

from thunder_sgl.bench.procs import wait_until

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


def test_a_stream_dropped_before_its_first_token_is_retried_transparently(two):
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
    usage = orjson.loads(events[-2][5:])["usage"]
    assert usage["completion_tokens"] == 20                      # a whole answer, from the other worker
    assert httpx.get(f"{r.url}/programs/p").json()["backend"] != home


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
    a worker that answers 300 ms slower accumulates in-flight requests and gets fewer."""
    a, b, r = two
    faults(a.url, added_latency_ms=300)

    def served(url: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in httpx.get(url + "/metrics").text.splitlines()
                   if line.startswith("sglang:num_requests_total"))

    def client(i: int) -> None:
        for j in range(6):
            assert chat(r.url, None, f"question {i}-{j} " * 10, max_tokens=4).status_code == 200

    before = {u: served(u) for u in (a.url, b.url)}
    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    got = {u: served(u) - before[u] for u in (a.url, b.url)}
    assert sum(got.values()) == 48 and got[a.url] < got[b.url] / 2, got
