"""Weight sync as RL frameworks do it, through thunder, on simulated workers (real processes):
the weight update group with each engine at its own rank offset, broadcast distributed updates,
a tensor update addressed to one worker, version and LoRA fan-out, and a worker whose update
failed kept out of routing until it reports the expected version — with no request lost."""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path

import httpx
import pytest

from thunder_sgl.children import wait_until

TS = 10.0
TINY = Path(__file__).resolve().parents[2] / "configs" / "sim" / "tiny.yaml"
GROUP = {"master_address": "127.0.0.1", "master_port": 29500, "rank_offset": 1, "group_name": "wsync"}
TENSORS = {"names": ["model.embed_tokens.weight"], "dtypes": ["bfloat16"], "shapes": [[151936, 4096]],
           "group_name": "wsync"}


def tiny_with_tp(tmp_path: Path, tp: int) -> str:
    text = TINY.read_text()
    assert "  tp_size: 1\n" in text
    path = tmp_path / f"tiny-tp{tp}.yaml"
    path.write_text(text.replace("  tp_size: 1\n", f"  tp_size: {tp}\n"))
    return str(path)


def chat(pid: str, step: int, max_tokens: int = 16) -> dict:
    msgs = [{"role": "system", "content": "You are a rollout agent. " * 40},
            {"role": "user", "content": f"task of {pid}: " + "solve it " * 60}]
    for i in range(step):
        msgs += [{"role": "assistant", "content": f"step {i} of {pid} " * 8}, {"role": "user", "content": "observation " * 30}]
    return {"model": "tiny", "messages": msgs, "max_tokens": max_tokens, "program_id": pid}


def assert_openai_error(r: httpx.Response, status: int, code: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "code", "param"} and err["message"]
    if code is not None:
        assert err["code"] == code, err
    return r.json()


def sim_state(url: str) -> dict:
    return httpx.get(url + "/sim/state", timeout=10).json()


def workers(router: str) -> dict[str, dict]:
    return {w["url"]: w for w in httpx.get(router + "/workers", timeout=10).json()["workers"]}


def test_update_group_ranks_follow_each_engines_tp_size_and_distributed_updates_broadcast(spawn, tmp_path):
    """Three engines of TP 2, 1 and 4 behind thunder: each joins the group at the rank offset
    after the ranks of the engines before it; a world size too small is refused before any
    engine waits on the rendezvous; the distributed update and the destroy reach every engine."""
    sims = [spawn("sim", tiny_with_tp(tmp_path, tp), workers=1, time_scale=TS, name=f"sim-tp{tp}") for tp in (2, 1, 4)]
    urls = [s.url for s in sims]
    router = spawn("thunder", urls, time_scale=TS)
    u = router.url
    assert [workers(u)[x]["tp_size"] for x in urls] == [2, 1, 4]

    r = httpx.post(u + "/init_weights_update_group", json={**GROUP, "world_size": 7}, timeout=30)
    assert "at least 8" in assert_openai_error(r, 400, "world_size_too_small")["error"]["message"]
    assert all(sim_state(x)["weight_groups"] == {} for x in urls)  # no engine was called

    r = httpx.post(u + "/init_weights_update_group", json={**GROUP, "world_size": 8}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["success"] is True and body["rank_offsets"] == {urls[0]: 1, urls[1]: 3, urls[2]: 4}
    assert body["ranks_used"] == 8 and len(body["workers"]) == 3
    # what each engine was asked to do: its own offset, the rest of the body unchanged
    got = {x: sim_state(x)["weight_groups"]["wsync"] for x in urls}
    assert [got[x]["ranks"] for x in urls] == [[1, 2], [3], [4, 5, 6, 7]]
    assert all((g["world_size"], g["master_port"]) == (8, 29500) for g in got.values())
    # a second init of the same group: every engine refuses alike, SGLang's 400, OpenAI-shaped
    assert_openai_error(httpx.post(u + "/init_weights_update_group", json={**GROUP, "world_size": 8}, timeout=30), 400)

    r = httpx.post(u + "/update_weights_from_distributed", json={**TENSORS, "weight_version": "d1"}, timeout=60)
    assert r.status_code == 200, r.text
    assert (r.json()["success"], r.json()["workers_updated"], r.json()["weight_version"]) == (True, 3, "d1")
    assert r.json()["window"]["open"] is False and r.json()["out_of_routing"] == {}
    assert [sim_state(x)["weight_version"] for x in urls] == ["d1"] * 3
    v = httpx.get(u + "/get_weight_version", timeout=30).json()
    assert (v["weight_version"], v["consistent"], v["versions"]) == ("d1", True, dict.fromkeys(urls, "d1"))

    r = httpx.post(u + "/destroy_weights_update_group", json={"group_name": "wsync"}, timeout=30)
    assert r.status_code == 200 and r.json()["success"] is True, r.text
    assert all(sim_state(x)["weight_groups"] == {} for x in urls)
    # destroyed twice, or an update without a group: refused alike by every engine (nothing
    # changed anywhere), so no engine is kept out of routing
    body = assert_openai_error(httpx.post(u + "/destroy_weights_update_group", json={"group_name": "wsync"}), 400)
    assert "does not exist" in body["message"]
    body = assert_openai_error(httpx.post(u + "/update_weights_from_distributed", json=TENSORS, timeout=60), 400)
    assert body["success"] is False and body["workers_updated"] == 0 and body["out_of_routing"] == {}
    assert all(w["routable"] for w in workers(u).values())
    # bad bodies: a clear 4xx before any engine is called
    assert_openai_error(httpx.post(u + "/update_weights_from_distributed", json={**TENSORS, "shapes": [[1], [2]]}), 400)
    assert_openai_error(httpx.post(u + "/init_weights_update_group", json={**GROUP, "world_size": "8"}), 400)


@pytest.fixture
def two_workers(spawn):
    sim = spawn("sim", "tiny", workers=2, time_scale=TS)
    router = spawn("thunder", sim.urls, time_scale=TS)
    return sim, router


def test_tensor_update_goes_to_the_one_worker_named_and_resets_only_its_programs(two_workers):
    sim, router = two_workers
    u, (w0, w1) = router.url, sim.urls
    for pid in ("left", "right"):  # one program per worker (least-loaded admission)
        assert httpx.post(u + "/v1/chat/completions", json=chat(pid, 0), timeout=60).status_code == 200
    where = {pid: httpx.get(f"{u}/programs/{pid}").json()["backend"] for pid in ("left", "right")}
    assert where["left"] != where["right"]
    left_url = where["left"]  # a backend's key is its worker's URL (DP rank 0)
    other = w1 if left_url == w0 else w0
    index = list(workers(u)).index(left_url)
    tensors = {"serialized_named_tensors": [base64.b64encode(b"tensor-bytes").decode()], "weight_version": "t1"}

    assert_openai_error(httpx.post(u + "/update_weights_from_tensor", json=tensors), 400, "missing_worker")
    assert_openai_error(httpx.post(u + "/update_weights_from_tensor?worker=7", json=tensors), 404, "worker_not_found")
    assert_openai_error(httpx.post(u + "/update_weights_from_tensor?worker=http://127.0.0.1:1", json=tensors), 404,
                        "worker_not_found")
    assert_openai_error(httpx.post(u + f"/update_weights_from_disk?worker={index}", json={"model_path": "x"}), 400,
                        "worker_not_allowed")
    assert_openai_error(httpx.post(u + f"/update_weights_from_tensor?worker={index}", json={"weight_version": "t1"}),
                        400)
    assert [sim_state(x)["weight_updates"] for x in (w0, w1)] == [0, 0]  # none of those reached a worker

    r = httpx.post(u + f"/update_weights_from_tensor?worker={index}", json=tensors, timeout=60)
    assert r.status_code == 200, r.text
    assert (r.json()["workers_updated"], r.json()["total_workers"], r.json()["workers"][0]["worker"]) == (1, 1, left_url)
    assert (sim_state(left_url)["weight_version"], sim_state(other)["weight_version"]) == ("t1", "default")
    assert sim_state(other)["weight_updates"] == 0
    resets = {pid: httpx.get(f"{u}/programs/{pid}").json()["kv_resets"] for pid in ("left", "right")}
    assert resets == {"left": 1, "right": 0}
    # by URL: the other worker; a payload the engine cannot load fails there, and only there
    r = httpx.post(u + f"/update_weights_from_tensor?worker={other}", json={"serialized_named_tensors": []}, timeout=60)
    body = assert_openai_error(r, 400)
    assert body["success"] is False and body["out_of_routing"] == {other: None}
    assert workers(u)[other]["routable"] is False and workers(u)[left_url]["routable"] is True
    r = httpx.post(u + f"/update_weights_from_tensor?worker={other}", json={**tensors, "weight_version": "t2"}, timeout=60)
    assert r.status_code == 200 and r.json()["out_of_routing"] == {}, r.text
    assert workers(u)[other]["routable"] is True and workers(u)[other]["weights_pending"] is None
    for pid in ("left", "right"):
        assert httpx.post(u + "/v1/chat/completions", json=chat(pid, 1), timeout=60).status_code == 200


def test_version_and_lora_calls_fan_out_with_one_summary(two_workers):
    sim, router = two_workers
    u, (w0, w1) = router.url, sim.urls
    r = httpx.post(u + "/update_weight_version", json={"new_version": "label-2"}, timeout=30)
    assert r.status_code == 200 and r.json()["success"] is True and len(r.json()["workers"]) == 2, r.text
    v = httpx.get(u + "/get_weight_version", timeout=30).json()
    assert (v["weight_version"], v["consistent"]) == ("label-2", True)
    assert_openai_error(httpx.post(u + "/update_weight_version", json={}), 400)

    r = httpx.post(u + "/load_lora_adapter", json={"lora_name": "math", "lora_path": "sim/lora-math"}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["loaded_adapters"] == {"math": "sim/lora-math"} and r.json()["error_message"] is None
    # loaded again: both refuse alike (SGLang's 400), in the OpenAI shape with SGLang's fields
    body = assert_openai_error(httpx.post(u + "/load_lora_adapter", json={"lora_name": "math", "lora_path": "sim/x"}), 400)
    assert body["success"] is False and "already loaded" in body["error_message"]
    # loaded behind the router on one worker: the fan-out half succeeds, a 502 naming it
    assert httpx.post(w0 + "/load_lora_adapter", json={"lora_name": "code", "lora_path": "sim/lora-code"}).status_code == 200
    body = assert_openai_error(httpx.post(u + "/load_lora_adapter", json={"lora_name": "code", "lora_path": "sim/lora-code"}), 502)
    assert body["status"] == "partial" and w0 in body["error_message"] and w1 not in body["error_message"]
    assert body["loaded_adapters"] == {"math": "sim/lora-math", "code": "sim/lora-code"}
    r = httpx.post(u + "/unload_lora_adapter", json={"lora_name": "math"}, timeout=30)
    assert r.status_code == 200 and r.json()["loaded_adapters"] == {"code": "sim/lora-code"}, r.text
    assert [sim_state(x)["lora_adapters"] for x in (w0, w1)] == [{"code": "sim/lora-code"}] * 2
    assert_openai_error(httpx.post(u + "/unload_lora_adapter", json={"lora_name": "math"}), 400)
    assert_openai_error(httpx.post(u + "/load_lora_adapter", json={"lora_name": "x"}), 400)
    assert all(w["routable"] for w in workers(u).values())  # LoRA failures keep nobody out


async def test_a_failed_update_keeps_its_worker_out_of_routing_until_it_reports_the_version(two_workers):
    """Agents step on while the trainer syncs weights slime's way (pause, distributed update,
    continue). The update fails on one worker (its group was destroyed behind the router):
    that worker is kept out of routing — every answer after the update carries the new
    version — until it reports the expected version, then takes programs again. Every
    request is answered; one sent during the window is answered after it."""
    sim, router = two_workers
    u, (w0, w1) = router.url, sim.urls
    async with httpx.AsyncClient(timeout=120) as http:
        r = await http.post(u + "/init_weights_update_group", json={**GROUP, "world_size": 3})
        assert r.status_code == 200 and r.json()["rank_offsets"] == {w0: 1, w1: 2}, r.text
        assert (await http.post(w1 + "/destroy_weights_update_group", json={"group_name": "wsync"})).status_code == 200

        sent: list[tuple[float, float, str, dict]] = []
        stop = asyncio.Event()

        async def agent(pid: str) -> None:
            step = 0
            while not stop.is_set():
                t0 = time.monotonic()
                r = await http.post(u + "/v1/chat/completions", json=chat(pid, step))
                assert r.status_code == 200, r.text
                sent.append((t0, time.monotonic(), pid, r.json()))
                step += r.json()["choices"][0]["finish_reason"] != "abort"
                await asyncio.sleep(0.05)
            assert (await http.post(f"{u}/programs/{pid}/release")).status_code == 200

        agents = [asyncio.create_task(agent(f"p{i}")) for i in range(6)]
        await asyncio.sleep(1.0)
        assert (await http.post(u + "/pause_generation", json={"mode": "retract"})).status_code == 200
        opened = time.monotonic()
        r = await http.post(u + "/update_weights_from_distributed", json={**TENSORS, "weight_version": "v1"})
        body = assert_openai_error(r, 502)
        assert body["workers_updated"] == 1 and body["out_of_routing"] == {w1: "v1"}

        async def during() -> tuple[float, float]:  # a request sent inside the window, for certain
            t0 = time.monotonic()
            r = await http.post(u + "/v1/chat/completions", json=chat("during", 0))
            assert r.status_code == 200, r.text
            return t0, time.monotonic()

        inside = asyncio.create_task(during())
        await asyncio.sleep(0.3)
        closing = time.monotonic()
        assert (await http.post(u + "/continue_generation")).status_code == 200
        t_inside, answered = await inside
        assert opened < t_inside < closing and answered >= closing, "the request sent during the window was answered before it"
        assert (await http.post(f"{u}/programs/during/release")).status_code == 200
        state = {w["url"]: w for w in (await http.get(u + "/workers")).json()["workers"]}
        assert state[w1]["routable"] is False and state[w0]["routable"] is True
        assert state[w1]["weights_pending"]["expected_version"] == "v1"
        assert state[w1]["weights_pending"]["call"] == "/update_weights_from_distributed"

        await asyncio.sleep(1.5)  # the agents step on, all on w0 (w1 still serves "default")
        after = [b for t, _, _, b in sent if t > closing]
        assert len(after) >= 6 and {b["metadata"]["weight_version"] for b in after} == {"v1"}
        programs = [(await http.get(f"{u}/programs/p{i}")).json()["backend"] for i in range(6)]
        assert set(programs) <= {w0, None}, programs
        assert sim_state(w1)["weight_version"] == "default"

        # the trainer brings w1 up to date behind the router: the monitor reads v1, w1 is back
        r = await http.post(w1 + "/update_weight_version", json={"new_version": "v1", "abort_all_requests": False})
        assert r.status_code == 200
        wait_until(lambda: workers(u)[w1]["routable"], 10, "w1 back in routing after reporting v1")
        assert workers(u)[w1]["weights_pending"] is None
        fresh = [await http.post(u + "/v1/chat/completions", json=chat(f"new{i}", 0)) for i in range(4)]
        assert all(r.status_code == 200 for r in fresh)
        placed = [(await http.get(f"{u}/programs/new{i}")).json()["backend"] for i in range(4)]
        assert w1 in placed, placed
        stop.set()
        await asyncio.gather(*agents)

    held = [(t, d) for t, d, _, _ in sent if opened < t < closing]
    assert all(d >= closing for _, d in held), "a request sent during the window was answered before it"
    assert len(sent) > 12
