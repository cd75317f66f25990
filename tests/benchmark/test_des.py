"""The discrete-event benchmark (``benchmark.des``) on a small cluster: 2 ``tiny`` workers (32 K
KV tokens each, no host tier) and a scaled-down mini-swe-agent profile whose resident context
(≈ 2.4 K tokens) lets ≈ 16 programs fit per node; 90 programs are ≈ 3× capacity."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from thunder_sgl.benchmark.des.run import DesRun, run_des
from thunder_sgl.benchmark.des.tokens import TokenLayout
from thunder_sgl.benchmark.reports.results import ROUTERS, RunResult
from thunder_sgl.benchmark.workloads.profile import WorkloadProfile, program_at
from thunder_sgl.sim import load_sim_config

log = logging.getLogger(__name__)

PROFILE = WorkloadProfile.from_dict({
    "name": "mini-swe-small",
    "description": "mini-swe-agent scaled down ~7× in tokens for the tiny worker",
    "system_prompt_tokens": 400,
    "instance_tokens": {"kind": "uniform_int", "low": 100, "high": 300},
    "steps": {"kind": "normal", "mean": 12, "std": 4, "min": 4, "max": 24},
    "output_tokens": {"kind": "uniform_int", "low": 40, "high": 120},
    "observation_tokens": {"kind": "lognormal", "median": 150, "p95": 500, "min": 20, "max": 800},
    "tool_seconds": {"kind": "lognormal", "median": 0.5, "p95": 4.0, "max": 20.0},
    "max_context_tokens": 16000,
})
CLUSTER = load_sim_config("tiny", {"hicache.enabled": False})
OVERLOAD = 90


@pytest.fixture(scope="module")
def overload_runs() -> dict[str, RunResult]:
    return {r: run_des(CLUSTER, 2, r, PROFILE, OVERLOAD, 240.0, warmup_s=60.0)
            for r in ("thunder", "sglang-round_robin")}


def test_thunder_beats_round_robin_under_overload(overload_runs: dict[str, RunResult],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    th, rr = overload_runs["thunder"], overload_runs["sglang-round_robin"]
    margin = th.steps_per_min / rr.steps_per_min
    msg = (f"thunder {th.steps_per_min:.0f} vs round_robin {rr.steps_per_min:.0f} steps/min "
           f"(×{margin:.2f}; hit {th.kv_hit_rate:.2f} vs {rr.kv_hit_rate:.2f}; ideal {th.ideal_steps_per_min:.0f})")
    log.info(msg)
    with capsys.disabled():
        print(f"\n[des] {msg}")
    assert margin > 1.1, msg
    assert th.kv_hit_rate > rr.kv_hit_rate, msg
    assert th.recompute_tokens < rr.recompute_tokens, msg
    for r in (th, rr):
        assert 0 < r.steps_per_min <= r.ideal_steps_per_min * 1.02, msg


def test_run_result_is_complete(overload_runs: dict[str, RunResult]) -> None:
    r = overload_runs["thunder"]
    assert r.mode == "des" and r.nodes == 2 and r.programs == OVERLOAD and r.window_s == 240.0
    assert r.cluster == CLUSTER.name and r.profile == PROFILE.name
    assert r.steps_completed > 0 and r.programs_completed > 0
    assert 0 < r.kv_hit_rate < 1 and r.prompt_tokens > r.cached_tokens > 0
    assert 0 < r.program_completion_p50_s <= r.program_completion_p99_s
    assert 0 < r.step_latency_p50_s <= r.step_latency_p99_s
    assert 0 <= r.held_wait_p50_s <= r.held_wait_p99_s <= r.held_wait_max_s
    assert r.memory and all(len(v) == 2 and all(0 <= x <= 1 for x in v) for _, v in r.memory)
    assert 0 <= r.node_imbalance_mean <= r.node_imbalance_max <= 1
    assert r.wall_s > 0 and r.errors == {}
    rr = overload_runs["sglang-round_robin"]
    assert rr.held_wait_max_s == 0.0


def test_same_seed_same_result_other_seed_other_programs() -> None:
    def run(seed: int) -> dict:
        d = dataclasses.asdict(run_des(CLUSTER, 2, "thunder", PROFILE, 40, 60.0, warmup_s=10.0, seed=seed))
        d.pop("wall_s")
        return d

    a, b, c = run(1), run(1), run(2)
    assert a == b
    assert a["steps_completed"] != c["steps_completed"] or a["prompt_tokens"] != c["prompt_tokens"]


@pytest.mark.parametrize("router", ROUTERS)
def test_every_program_and_request_is_accounted_for(router: str) -> None:
    d = DesRun(CLUSTER, 2, router, PROFILE, 50, 45.0, warmup_s=5.0)
    d.run()
    led = d.final_ledger
    assert led["programs"] == led["programs_accounted"] > 50
    assert led["requests"] == led["requests_accounted"] > 0
    assert d.counts["completed"] > 0
    if router.startswith("thunder"):
        ctl = d.router.ctl
        assert ctl.held_count == 0 and len(ctl.programs) == 0
        assert all(b.inflight == 0 for b in ctl.backends.values())
        assert ctl.stats.released == d.counts["started"]
    else:
        assert d.router.policy.loads == [0, 0]


@pytest.mark.parametrize("router", ["thunder", "thunder-inferred", "sglang-round_robin"])
def test_a_program_cut_by_the_context_sends_the_call_the_engine_refuses_and_stops(router: str) -> None:
    """``ProgramSpec.overflow_output``: a program the profile cuts at the model's window sends
    that call after its last tool, through the router (admitted as any request), and stops on
    the engine's refusal. ``thunder-inferred`` reads the refusal as the context-overflow end
    hint (the gateway reads SGLang's 400), so those programs end hinted and the hint learns
    that they never came back; explicit ids release them."""
    tight = dataclasses.replace(PROFILE, max_context_tokens=4000)
    d = DesRun(CLUSTER, 2, router, tight, 20, 240.0, warmup_s=0.0, seed=3)
    d.run()
    cut = [p for p in (program_at(tight, 3, i) for i in range(d.counts["started"])) if p.overflow_output]
    ended = d.counts["completed"] + d.counts["failed"]
    assert cut and d.counts["overflow"] > 0 and d.rec.errors["context_overflow"] == d.counts["overflow"]
    assert d.counts["overflow"] <= len(cut) and ended > d.counts["overflow"]
    led = d.final_ledger
    assert led["requests"] == led["requests_accounted"]
    if router == "thunder-inferred":
        ended_hinted, came_back = d.router.ctl.lengths.hints["context_overflow"]
        assert ended_hinted > 0 and came_back == 0
    elif router == "thunder":
        assert "context_overflow" not in d.router.ctl.lengths.hints  # explicit ids: released, not hinted


def test_progress_gets_snapshots_in_virtual_time() -> None:
    seen: list[tuple[float, dict]] = []
    run_des(CLUSTER, 2, "thunder", PROFILE, 20, 20.0, warmup_s=10.0, progress=lambda t, s: seen.append((t, s)))
    times = [t for t, _ in seen]
    assert times == sorted(times) and times[0] == 0.0 and times[-1] >= 25.0
    snap = seen[-1][1]
    assert snap["phase"] == "measure" and snap["steps"] > 0 and len(snap["node_used"]) == 2
    assert {"running", "in_flight", "held", "programs_completed", "steps_per_min", "window_steps",
            "prompt_tokens", "cached_tokens", "errors"} <= set(snap)
    assert snap["prompt_tokens"] >= snap["cached_tokens"] > 0


def test_unknown_router_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="sglang-round_robin"):
        run_des(CLUSTER, 2, "random", PROFILE, 4, 10.0)


def test_programs_send_append_only_token_streams_sharing_the_system_prompt() -> None:
    layout = TokenLayout(PROFILE, 3)
    a, b = (layout.program(program_at(PROFILE, 3, i)) for i in (0, 1))
    assert a.prompt.startswith(layout.shared_prefix) and b.prompt.startswith(layout.shared_prefix)
    assert a.prompt != b.prompt
    before = a.prompt
    from array import array
    a.add_reply(array("I", [1 << 25] * 7))
    assert a.prompt.startswith(before + array("I", [1 << 25] * 7).tobytes())
    again = TokenLayout(PROFILE, 3).program(program_at(PROFILE, 3, 0))
    assert again.prompt == before


def test_a_hicache_cluster_reports_its_window_hits_by_tier() -> None:
    """With a host tier the DES reads the engines' hits by tier and load-back over the window, as
    HTTP and real mode read them from /metrics; they add up to the window's cached tokens. A
    cluster without HiCache reports none (as those modes)."""
    cfg = CLUSTER.with_overrides({"hicache.enabled": True, "hicache.ratio": 2.0, "server.max_total_num_tokens": 8192})
    r = run_des(cfg, 1, "thunder", PROFILE, 12, 60.0, warmup_s=30.0)
    assert r.cached_host_tokens > 0 and r.load_back_tokens >= r.cached_host_tokens
    assert r.cached_device_tokens + r.cached_host_tokens + r.cached_storage_tokens == r.cached_tokens
    plain = run_des(CLUSTER, 1, "thunder", PROFILE, 12, 20.0, warmup_s=10.0)
    assert (plain.cached_device_tokens, plain.cached_host_tokens, plain.load_back_tokens) == (0, 0, 0)


def test_a_warm_start_begins_with_contexts_of_the_steady_mix() -> None:
    """Early in a cold run every context is at its smallest; a warm start's first requests carry
    the programs' histories, so their prompts average what a long run's do. Only the slots'
    first programs differ; the run is deterministic."""
    def early_prompt_mean(warm: bool) -> tuple[float, DesRun]:
        d = DesRun(CLUSTER, 2, "thunder", PROFILE, 30, 30.0, warmup_s=10.0, warm_start=warm)
        d.run()
        first = [p for (_, sent, p, *_rest) in d.rec.calls if sent < 5.0]
        return sum(first) / len(first), d

    cold, _ = early_prompt_mean(False)
    warm, d = early_prompt_mean(True)
    steady = sum(program_at(PROFILE, 0, i).prompt_tokens_at(s) for i in range(30)
                 for s in range(len(program_at(PROFILE, 0, i).steps))) / sum(
                     len(program_at(PROFILE, 0, i).steps) for i in range(30))
    assert warm > 1.5 * cold and warm > 0.6 * steady
    r = d.result()
    assert r.window_check["warm_start"] and "steps_before_per_program" in r.window_check
    again = DesRun(CLUSTER, 2, "thunder", PROFILE, 30, 30.0, warmup_s=10.0, warm_start=True).run()
    assert dataclasses.asdict(again)["steps_per_min"] == r.steps_per_min


@pytest.mark.parametrize("reply", [1.0, 1.5])
def test_answers_come_back_as_the_models_tokenizer_makes_them(reply: float) -> None:
    """``model.reply_tokens_per_output``: an answer sent back as text re-encodes to its own
    tokens (1.0: the next call hits the cache through it) or to more, other tokens (the CPU
    engine's random-weight model: the hit ends where the answer starts).
    ``model.text_tokens_per_nominal`` scales the workload's text."""
    from thunder_sgl.benchmark.des.tokens import FIRST_TEMPLATE_TOKENS, STEP_TEMPLATE_TOKENS

    cfg = load_sim_config("tiny", {"hicache.enabled": False, "model.reply_tokens_per_output": reply,
                                   "model.text_tokens_per_nominal": 1.1})
    d = DesRun(cfg, 1, "direct", PROFILE, 1, 60.0, seed=4)
    d.run()
    spec = program_at(PROFILE, 4, 0)
    calls = sorted(d.rec.calls, key=lambda c: c[1])[:len(spec.steps)]  # the first program's (one at a time)
    assert len(calls) >= 3
    assert calls[0][2] == round(400 * 1.1) + round(spec.instance_tokens * 1.1) + FIRST_TEMPLATE_TOKENS
    for k, (a, b) in enumerate(zip(calls, calls[1:], strict=False)):
        grown = b[2] - a[2]
        answer = round(a[4] * reply)
        assert grown == answer + round(spec.steps[k].observation_tokens * 1.1) + STEP_TEMPLATE_TOKENS
        if reply == 1.0:
            assert b[3] >= a[2] + a[4] - 1  # the answer's KV reused
        else:
            assert a[2] - 1 <= b[3] <= a[2]  # the hit ends at the answer
