"""KV cache behaviour of one engine, each against a number derived by hand from the config.

The toy config (``simkit``): capacity 10,000 tokens, page 1, chunk 8,192, b_kv = 512 B,
τ(B, K) = 0.002 + 5.12e-10·K, an iteration without decode costs t0 = 0.001,
prefill(n | c) = 2e-6·n + 5.12e-13·(n·c + n²/2), host load-back = n·512 / 1e9 s.
"""

from __future__ import annotations

import pytest
from simkit import drain, prefill, tau, tokens, unit_config

from thunder_sgl.sim import SimRequest
from thunder_sgl.sim.engine import Engine

approx = pytest.approx


def test_second_identical_request_is_a_full_cache_hit() -> None:
    e = Engine(unit_config())
    p = tokens(1000)
    e.submit(SimRequest("a", p, 10), 0.0)
    (a,) = drain(e)
    # first token after one prefill iteration: t0 + prefill(1000 | 0)
    t1 = 0.001 + prefill(1000)
    assert a.first_token_time == approx(t1, rel=1e-12)
    # then 9 decode steps reading 1000, 1001, ..., 1008 KV tokens
    assert a.time == approx(t1 + sum(tau(1000 + s) for s in range(9)), rel=1e-12)
    assert (a.prompt_tokens, a.completion_tokens, a.cached_tokens) == (1000, 10, 0)

    e.submit(SimRequest("b", p, 10), 10.0)
    (b,) = drain(e)
    # the cache holds prompt + 9 output tokens; a match stops one token short of the prompt
    # (the last prompt token is always computed, to get its logits): 999 cached
    assert (b.cached_tokens, b.cached_device, b.cached_host) == (999, 999, 0)
    assert b.first_token_time - 10.0 == approx(0.001 + prefill(1, 999), rel=1e-12)
    assert e.counters.prefill_tokens == 1000 + 1
    assert list(b.output_ids) == list(a.output_ids)  # same prompt, same seed: same answer


def test_next_turn_hits_prompt_and_output_token_for_token() -> None:
    e = Engine(unit_config())
    p1 = tokens(500)
    e.submit(SimRequest("t1", p1, 20), 0.0)
    (t1,) = drain(e)
    p2 = p1 + t1.output_ids + tokens(300, start=1 << 26)
    e.submit(SimRequest("t2", p2, 20), 5.0)
    (t2,) = drain(e)
    # cached: prompt 500 + output minus its last token (its KV was never computed) = 519
    assert t2.cached_tokens == 500 + 20 - 1
    assert e.counters.prefill_tokens == 500 + (820 - 519)


def test_prompt_larger_than_free_kv_evicts_lru_prefix_and_forces_recompute() -> None:
    e = Engine(unit_config())
    a_ids, b_ids = tokens(6000), tokens(6000, start=1 << 25)
    e.submit(SimRequest("a", a_ids, 1), 0.0)
    drain(e)
    assert e.cache.device_tokens == 6000  # A cached (max_new 1: no decode KV)
    e.submit(SimRequest("b", b_ids, 1), 1.0)
    drain(e)
    # B needs 6,000 tokens, 4,000 are free: the LRU leaf, all of A (one node), is evicted
    assert e.cache.counters.evicted_device == 6000
    assert e.cache.device_tokens == 6000
    e.submit(SimRequest("a2", a_ids, 1), 2.0)
    (a2,) = drain(e)
    # A is recomputed from scratch (and evicts B in turn)
    assert a2.cached_tokens == 0
    assert a2.first_token_time - 2.0 == approx(0.001 + prefill(6000), rel=1e-12)
    assert e.counters.prefill_tokens == 3 * 6000
    assert e.cache.counters.evicted_device == 2 * 6000


@pytest.mark.parametrize("overlap", [1.0, 0.0])
def test_prefix_evicted_to_host_returns_as_host_hit_that_costs_load_time_not_prefill(overlap: float) -> None:
    # host tier 2 × 10,000 tokens, write-through
    e = Engine(unit_config(hicache__enabled=True, timing__load_back_overlap=overlap))
    a_ids, b_ids = tokens(6000), tokens(6000, start=1 << 25)
    e.submit(SimRequest("a", a_ids, 1), 0.0)
    drain(e)
    e.submit(SimRequest("b", b_ids, 1), 1.0)
    drain(e)
    assert e.cache.counters.evicted_device == 6000
    assert e.cache.host_used == 12000  # write-through: both prompts stay in host memory
    e.submit(SimRequest("a2", a_ids, 1), 2.0)
    (a2,) = drain(e)
    # 5,999 tokens match (one short of the prompt), all in host: loaded back at 1 GB/s,
    # then only the last token is prefilled at prefix 5,999
    assert (a2.cached_tokens, a2.cached_device, a2.cached_host) == (5999, 0, 5999)
    load = 5999 * 512 / 1e9
    # Layer-wise overlap (SGLang's default): the iteration takes max(load, compute); without
    # overlap the load-back is added in full.
    expected = 0.001 + (max(load, prefill(1, 5999)) if overlap == 1.0 else load + prefill(1, 5999))
    assert a2.first_token_time - 2.0 == approx(expected, rel=1e-12)
    assert e.counters.prefill_tokens == 6000 + 6000 + 1
    assert e.cache.counters.loaded_from_host == 5999
    assert e.counters.load_back_seconds == approx(load, rel=1e-12)
    e.cache.check()


def test_prefix_evicted_from_host_returns_from_storage_at_storage_bandwidth() -> None:
    cfg = unit_config(hicache__enabled=True, hicache__host_tokens=12_000, hicache__storage_backend="file", hicache__storage_capacity_tokens=50_000)
    e = Engine(cfg)
    a_ids, b_ids, c_ids = tokens(6000), tokens(6000, start=1 << 25), tokens(6000, start=2 << 25)
    for rid, ids, t in (("a", a_ids, 0.0), ("b", b_ids, 1.0), ("c", c_ids, 1.5)):
        e.submit(SimRequest(rid, ids, 1), t)
        drain(e)
    # host (12,000) holds B and C; A lives on in storage (SGLang needs a host larger than HBM)
    assert e.cache.host_used == 12_000 and e.cache.storage_used == 18_000
    e.submit(SimRequest("a2", a_ids, 1), 2.0)
    (a2,) = drain(e)
    assert (a2.cached_storage, a2.cached_host, a2.cached_device) == (5999, 0, 0)
    # storage → host at 0.5 GB/s (before the iteration, never hidden), then host → device at
    # 1 GB/s, overlapped layer by layer with the iteration's compute
    fetch, h2d = 5999 * 512 / 0.5e9, 5999 * 512 / 1e9
    assert a2.first_token_time - 2.0 == approx(0.001 + fetch + max(h2d, prefill(1, 5999)), rel=1e-12)
    e.cache.check()


def test_chunked_prefill_splits_a_long_prompt_into_chunk_sized_iterations() -> None:
    e = Engine(unit_config(server__max_total_num_tokens=100_000))
    e.submit(SimRequest("a", tokens(20_000), 1), 0.0)
    (a,) = drain(e)
    # chunks of 8,192, 8,192 and 3,616 tokens, each attending to the chunks before it
    expected = 3 * 0.001 + prefill(8192, 0) + prefill(8192, 8192) + prefill(3616, 16384)
    assert a.first_token_time == approx(expected, rel=1e-12)
    assert e.counters.iterations == 3


@pytest.mark.parametrize("mixed", [True, False])
def test_arrival_during_a_decode_span_joins_at_the_next_step_boundary(mixed: bool) -> None:
    e = Engine(unit_config(server__enable_mixed_chunk=mixed))
    e.submit(SimRequest("a", tokens(100), 1000), 0.0)
    t1 = 0.001 + prefill(100)
    # step boundaries of A's decode: T_k = t1 + Σ_{s<k} τ(100 + s)
    bounds = [t1]
    for s in range(5):
        bounds.append(bounds[-1] + tau(100 + s))
    t_b = bounds[2] + 0.3 * tau(102)  # B arrives inside A's third decode step
    e.submit(SimRequest("b", tokens(100, start=1 << 25), 1), t_b)
    (b,) = drain(e, until=bounds[3] + 1.0)
    if mixed:  # B is prefilled in the iteration that starts at T_3, with A's decode step (K = 103)
        assert b.first_token_time == approx(bounds[3] + tau(103) + prefill(100), rel=1e-12)
    else:  # SGLang's default: B's prefill batch runs alone at T_3, A waits for it
        assert b.first_token_time == approx(bounds[3] + 0.001 + prefill(100), rel=1e-12)


def test_retraction_happens_when_decode_outgrows_kv() -> None:
    # capacity 1,000; init_new_token_ratio 0.1 (min 0.014) so B is admitted next to A.
    e = Engine(unit_config(server__max_total_num_tokens=1000, server__init_new_token_ratio=0.1,
                           server__enable_mixed_chunk=True))
    e.submit(SimRequest("a", tokens(100), 500), 0.0)
    e.submit(SimRequest("b", tokens(100, start=1 << 25), 500), 0.0)
    done = {c.rid: c for c in drain(e)}
    # Round 1 admits A only: A reserves 100 + 500, leaving 400 < 600 for B.
    # Round 2 (A decoding, out = 1): reserve 0.1 × 499 + 1 decode slot = 50.9; free 900:
    #   B (100 + 500 = 600 < 849.1) is admitted.
    # Both then grow by 1 token per step from 201 used tokens; after 399 steps 999 are used and
    # the next step does not fit: B (fewer output tokens: 400 vs 401) is retracted, once.
    assert e.counters.retractions == 1
    assert done["b"].retractions == 1 and done["a"].retractions == 0
    assert done["a"].time < done["b"].time
    assert done["b"].completion_tokens == 500  # B keeps its output and finishes
    # B had computed 100 + 399 = 499 tokens; on re-admission its prompt (100) is still cached,
    # so 399 tokens are recomputed; the 499-token output node of finished A is evicted for it
    assert e.counters.recomputed_tokens == 399
    assert e.cache.counters.evicted_device == 499
    assert e.counters.retracted_output_tokens == 400
    e.cache.check()


def test_abort_releases_kv_and_reports_reason_abort() -> None:
    e = Engine(unit_config())
    e.submit(SimRequest("a", tokens(1000), 1000), 0.0)
    drain(e, until=0.5)
    assert e.abort("a", 0.5)
    (a,) = drain(e)
    assert a.finish_reason == "abort" and 0 < a.completion_tokens < 1000
    assert e._private == 0 and e.cache.protected == 0
    assert e.stats().num_used_tokens == 0
    e.cache.check()


def test_waiting_request_abort_is_immediate() -> None:
    e = Engine(unit_config(server__max_running_requests=1))
    e.submit(SimRequest("a", tokens(100), 100), 0.0)
    e.submit(SimRequest("b", tokens(100, start=1 << 25), 100), 0.0)
    assert e.abort("b", 0.0)
    (b,) = e.advance(0.0)
    assert (b.rid, b.finish_reason, b.time, b.completion_tokens) == ("b", "abort", 0.0, 0)


def test_flush_cache_is_refused_while_requests_run() -> None:
    e = Engine(unit_config())
    e.submit(SimRequest("a", tokens(100), 10), 0.0)
    assert not e.flush_cache()
    drain(e)
    assert e.cache.device_tokens == 109
    assert e.flush_cache() and e.cache.device_tokens == 0


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("input_ids", [], "empty"),
        ("max_new_tokens", 0, "max_new_tokens"),
        ("input_ids", list(range(1 << 24, (1 << 24) + 10_000)), "longer than the KV cache"),
    ],
)
def test_requests_the_engine_can_never_run_are_refused(field: str, value: object, message: str) -> None:
    from thunder_sgl.sim import SimRequestError

    e = Engine(unit_config())
    kw = {"rid": "x", "input_ids": tokens(10), "max_new_tokens": 5, field: value}
    with pytest.raises(SimRequestError, match=message):
        e.submit(SimRequest(**kw), 0.0)  # type: ignore[arg-type]
