"""The real engine's session radix cache, the lever thunder uses to keep the KV of the programs it
runs: the same sequence as tests/sim/test_sim_sessions.py, so the simulator's model of it is
checked against the engine (pool 24,576 tokens, chunked prefill 4,096 on the CPU)."""

from __future__ import annotations

import random

import httpx
import pytest


@pytest.fixture(scope="module")
def engine(start_cluster):
    return start_cluster(1, max_total_tokens=24_576)


def ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 600) for _ in range(n)]


def gen(url: str, input_ids: list[int], session: str | None = None) -> int:
    body = {"input_ids": input_ids, "sampling_params": {"max_new_tokens": 1, "ignore_eos": True}}
    if session:
        body["session_id"] = session
    r = httpx.post(url + "/generate", json=body, timeout=300)
    r.raise_for_status()
    return r.json()["meta_info"]["cached_tokens"]


def close(url: str, session: str) -> None:
    httpx.post(url + "/close_session", json={"session_id": session}, timeout=30).raise_for_status()


@pytest.mark.parametrize(("session", "cached"), [("prog-1", 6015), (None, 4096)])
def test_a_session_keeps_its_kv_through_other_traffic_and_lru_does_not(engine, session, cached):
    url = engine.urls[0]
    httpx.post(url + "/flush_cache", timeout=60).raise_for_status()
    first = ids(6016, 1)
    gen(url, first, session)
    for i in range(4):
        gen(url, ids(5016, 10 + i))
    assert gen(url, first) == cached
    if session:
        close(url, session)
