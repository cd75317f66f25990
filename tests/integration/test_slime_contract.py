"""slime's router contract: slime's calls to its router, replayed in slime's order against
thunder and against sglang_router 0.3.2 itself, on simulated SGLang workers.

What slime calls (THUDM/slime at commit 624b824a898ab0ec1fcb4d373004c7f3852bf515, 2026-08-21):

- ``slime/ray/rollout.py`` ``_start_router``: starts sglang_router with no worker
  (``RouterArgs.from_cli_args``, ``slime/utils/http_utils.py`` ``run_router`` → ``launch_router``),
  unless ``--sglang-router-ip``/``--sglang-router-port`` name a router already running.
- ``slime/backends/sglang_utils/sglang_engine.py`` ``_register_to_router``: each engine, once
  healthy, ``POST /workers {"url": "http://host:port", "worker_type": "regular"}``
  (``"prefill"`` plus ``"bootstrap_port"`` / ``"decode"`` under PD), then ``raise_for_status()``.
- ``slime/rollout/sglang_rollout.py`` ``generate``: ``POST /generate {"input_ids",
  "sampling_params", "return_logprob": true}`` with header ``X-SMG-Routing-Key: <session_id>``
  (with ``--router-policy consistent_hashing``; ``slime/agent/adapters/common.py`` always);
  reads ``text`` and ``meta_info`` (``finish_reason.type``, ``weight_version``, token counts).
- ``slime/rollout/sglang_rollout.py`` ``abort``: ``GET /workers`` → ``[w["url"] for w in
  r["workers"]]``, then ``POST {url}/abort_request {"abort_all": true}`` and
  ``GET {url}/v1/loads?include=core`` on each engine (``slime/backends/sglang_utils/server_control.py``).
- ``sglang_engine.py`` ``shutdown``: ``GET /workers``, the item whose ``url`` equals the
  engine's, ``DELETE /workers/{item["id"]}``, ``raise_for_status()``.
- Before slime v0.3.1 (commit a6272da0d dropped it), by ``sglang_router.__version__``:
  ≤ 0.2.1 ``POST /add_worker?url=``, ``GET /list_workers`` → ``["urls"]``,
  ``POST /remove_worker?url=``; 0.2.2–0.2.x ``DELETE /workers/{quote(url, safe="")}``.

sglang_router 0.3.2's replies to the same calls are in
``tests/data/sglang_router-0.3.2-slime-replay.json``, written by this module
(``python tests/integration/test_slime_contract.py --capture``). thunder's replies must have
the same status codes and every key with the same JSON type (``covers``), except where
docs/rl.md §9 says otherwise: OpenAI-shaped error bodies, 400 instead of 422 for a field of
the wrong type, and the metadata keys the worker does not report.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from thunder_sgl.benchmark.drivers.peers import start_sim, start_stock
from thunder_sgl.children import Proc, http_ok, wait_until
from thunder_sgl.gateway.worker_bodies import WORKER_FIELDS

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "sglang_router-0.3.2-slime-replay.json"
HAS_STOCK = importlib.util.find_spec("sglang_router") is not None
SESSION = "slime-sample-7"
TIME_SCALE = 20.0


# ---- the replay ---------------------------------------------------------------------------
def _wait(what: str, ok, timeout: float = 60.0) -> Any:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while True:
        v = ok()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _workers(router: str) -> list[dict[str, Any]]:
    r = httpx.get(router + "/workers", timeout=10)
    r.raise_for_status()
    return r.json()["workers"]  # slime: requests.get(...).json()["workers"]


def served(engines: list[str]) -> list[float]:
    """Requests each engine has served (the simulated worker's ``sglang:num_requests_total``)."""
    out = []
    for url in engines:
        text = httpx.get(url + "/metrics", timeout=10).text
        out.append(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith("sglang:num_requests_total{")))
    return out


def slime_generate(router: str, i: int, session: str | None = SESSION) -> dict[str, Any]:
    """``sglang_rollout.generate``'s call and what it reads of the answer."""
    payload = {"input_ids": [101 + i, 7, 8, 9, 10], "return_logprob": True,
               "sampling_params": {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 4}}
    r = httpx.post(router + "/generate", json=payload, headers={"X-SMG-Routing-Key": session} if session else None,
                   timeout=30)
    assert r.status_code == 200, r.text
    out = r.json()
    meta = out["meta_info"]
    assert isinstance(out["text"], str)
    assert meta["finish_reason"]["type"] in ("length", "stop", "abort")
    assert isinstance(meta["weight_version"], str)
    assert all(isinstance(meta.get(k), int) for k in ("prompt_tokens", "completion_tokens", "cached_tokens"))
    return out


def num_requests_from_load(load: Any) -> int:
    """``server_control.num_requests_from_load`` for SGLang's ``/v1/loads`` answer."""
    return sum(r.get("num_running_reqs", 0) + r.get("num_waiting_reqs", 0) for r in load["loads"])


def replay(router: str, engines: list[str], sticky: bool) -> dict[str, Any]:
    """slime's calls in slime's order, asserting what slime relies on; returns every reply
    (status and JSON body) by step. ``sticky``: also assert that one routing key kept every
    request on one engine (thunder's policy; stock cache_aware does not promise it)."""
    seen: dict[str, Any] = {}

    def record(step: str, r: httpx.Response) -> httpx.Response:
        seen[step] = {"status": r.status_code, "body": r.json() if r.content else None}
        return r

    record("list_empty", httpx.get(router + "/workers", timeout=10))
    assert seen["list_empty"]["body"]["workers"] == []

    # 1. every engine registers, as _register_to_router does (no wait for the router after)
    ids = {}
    for n, url in enumerate(engines):
        r = httpx.post(router + "/workers", json={"url": url, "worker_type": "regular"}, timeout=10)
        r.raise_for_status()
        if n == 0:
            record("register", r)
        ids[url] = r.json()["worker_id"]
    again = record("register_again", httpx.post(router + "/workers", json={"url": engines[0], "worker_type": "regular"},
                                                timeout=10))
    assert again.status_code == 202 and again.json()["worker_id"] == ids[engines[0]]
    _wait("every engine listed healthy",
          lambda: sorted(w["url"] for w in _workers(router) if w["is_healthy"]) == sorted(engines))
    record("list", httpx.get(router + "/workers", timeout=10))
    assert {w["url"]: w["id"] for w in seen["list"]["body"]["workers"]} == ids
    record("get_worker", httpx.get(f"{router}/workers/{ids[engines[0]]}", timeout=10))
    assert seen["get_worker"]["body"]["url"] == engines[0]

    # 2. rollouts: one session's turns carry its routing key
    before = served(engines)
    for i in range(6):
        out = slime_generate(router, i)
    seen["generate"] = {"status": 200, "body": out}
    delta = [a - b for a, b in zip(served(engines), before, strict=True)]
    assert sum(delta) == 6, delta
    if sticky:
        assert sorted(delta) == [0.0] * (len(engines) - 1) + [6.0], f"one session spread over engines: {delta}"

    # 3. abort(): the engines listed by the router are aborted directly until idle
    urls = [w["url"] for w in _workers(router)]
    assert sorted(urls) == sorted(engines)
    for url in urls:
        httpx.post(url + "/abort_request", json={"abort_all": True}, timeout=10).raise_for_status()
        assert num_requests_from_load(httpx.get(url + "/v1/loads?include=core", timeout=10).json()) == 0

    # 4. shutdown() of one engine: find its id by URL, delete it
    gone = engines[0]
    worker_id = next(w["id"] for w in _workers(router) if w["url"] == gone)
    record("delete", httpx.delete(f"{router}/workers/{worker_id}", timeout=10)).raise_for_status()
    _wait("the removed engine to leave the list", lambda: gone not in [w["url"] for w in _workers(router)])
    record("list_after_delete", httpx.get(router + "/workers", timeout=10))
    record("delete_again", httpx.delete(f"{router}/workers/{worker_id}", timeout=10))
    record("get_unknown", httpx.get(f"{router}/workers/{uuid.UUID(int=0)}", timeout=10))
    before = served(engines)
    for i in range(4):
        slime_generate(router, 10 + i)
        slime_generate(router, 20 + i, session=f"other-{i}")
    delta = [a - b for a, b in zip(served(engines), before, strict=True)]
    assert delta[0] == 0 and sum(delta) == 8, f"requests reached the removed engine: {delta}"

    # 5. the engine comes back (fault-tolerance recover) and registers again
    r = record("register_back", httpx.post(router + "/workers", json={"url": gone, "worker_type": "regular"}, timeout=10))
    r.raise_for_status()
    _wait("the engine back in the list",
          lambda: gone in [w["url"] for w in _workers(router) if w["is_healthy"]])

    # 6. a field of sglang_router's WorkerConfigRequest with the wrong type is refused, before registration
    seen["wrong_type"] = {name: httpx.post(router + "/workers", json={"url": "http://127.0.0.1:9", name: {"x": [1]}},
                                           timeout=10).status_code for name in WORKER_FIELDS}
    return seen


# ---- comparing replies --------------------------------------------------------------------
METADATA_OPTIONAL = {"served_model_name", "load_balance_method", "architectures", "model_type"}
"""sglang_router 0.3.2's ``metadata`` keys thunder shows only when the worker reports them."""
WORKER_OPTIONAL = {"job_status"}
"""Shown by sglang_router 0.3.2's ``GET /workers/{id}`` only while it keeps the worker's last
background job (here: the duplicate add of ``register_again``, pending then failed); thunder
shows ``registered`` and ``last_error`` instead. Not compared."""
ERROR_STEPS = {"delete_again", "get_unknown"}
"""Status compared, body not: thunder answers errors with the OpenAI error object."""


def covers(ours: Any, theirs: Any, where: str = "$") -> list[str]:
    """Where ``ours`` lacks a key of ``theirs`` or holds another JSON type (lists: each of
    ours against the first of theirs)."""
    if isinstance(theirs, dict):
        if not isinstance(ours, dict):
            return [f"{where}: {type(ours).__name__}, not an object"]
        out = []
        for k, v in theirs.items():
            if k in WORKER_OPTIONAL and "url" in theirs:
                continue  # its content changes as the job runs (message null, then a string)
            if k not in ours:
                if not (where.endswith(".metadata") and k in METADATA_OPTIONAL):
                    out.append(f"{where}.{k}: missing")
                continue
            out += covers(ours[k], v, f"{where}.{k}")
        return out
    if isinstance(theirs, list):
        if not isinstance(ours, list):
            return [f"{where}: {type(ours).__name__}, not a list"]
        return [p for i, x in enumerate(ours) for p in covers(x, theirs[0], f"{where}[{i}]")] if theirs else []
    kind = {bool: "bool", int: "number", float: "number", str: "str", type(None): "null"}
    if kind[type(ours)] != kind[type(theirs)]:
        return [f"{where}: {type(ours).__name__}, sglang_router has {type(theirs).__name__}"]
    return []


def compare(seen: dict[str, Any], stock: dict[str, Any], wrong_type_status: int) -> None:
    problems = []
    for step, want in stock["replies"].items():
        got = seen[step]
        if got["status"] != want["status"]:
            problems.append(f"{step}: status {got['status']}, sglang_router {want['status']}")
        elif step not in ERROR_STEPS and step != "wrong_type":
            problems += [f"{step}: {p}" for p in covers(got["body"], want["body"])]
    assert stock["replies"].keys() <= seen.keys()
    assert set(stock["wrong_type"]) == set(WORKER_FIELDS) and set(stock["wrong_type"].values()) == {422}
    assert seen["wrong_type"] == dict.fromkeys(WORKER_FIELDS, wrong_type_status)
    assert not problems, "\n".join(problems)


# ---- routers --------------------------------------------------------------------------------
def start_stock_empty(log_dir: Path) -> Proc:
    """sglang_router 0.3.2 started as slime starts it: no worker, engines register later."""
    p = start_stock([], policy="cache_aware", log_dir=log_dir)
    wait_until(lambda: http_ok(p.url + "/health"), 60, "sglang_router /health", p)
    return p


@pytest.fixture
def engines(spawn) -> list[str]:  # noqa: ANN001
    return spawn("sim", "tiny", workers=3, time_scale=TIME_SCALE).urls


def test_thunder_answers_slimes_calls_as_sglang_router_does(spawn, engines):  # noqa: ANN001
    thunder = spawn("thunder", [], time_scale=TIME_SCALE)
    seen = replay(thunder.url, engines, sticky=True)
    stock = json.loads(FIXTURE.read_text())
    compare(seen, stock, wrong_type_status=400)
    assert seen["register"]["body"]["location"] == f"/workers/{seen['register']['body']['worker_id']}"
    assert seen["list"]["body"]["stats"] == {"prefill_count": 0, "decode_count": 0, "regular_count": 3}


@pytest.mark.skipif(not HAS_STOCK, reason="sglang_router is not installed")
def test_the_replay_passes_against_sglang_router_and_matches_the_fixture(spawn, engines):  # noqa: ANN001
    """The assertions of ``replay`` are what a slime deployment on the stock router gets, and
    the fixture is still what sglang_router answers (in both directions)."""
    stock = spawn(start_stock_empty)
    seen = replay(stock.url, engines, sticky=False)
    fixture = json.loads(FIXTURE.read_text())
    compare(seen, fixture, wrong_type_status=422)
    for step, want in fixture["replies"].items():
        if step not in ERROR_STEPS:
            assert not covers(want["body"], seen[step]["body"]), step


def test_thunder_takes_older_slimes_calls_and_refuses_pd_workers(spawn, engines):  # noqa: ANN001
    """slime before v0.3.1 with sglang_router ≤ 0.2.1 (legacy routes) and 0.2.x (DELETE by the
    URL-encoded URL); and the fields slime sends under PD, which thunder cannot serve."""
    u = spawn("thunder", [], time_scale=TIME_SCALE).url
    r = httpx.post(u + "/add_worker", params={"url": engines[0]}, timeout=60)
    assert r.status_code == 200 and r.text == f"Successfully added worker: {engines[0]}"
    assert [w["is_healthy"] for w in _workers(u)] == [True]  # answered once registered, as 0.2.x did
    assert httpx.get(u + "/list_workers", timeout=10).json() == {"urls": [engines[0]]}
    slime_generate(u, 0)
    r = httpx.post(u + "/remove_worker", params={"url": engines[0]}, timeout=10)
    assert r.status_code == 200 and r.text == f"Successfully removed worker: {engines[0]}"
    assert httpx.get(u + "/list_workers", timeout=10).json() == {"urls": []}
    assert httpx.post(u + "/remove_worker", params={"url": engines[0]}, timeout=10).status_code == 404
    assert httpx.post(u + "/add_worker", timeout=10).json()["error"]["param"] == "url"

    httpx.post(u + "/workers", json={"url": engines[1], "worker_type": "regular"}, timeout=10).raise_for_status()
    r = httpx.delete(u + "/workers/" + urllib.parse.quote(engines[1], safe=""), timeout=10)
    assert r.status_code == 202 and _workers(u) == []

    for body in ({"url": engines[2], "worker_type": "prefill", "bootstrap_port": 8998},
                 {"url": engines[2], "worker_type": "decode"}):
        r = httpx.post(u + "/workers", json=body, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_worker_type", r.text
    r = httpx.post(u + "/workers", json={"url": engines[2], "api_key": "not-the-routers"}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_worker_api_key"
    assert _workers(u) == []

    # every field sglang_router accepts is taken and shown as sglang_router shows it
    r = httpx.post(u + "/workers", json={"url": engines[2], "worker_type": "regular", "model_id": "policy-v0",
                                         "priority": 7, "cost": 2.5, "labels": {"role": "rollout"},
                                         "disable_health_check": True, "bootstrap_port": 1234, "runtime": "sglang",
                                         "tokenizer_path": "/tok", "health_check_timeout_secs": 5, "dp_aware": False,
                                         "some_later_field": 1}, timeout=10)
    assert r.status_code == 202, r.text
    w = _wait("the worker registered", lambda: [w for w in _workers(u) if w["is_healthy"]])[0]
    assert (w["model_id"], w["priority"], w["cost"], w["disable_health_check"]) == ("policy-v0", 7, 2.5, True)
    assert w["metadata"]["role"] == "rollout" and w["metadata"]["priority"] == "7"
    assert [m["id"] for m in httpx.get(u + "/v1/models", timeout=10).json()["data"]] == ["policy-v0"]
    r = httpx.put(f"{u}/workers/{w['id']}", json={"priority": 3, "cost": "cheap"}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "cost"
    assert httpx.put(f"{u}/workers/{w['id']}", json={"priority": 3}, timeout=10).status_code == 202
    assert _workers(u)[0]["priority"] == 3


# ---- capture ------------------------------------------------------------------------------
def normalise(value: Any, names: dict[str, str]) -> Any:
    """Ids and URLs replaced by placeholders (values are not compared, keys and types are)."""
    if isinstance(value, dict):
        return {k: normalise(v, names) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise(v, names) for v in value]
    if isinstance(value, str):
        for old, new in names.items():
            value = value.replace(old, new)
    return value


def capture() -> None:
    """Replay against sglang_router 0.3.2 and write the fixture."""
    import sglang_router

    logs = Path("/tmp/slime-contract-capture")
    logs.mkdir(exist_ok=True)
    sim = start_sim("tiny", workers=3, time_scale=TIME_SCALE, log_dir=logs)
    router = start_stock_empty(logs)
    try:
        seen = replay(router.url, sim.urls, sticky=False)
    finally:
        router.stop()
        sim.stop()
    names = {url: f"<engine {i}>" for i, url in enumerate(sim.urls)}
    for step in seen.values():
        body = step.get("body") if isinstance(step, dict) else None
        for w in (body or {}).get("workers", []) if isinstance(body, dict) else []:
            names.setdefault(w["id"], f"<id {len(names)}>")
    for step in seen.values():
        if isinstance(step, dict) and isinstance(step.get("body"), dict):
            for key in ("worker_id", "id"):
                if isinstance(step["body"].get(key), str):
                    names.setdefault(step["body"][key], f"<id {len(names)}>")
    wrong_type = seen.pop("wrong_type")
    FIXTURE.write_text(json.dumps({
        "source": f"sglang_router {sglang_router.__version__} (python -m sglang_router.launch_router --policy "
                  "cache_aware, no --worker-urls) in front of 3 simulated workers (thunder_sgl.sim --config tiny); "
                  "written by python tests/integration/test_slime_contract.py --capture",
        "replies": normalise(seen, names), "wrong_type": wrong_type}, indent=1) + "\n")
    print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--capture"]:
        sys.exit("usage: python tests/integration/test_slime_contract.py --capture")
    capture()
