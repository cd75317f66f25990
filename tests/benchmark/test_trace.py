"""Trace replay (``workloads.trace``, ``des.trace``, ``bench --trace``) on the committed sample of
the Mooncake FAST'25 conversation trace (tests/data/README.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from thunder_sgl.benchmark.des.trace import TraceRun, run_trace_des
from thunder_sgl.benchmark.harness import BenchSpec
from thunder_sgl.benchmark.workloads.trace import (
    BLOCK_TOKENS,
    BlockTokens,
    TraceRequest,
    conversations,
    load_trace,
    parse_line,
    summary,
)
from thunder_sgl.cli import main
from thunder_sgl.sim.tokenizer import Tokenizer

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "mooncake-conversation-sample.jsonl"


def _req(i: int, t: float, n: int, ids: list[int], out: int = 10) -> TraceRequest:
    return TraceRequest(i, t, n, out, tuple(ids))


def test_sample_parses_and_lengths_match():
    reqs = load_trace(SAMPLE)
    assert len(reqs) == 200
    assert all(math.ceil(r.input_length / BLOCK_TOKENS) == len(r.hash_ids) for r in reqs)
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(reqs, reqs[1:], strict=False))
    assert reqs[0].hash_ids[0] == 0


def test_speed_limit_and_until():
    full = load_trace(SAMPLE)
    fast = load_trace(SAMPLE, speed=2.0)
    assert fast[-1].arrival_s == pytest.approx(full[-1].arrival_s / 2)
    assert len(load_trace(SAMPLE, limit=17)) == 17
    cut = load_trace(SAMPLE, until_s=30.0)
    assert cut and all(r.arrival_s <= 30.0 for r in cut) and len(cut) < 200


def test_bad_lines_are_refused():
    with pytest.raises(ValueError, match="hash ids"):
        parse_line(json.dumps({"timestamp": 0, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]}), 0)
    with pytest.raises(ValueError):
        load_trace(SAMPLE, speed=0)


def test_prompts_share_exactly_their_common_blocks():
    bt = BlockTokens(seed=3)
    a = _req(0, 0, 3 * BLOCK_TOKENS + 100, [0, 1, 2, 3])
    b = _req(1, 1, 2 * BLOCK_TOKENS + 7, [0, 1, 9])
    c = _req(2, 2, 300, [5])
    pa, pb, pc = bt.prompt(a), bt.prompt(b), bt.prompt(c)
    assert len(pa) // 4 == a.input_length and len(pb) // 4 == b.input_length and len(pc) // 4 == 300
    shared = 2 * BLOCK_TOKENS * 4
    assert pa[:shared] == pb[:shared]
    assert pa[shared:shared + 4] != pb[shared:shared + 4]
    assert pa[:4] != pc[:4]
    assert BlockTokens(seed=3).prompt(a) == pa  # deterministic
    assert BlockTokens(seed=4).prompt(a) != pa


def test_text_prompts_tokenize_to_the_same_shared_prefix():
    bt = BlockTokens(seed=1)
    a = _req(0, 0, 2 * BLOCK_TOKENS + 33, [0, 1, 2])
    b = _req(1, 1, 2 * BLOCK_TOKENS + 1, [0, 1, 7])
    ta, tb = Tokenizer.encode_uncached(bt.text(a)), Tokenizer.encode_uncached(bt.text(b))
    assert len(ta) == a.input_length and len(tb) == b.input_length
    k = 2 * BLOCK_TOKENS
    assert list(ta[:k]) == list(tb[:k]) and ta[k] != tb[k]


def test_conversations_follow_prefix_extension():
    reqs = [
        _req(0, 0, 1000, [0, 1]),            # conv A: full blocks (0,)
        _req(1, 1, 1500, [0, 2, 3]),         # shares only block 0 with A: new conv B, full (0, 2)
        _req(2, 2, 2000, [0, 2, 4, 5]),      # extends B
        _req(3, 3, 2100, [0, 2, 4, 5, 6]),   # extends B (its latest full blocks are (0, 2, 4))
        _req(4, 4, 1600, [0, 2, 4, 8]),      # extends B's old turn, but B moved on: new conv
        _req(5, 5, 2600, [0, 2, 4, 5, 6, 9]),  # B's latest full blocks (0, 2, 4, 5): B again
    ]
    convs = conversations(reqs)
    by = {c.cid: [r.index for r in c.requests] for c in convs}
    assert by == {"trace-0": [0], "trace-1": [1, 2, 3, 5], "trace-4": [4]}


def test_sample_conversations_and_summary():
    reqs = load_trace(SAMPLE)
    convs = conversations(reqs)
    assert sum(len(c.requests) for c in convs) == 200
    multi = [c for c in convs if len(c.requests) > 1]
    assert multi
    for c in multi:  # every turn starts with its predecessor's full blocks
        for prev, nxt in zip(c.requests, c.requests[1:], strict=False):
            assert nxt.hash_ids[:len(prev.full_blocks)] == prev.full_blocks
            assert nxt.arrival_s >= prev.arrival_s
    s = summary(reqs, convs)
    assert s["requests"] == 200 and s["conversations"] == len(convs)
    assert 0 < s["reusable_share"] < 1


@pytest.mark.parametrize("router", ["thunder", "sglang-cache_aware"])
def test_des_replays_the_sample(router):
    run = TraceRun("glm46-fp8-h100x8", 2, router, SAMPLE, duration_s=40.0, seed=1)
    r = run.run()
    t = r.trace
    offered = sum(1 for q in load_trace(SAMPLE) if q.arrival_s <= 40.0)
    assert t["requests_offered"] == offered
    assert 0 < t["requests_answered"] <= offered
    assert r.kv_hit_rate > 0 and r.steps_completed > 0
    assert r.profile == "mooncake-conversation-sample" and r.programs == len(run.convs)
    assert t["ttft_p50_s"] <= t["ttft_p99_s"] and 0 <= t["slo_attainment"] <= 1
    assert not r.errors
    led = run.final_ledger
    assert led["programs"] == led["programs_accounted"] and led["requests"] == led["requests_accounted"]


def test_des_prompts_honour_the_trace_lengths():
    run = TraceRun("glm46-fp8-h100x8", 2, "thunder", SAMPLE, duration_s=20.0, limit=40, drain_s=3600.0)
    r = run.run()
    reqs = load_trace(SAMPLE, limit=40)
    assert r.trace["requests_answered"] == 40 and run.finished
    calls = run.rec.calls  # every answered call, in the window or after it
    assert sorted(c[2] for c in calls) == sorted(q.input_length for q in reqs)
    assert sorted(c[4] for c in calls) == sorted(q.output_length for q in reqs)
    assert r.prompt_tokens <= sum(q.input_length for q in reqs)


def test_run_trace_des_returns_a_result():
    r = run_trace_des("glm46-fp8-h100x8", 1, "direct", SAMPLE, duration_s=10.0, limit=10)
    assert r.router == "direct" and r.trace["requests_offered"] == 10


def test_a_failed_run_gets_a_row_saying_why_in_the_trace_table():
    """A run that failed before it measured (an engine that could not start) carries only the
    trace's description: its row says why instead of the report failing on the missing figures."""
    from dataclasses import replace

    from thunder_sgl.benchmark.reports import trace as trace_report

    ok = run_trace_des("glm46-fp8-h100x8", 1, "direct", SAMPLE, duration_s=10.0, limit=10)
    bad = replace(ok, router="thunder", notes="EngineEnvError: model not built",
                  trace={k: v for k, v in ok.trace.items() if k.startswith("trace_") or k == "speed"})
    md = "\n".join(trace_report.markdown([ok, bad]))
    assert "| direct | 10/10 |" in md and "| thunder | failed: EngineEnvError: model not built |" in md


def test_spec_trace_names_and_refusals():
    with pytest.raises(ValueError, match="rollout"):
        BenchSpec(mode="des", trace=str(SAMPLE), warm_start=True)
    assert BenchSpec(mode="des", trace=str(SAMPLE), trace_speed=2).results_name.startswith(
        "trace-mooncake-conversation-sample-x2-")


def test_cli_bench_trace(tmp_path, capsys):
    rc = main(["bench", "--mode", "des", "--trace", str(SAMPLE), "--trace-limit", "60", "--nodes", "2",
               "--routers", "thunder,smg-cache_aware", "--out", str(tmp_path), "--name", "t"])
    assert rc == 0
    md = (tmp_path / "t" / "results.md").read_text()
    assert "## Trace replay" in md and "| thunder |" in md and "| smg-cache_aware |" in md
    res = json.loads((tmp_path / "t" / "results.json").read_text())
    runs = res["results"]
    assert all(x["trace"]["requests_offered"] == 60 for x in runs)


def test_http_replay_against_the_simulator(tmp_path):
    from thunder_sgl.benchmark.harness import run_bench
    from thunder_sgl.benchmark.reports.progress import QuietProgress
    from thunder_sgl.benchmark.reports.sweep import FAILED

    spec = BenchSpec(cluster="glm46-fp8-h100x8", nodes=2, programs=(1,), routers=("thunder", "sglang-cache_aware"),
                     duration_s=4.0, warmup_s=0.0, time_scale=5, seed=1, mode="http", name="trace-http",
                     out=tmp_path, trace=str(SAMPLE), trace_limit=16, trace_drain_s=300.0)
    results = run_bench(spec, progress=QuietProgress())
    for r in results:
        assert not r.errors.get(FAILED), r.notes
        assert r.mode == "http" and r.profile == "mooncake-conversation-sample"
        assert r.trace["requests_offered"] == 16 and r.trace["requests_answered"] == 16, r.trace
        assert r.trace["ttft_p50_s"] > 0 and r.trace["latency_from_arrival_p50_s"] >= r.trace["ttft_p50_s"]
        assert r.prompt_tokens > 0 and r.cached_tokens > 0  # block 0 is shared by every request
    assert "## Trace replay" in (tmp_path / "trace-http" / "results.md").read_text()


def test_token_scale_keeps_the_sharing_at_smaller_blocks():
    full = load_trace(SAMPLE, limit=30)
    small = load_trace(SAMPLE, limit=30, token_scale=16)
    assert [r.hash_ids for r in small] == [r.hash_ids for r in full]
    assert all(r.block == 32 and math.ceil(r.input_length / 32) == len(r.hash_ids) for r in small)
    assert all(r.input_length == math.ceil(f.input_length / 16) for r, f in zip(small, full, strict=True))
    assert [[q.index for q in c.requests] for c in conversations(small)] == \
        [[q.index for q in c.requests] for c in conversations(full)]
    bt = BlockTokens()
    a, b = small[0], small[1]  # share block 0 only
    pa, pb = bt.prompt(a), bt.prompt(b)
    assert len(pa) // 4 == a.input_length and pa[:4 * 32] == pb[:4 * 32] and pa[4 * 32:4 * 33] != pb[4 * 32:4 * 33]
    with pytest.raises(ValueError, match="divide"):
        load_trace(SAMPLE, token_scale=3)


def test_words_text_shares_the_block_prefix():
    bt = BlockTokens(seed=2)
    a = _req(0, 0, 2 * BLOCK_TOKENS + 50, [0, 1, 2])
    b = _req(1, 1, 3 * BLOCK_TOKENS, [0, 1, 3])
    ta, tb = bt.text(a, "words"), bt.text(b, "words")
    head = bt.block_text(0, style="words") + bt.block_text(1, style="words")
    assert ta.startswith(head) and tb.startswith(head) and ta[len(head):len(head) + 20] != tb[len(head):len(head) + 20]
    assert abs(len(ta) / 4 - a.input_length) < 0.05 * a.input_length
