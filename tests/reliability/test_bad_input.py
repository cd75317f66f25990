"""Bad input gets a precise 4xx with an OpenAI-shaped error, and no state is corrupted."""

from __future__ import annotations

import threading

import httpx
import pytest

TS = 20.0
CHAT = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hello there"}]}


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    from thunder_sgl.benchmark.drivers.peers import start_sim, start_thunder

    logs = tmp_path_factory.mktemp("logs")
    sim = start_sim("tiny", workers=1, time_scale=TS, log_dir=logs)
    r = start_thunder(sim.urls, time_scale=TS, log_dir=logs,
                      extra=["--max-payload-size", "65536", "--thunder-sandbox-provider", "local"])
    yield r
    r.stop()
    sim.stop()


def openai_error(r: httpx.Response) -> dict:
    body = r.json()
    assert set(body) == {"error"} and {"message", "type", "code"} <= set(body["error"]), body
    return body["error"]


@pytest.mark.parametrize(
    ("method", "path", "kw", "status", "code"),
    [
        ("POST", "/v1/chat/completions", {"content": b"{not json"}, 400, "invalid_json"),
        ("POST", "/v1/chat/completions", {"content": b""}, 400, "invalid_json"),
        ("POST", "/v1/chat/completions", {"json": [1, 2]}, 400, "invalid_json"),
        ("POST", "/v1/chat/completions", {"json": {"messages": "hi"}}, 400, None),
        ("POST", "/v1/chat/completions", {"json": {**CHAT, "max_tokens": "many"}}, 400, None),
        ("POST", "/v1/chat/completions", {"json": {**CHAT, "program_id": "has space"}}, 400, "invalid_program_id"),
        ("POST", "/v1/chat/completions", {"json": CHAT, "headers": {"X-Program-Id": "x" * 300}}, 400, "invalid_program_id"),
        ("POST", "/v1/completions", {"json": {"prompt": {"a": 1}}}, 400, None),
        ("POST", "/generate", {"json": {"sampling_params": {}}}, 400, None),
        ("POST", "/v1/chat/completions", {"content": b"x" * 70_000}, 413, "payload_too_large"),
        ("POST", "/programs/release", {"content": b"y" * 70_000}, 413, "payload_too_large"),
        ("GET", "/no/such/route", {}, 404, 404),
        ("DELETE", "/v1/chat/completions", {}, 405, 405),
        ("GET", "/programs/never-seen", {}, 404, "program_not_found"),
        ("POST", "/programs/never-seen/release", {}, 404, "program_not_found"),
        ("POST", "/programs/release", {"json": {"program_id": "never-seen"}}, 404, "program_not_found"),
        ("POST", "/programs/release", {"json": {"id": "x"}}, 400, None),
        ("POST", "/programs/bad%20id/release", {}, 400, "invalid_program_id"),
        ("POST", "/workers", {"json": {"url": "ftp://x"}}, 400, None),
        ("DELETE", "/workers/not-a-worker", {}, 404, "worker_not_found"),
        ("POST", "/programs/never-seen/sandboxes/sb-1/exec", {"json": {"command": "true"}}, 404, None),
    ],
)
def test_bad_input_gets_a_precise_4xx(router, method, path, kw, status, code):
    r = httpx.request(method, router.url + path, timeout=10, **kw)
    assert r.status_code == status, r.text
    err = openai_error(r)
    if code is not None:
        assert err["code"] == code, err


def test_concurrent_requests_of_one_program_get_409_and_the_first_completes(router):
    body = {**CHAT, "max_tokens": 3000, "program_id": "busy"}   # ~30 s simulated (1.5 s real): long enough to overlap
    first: dict = {}
    t = threading.Thread(target=lambda: first.setdefault("r", httpx.post(router.url + "/v1/chat/completions", json=body, timeout=30)))
    t.start()
    import time

    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        p = httpx.get(router.url + "/programs/busy")
        if p.status_code == 200 and p.json()["in_flight"] == 1:
            break
        time.sleep(0.01)
    r = httpx.post(router.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 409 and openai_error(r)["code"] == "program_busy"
    t.join(30)
    assert first["r"].status_code == 200
    p = httpx.get(router.url + "/programs/busy").json()
    assert (p["in_flight"], p["held_requests"], p["steps"]) == (0, 0, 1)


def test_state_is_intact_after_bad_input(router):
    r = httpx.post(router.url + "/v1/chat/completions", json={**CHAT, "program_id": "after-bad"}, timeout=30)
    assert r.status_code == 200
    m = httpx.get(router.url + "/metrics").text
    assert "thunder_held_requests 0.0" in m
