"""Keys: the API key protects inference and per-program routes, the admin key the fleet-wide
ones; a sandbox answers only through its own program; keys never reach the logs."""

from __future__ import annotations

import httpx
import pytest

TS = 10.0
KEY, ADMIN = "sk-infer-0a1b2c3d4e5f", "sk-admin-9z8y7x6w5v"


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    from thunder_sgl.benchmark.drivers.peers import start_sim, start_thunder

    logs = tmp_path_factory.mktemp("logs")
    sim = start_sim("tiny", workers=1, time_scale=TS, log_dir=logs)
    r = start_thunder(sim.urls, time_scale=TS, log_dir=logs, extra=[
        "--api-key", KEY, "--thunder-admin-api-key", ADMIN, "--thunder-sandbox-provider", "local",
        "--log-level", "debug"])
    yield r
    r.stop()
    sim.stop()


def auth(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


CHAT = {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "program_id": "sec-1"}


@pytest.mark.parametrize(
    ("method", "path", "body", "needs"),
    [
        ("POST", "/v1/chat/completions", CHAT, KEY),
        ("POST", "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}}, KEY),
        ("GET", "/programs/sec-1", None, KEY),
        ("GET", "/programs", None, ADMIN),
        ("DELETE", "/programs", None, ADMIN),
        ("GET", "/workers", None, ADMIN),
        ("POST", "/workers", {"url": "http://127.0.0.1:9"}, ADMIN),
        ("GET", "/get_loads", None, ADMIN),
        ("POST", "/flush_cache", None, ADMIN),
        ("POST", "/continue_generation", {}, ADMIN),
        ("POST", "/abort_request", {"abort_all": True}, ADMIN),
        ("POST", "/programs/sec-1/sandboxes", {}, KEY),
    ],
)
def test_routes_need_their_key(secured, method, path, body, needs):
    url = secured.url + path
    wrong = [None, "sk-wrong"] + ([KEY] if needs == ADMIN else [])
    for key in wrong:
        r = httpx.request(method, url, json=body, headers=auth(key), timeout=30)
        assert r.status_code == 401, (key, r.text)
        assert r.json()["error"]["type"] == "authentication_error"
    if path == "/programs/sec-1":
        httpx.post(secured.url + "/v1/chat/completions", json=CHAT, headers=auth(KEY), timeout=30)
    r = httpx.request(method, url, json=body, headers=auth(needs), timeout=30)
    assert r.status_code in (200, 202), r.text
    if path == "/workers" and method == "POST":
        httpx.delete(f"{secured.url}/workers/{r.json()['worker_id']}", headers=auth(ADMIN))


def test_health_and_metrics_stay_open(secured):
    for path in ("/health", "/liveness", "/readiness", "/metrics", "/v1/models"):
        assert httpx.get(secured.url + path).status_code == 200, path


def test_a_sandbox_answers_only_through_its_own_program(secured):
    h = auth(KEY)
    for pid in ("owner", "stranger"):
        httpx.post(secured.url + "/v1/chat/completions", json={**CHAT, "program_id": pid}, headers=h, timeout=30)
    sid = httpx.post(f"{secured.url}/programs/owner/sandboxes", json={}, headers=h).json()["id"]
    ready = httpx.get(f"{secured.url}/programs/owner/sandboxes/{sid}?wait=20", headers=h, timeout=30).json()
    assert ready["status"] == "ready"
    r = httpx.post(f"{secured.url}/programs/stranger/sandboxes/{sid}/exec", json={"command": "echo hi"}, headers=h)
    assert r.status_code == 404
    r = httpx.post(f"{secured.url}/programs/owner/sandboxes/{sid}/exec", json={"command": "echo hi"}, headers=h, timeout=30)
    assert r.status_code == 200 and r.json()["stdout"].strip() == "hi"


def test_keys_never_appear_in_logs(secured):
    httpx.post(secured.url + "/v1/chat/completions", json=CHAT, headers=auth("sk-wrong"), timeout=30)
    httpx.post(secured.url + "/v1/chat/completions", json=CHAT, headers=auth(KEY), timeout=30)
    log = secured.log_path.read_text()
    assert "args:" in log                     # the start-up line with the (redacted) arguments
    assert KEY not in log and ADMIN not in log and "sk-wrong" not in log
