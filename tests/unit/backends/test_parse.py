"""Pure parsers over SGLang 0.5.23 response shapes (sglang-surface.md §1.2-1.4, §2.3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from thunder_sgl.backends.parse import (
    ParseError,
    host_tier_by_rank,
    metric_by_rank,
    parse_loads,
    parse_models,
    parse_prometheus,
    parse_server_info,
)

DATA = Path(__file__).resolve().parents[2] / "data"

SERVER_INFO = {
    "model_path": "zai-org/GLM-4.6-FP8", "tp_size": 8, "dp_size": 2, "page_size": 64,
    "enable_hierarchical_cache": True, "hicache_ratio": 2.0, "hicache_size": 0,
    "hicache_write_policy": "write_through", "max_total_num_tokens": 1050000,
    "internal_states": [{"last_gen_throughput": 0.0}], "version": "0.5.23",
}


def test_server_info_gives_per_rank_tiers():
    info = parse_server_info(SERVER_INFO)
    t = info.tiers()
    assert (info.dp_size, info.page_size, t.hbm_tokens, t.host_tokens, t.host_inclusive) == (2, 64, 1050000, 2100000, True)
    assert t.pool(tier_aware=True) == 2100000 and t.pool(tier_aware=False) == 1050000


@pytest.mark.parametrize(
    ("patch", "host", "inclusive"),
    [
        ({"enable_hierarchical_cache": False}, 0, True),
        ({"hicache_write_policy": "write_back"}, 2100000, False),
        ({"hicache_size": 49.0, "kv_bytes_per_token": 23552}, int(49e9 / 23552), True),
    ],
)
def test_server_info_hicache_variants(patch, host, inclusive):
    t = parse_server_info({**SERVER_INFO, **patch}).tiers()
    assert (t.host_tokens, t.host_inclusive) == (host, inclusive)


def test_server_info_capacity_may_sit_in_internal_states():
    info = parse_server_info({"model_path": "m", "internal_states": [{"max_total_num_tokens": 94000}]})
    assert info.hbm_tokens == 94000 and info.dp_size == 1


@pytest.mark.parametrize("bad", [[], {"model_path": "m"}, {"max_total_num_tokens": 0}, "x"])
def test_server_info_without_capacity_is_refused(bad):
    with pytest.raises(ParseError):
        parse_server_info(bad)


def test_loads_per_rank_with_queues():
    data = {"timestamp": 1.0, "version": "0.5.23", "loads": [
        {"dp_rank": 0, "num_running_reqs": 60, "num_waiting_reqs": 3, "num_used_tokens": 812345,
         "max_total_num_tokens": 1050000, "token_usage": 0.77, "cache_hit_rate": 0.93,
         "queues": {"waiting": 3, "retracted": 2}},
        {"dp_rank": 1, "num_running_reqs": 1, "num_waiting_reqs": 0, "num_used_tokens": 1200,
         "max_total_num_tokens": 1050000, "token_usage": 0.001, "cache_hit_rate": 0.0},
    ]}
    r0, r1 = parse_loads(data)
    assert (r0.used_tokens, r0.waiting_reqs, r0.retracted_reqs, r0.cache_hit_rate) == (812345, 3, 2, 0.93)
    assert (r1.dp_rank, r1.retracted_reqs) == (1, 0)
    with pytest.raises(ParseError):
        parse_loads({"loads": "nope"})


def test_prometheus_text_host_tier_gauges_by_rank():
    samples = parse_prometheus((DATA / "sglang_metrics_hicache.txt").read_text())
    assert {r: (t.host_total_tokens, t.host_used_tokens) for r, t in host_tier_by_rank(samples).items()} == \
        {0: (2099968, 1500000), 1: (2099968, 64)}
    assert metric_by_rank(samples, "sglang:num_used_tokens") == {0: 812345.0, 1: 1200.0}
    assert "sglang:cache_hit_rate" not in samples  # NaN samples are skipped
    cached = {lb["cache_source"]: v for lb, v in samples["sglang:cached_tokens_total"]}
    assert cached == {"device": 9.1e6, "host": 1.2e6}


def test_no_hicache_means_no_host_tier():
    assert host_tier_by_rank(parse_prometheus('sglang:num_used_tokens{dp_rank="0"} 5\n')) == {}


# ---- fixtures captured from a real SGLang 0.5.23 CPU server (bench/real/capture_fixtures.py)

def _real(name: str) -> str:
    return (DATA / f"sglang-0.5.23-cpu-{name}").read_text()


@pytest.mark.parametrize("tag", ["busy", "idle"])
def test_real_server_info_parses(tag):
    import json

    info = parse_server_info(json.loads(_real(f"server_info-{tag}.json")))
    assert (info.hbm_tokens, info.dp_size, info.page_size, info.hicache) == (24576, 1, 1, False)
    assert info.session_radix_cache and info.version == "0.5.23"
    assert info.tiers().pool(tier_aware=True) == 24576


def test_the_context_length_is_in_v1_models_not_in_server_info():
    """SGLang 0.5.23 reports ``context_length: null`` in /server_info and the model's context as
    ``max_model_len`` in /v1/models (captured from the real CPU engine, 2026-12-07); the
    monitor reads the second where the first has none (our simulator reports both)."""
    import json

    info = parse_server_info(json.loads(_real("server_info-idle.json")))
    assert info.raw["context_length"] is None and info.context_length == 0
    assert parse_models(json.loads(_real("v1-models.json"))) == 16384
    assert parse_models({"data": []}) == 0 and parse_models({"data": [{"id": "m"}]}) == 0 and parse_models([]) == 0
    assert parse_server_info({"max_total_num_tokens": 100, "context_length": 4096}).context_length == 4096


def test_real_loads_busy_and_idle():
    import json

    busy = parse_loads(json.loads(_real("v1_loads-busy.json")))[0]
    idle = parse_loads(json.loads(_real("v1_loads-idle.json")))[0]
    assert busy.running_reqs == 4 and busy.used_tokens > 4 * 2000 and busy.max_total_tokens == 24576
    assert idle.running_reqs == 0 and idle.waiting_reqs == 0 and idle.used_tokens == 0
    # Counters only grow; the decode moments between the two readings are the iterations that
    # finished the four requests (48 tokens each, all four in every batch but the last ones).
    assert idle.prefill_tokens_total >= busy.prefill_tokens_total > 8000
    assert idle.prefill_busy_s_total >= busy.prefill_busy_s_total > 0
    assert busy.decode is not None and idle.decode is not None
    d = idle.decode - busy.decode
    assert d.n > 0 and 1 <= d.sum_b / d.n <= 4 and d.busy_s > 0
    assert idle.decode.generated == pytest.approx(4 * 48 - 4, abs=8)  # the first token comes from prefill


def test_real_metrics_carry_the_routing_names():
    s = parse_prometheus(_real("metrics-busy.txt"))
    for name in ("sglang:num_used_tokens", "sglang:token_usage", "sglang:cache_hit_rate",
                 "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:max_total_num_tokens"):
        assert name in s, name
    assert metric_by_rank(s, "sglang:max_total_num_tokens") == {0: 24576.0}
    # The gauges are refreshed at SGLang's log interval, so they lag /v1/loads (4 running then).
    assert 1 <= metric_by_rank(s, "sglang:num_running_reqs")[0] <= 4
    assert host_tier_by_rank(s) == {}  # no HiCache on the CPU
    idle = parse_prometheus(_real("metrics-idle.txt"))
    assert metric_by_rank(idle, "sglang:num_running_reqs")[0] == 0
