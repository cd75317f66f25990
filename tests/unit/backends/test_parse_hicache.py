"""What the router reads of SGLang's real HiCache, on texts a real server served
(tests/data/sglang-0.5.23-cpu-hicache-*, captured by bench/real/capture_hicache_fixtures.py: a
3,000-token prefix cached on the device, loaded back from host, the cache flushed, loaded back
from the file storage tier; device pool 4,096 tokens, host ratio 3, write-through)."""

from __future__ import annotations

import json
from pathlib import Path

from thunder_sgl.backends.backend import Live
from thunder_sgl.backends.parse import (
    RankLoad,
    cached_tokens_by_source,
    host_tier_by_rank,
    parse_prometheus,
    parse_server_info,
)
from thunder_sgl.gateway.usage import SSETap, usage_from_generate, usage_from_openai

DATA = Path(__file__).resolve().parents[2] / "data"
P = "sglang-0.5.23-cpu-hicache"


def _json(name: str) -> dict:
    return json.loads((DATA / f"{P}-{name}.json").read_text())


def _metrics(name: str) -> dict:
    return parse_prometheus((DATA / f"{P}-metrics-{name}.txt").read_text())


def test_server_info_of_a_real_hicache_server() -> None:
    info = parse_server_info(_json("server_info"))
    assert info.hicache and info.hicache_ratio == 3.0 and info.write_policy == "write_through"
    assert info.storage_backend == "file" and info.hbm_tokens == 4096
    # SGLang reports neither a storage capacity nor the KV bytes per token (issue 22's finding)
    assert info.storage_tokens == 0 and info.kv_bytes_per_token == 0
    t = info.tiers()
    assert t.host_inclusive and abs(t.host_tokens - 12289) <= 1  # ratio x pool until /metrics says 12,289


def test_metrics_of_the_host_tier_and_the_derived_kv_bytes() -> None:
    (r0,) = host_tier_by_rank(_metrics("host")).values()
    assert (r0.host_total_tokens, r0.host_used_tokens) == (12289, 9274)
    assert (r0.backup_tokens, r0.load_back_tokens, r0.storage_backup_tokens) == (9274, 3081, 9274)
    # the 'small' GPT-2: 2 layers x (K + V) x 256 dims x 2 bytes = 2,048 bytes per token
    assert r0.kv_bytes_per_token == r0.backup_bytes // r0.backup_tokens == 2048
    s = host_tier_by_rank(_metrics("storage"))[0]
    assert s.storage_prefetch_tokens == 3081 and s.load_back_tokens == 6162
    assert cached_tokens_by_source(_metrics("storage")) == {"device": 9269, "host": 3081, "storage": 3081}
    assert cached_tokens_by_source(_metrics("host"))["storage"] == 0


def test_usage_split_by_tier_from_generate_and_chat() -> None:
    dev, host, sto = (usage_from_generate(_json(n)) for n in ("generate-device", "generate-host", "generate-storage"))
    assert dev and host and sto
    assert (dev.cached_tokens, dev.cached_host_tokens, dev.cached_storage_tokens) == (3081, 0, 0)
    assert (host.cached_tokens, host.cached_host_tokens, host.cached_storage_tokens) == (3081, 3081, 0)
    assert (sto.cached_tokens, sto.cached_host_tokens, sto.cached_storage_tokens) == (3081, 0, 3081)
    chat = usage_from_openai(_json("chat"))
    assert chat is not None and (chat.cached_tokens, chat.cached_host_tokens) == (3094, 0)


def _stream(host: bool) -> bytes:
    raw = (DATA / f"{P}-chat-stream.sse").read_bytes()
    return raw.replace(b'"device":3094,"host":0', b'"device":0,"host":3094') if host else raw


def test_stream_tiers_are_read_and_the_sglext_chunk_not_passed_on() -> None:
    for host in (False, True):
        raw = _stream(host)
        tap = SSETap("chat", client_wants_usage=False, drop_tiers=True)
        out = tap.feed(raw[:700]) + tap.feed(raw[700:]) + tap.flush()
        assert b"sglext" not in out and b'"usage"' not in out and out.rstrip().endswith(b"[DONE]")
        assert tap.usage is not None and tap.usage.cached_tokens == 3094
        assert tap.usage.cached_host_tokens == (3094 if host else 0)
    # a client that asked for the details and the usage gets SGLang's stream as it is
    tap = SSETap("chat", client_wants_usage=True, drop_tiers=False)
    assert tap.feed(_stream(True)) + tap.flush() == _stream(True)
    assert tap.usage is not None and tap.usage.cached_host_tokens == 3094


def _load(prefill: int, decodes: int) -> RankLoad:
    return RankLoad(0, 0, 4096, 0, 0, 0.0, 0.0, 0, prefill_tokens_total=prefill)


def test_the_stale_host_gauge_after_a_flush() -> None:
    """SGLang refreshes hicache_host_used_tokens only on its next batch: right after a flush the
    real server still said 10,805 used. Until a batch runs, the router reads the host as empty."""
    live = Live()
    live.read(_load(12361, 0), 1.0, host_tier_by_rank(_metrics("host"))[0])
    assert live.host_used_tokens == 9274
    live.flushed()
    stale = host_tier_by_rank(_metrics("flushed"))[0]
    assert stale.host_used_tokens == 10805
    live.read(_load(12361, 0), 2.0, stale)
    assert live.host_used_tokens == 0 and live.host_stale_since is not None
    live.read(_load(12361 + 1500, 0), 3.0, stale)  # a batch ran: the gauge is current again
    assert live.host_used_tokens == 10805 and live.host_stale_since is None
