"""The closed-loop driver against the in-test fake OpenAI server (tests/benchmark/conftest.py)."""

from __future__ import annotations

import asyncio
import socket
from collections import Counter

import pytest

from thunder_sgl.benchmark.drivers.closed_loop import DriverEvent, DriverOptions, run_workload
from thunder_sgl.benchmark.measures.stats import percentile
from thunder_sgl.benchmark.workloads.profile import WorkloadProfile, program_at


def tiny(steps: int = 3, tool_seconds: float = 0.5, name: str = "tiny") -> WorkloadProfile:
    return WorkloadProfile.from_dict(
        {
            "name": name,
            "system_prompt_tokens": 50,
            "instance_tokens": {"kind": "uniform_int", "low": 10, "high": 30},
            "steps": steps,
            "output_tokens": {"kind": "uniform_int", "low": 4, "high": 12},
            "observation_tokens": 30,
            "tool_seconds": tool_seconds,
        }
    )


async def run(fake, profile=None, **kw):
    kw.setdefault("time_scale", 100.0)
    kw.setdefault("retry_backoff_s", 0.001)
    return await asyncio.wait_for(
        run_workload(fake.url, profile or tiny(), kw.pop("concurrency", 2), **kw), 20
    )


async def test_each_request_extends_the_previous_with_the_reply_as_returned(fake_openai):
    fake = await fake_openai()
    result = await run(fake, total_programs=4, seed=5)
    pids = [f"tiny-5-{i}" for i in range(4)]
    assert sorted(p.program_id for p in result.programs) == pids
    for pid in pids:
        calls = fake.program_calls(pid)
        assert len(calls) == 3
        for prev, cur in zip(calls, calls[1:], strict=False):
            old, new = prev.body["messages"], cur.body["messages"]
            assert new[: len(old)] == old and len(new) == len(old) + 2
            assert new[len(old)] == {"role": "assistant", "content": prev.reply}
            assert new[len(old) + 1]["role"] == "user"
        for c in calls:
            assert c.body["program_id"] == pid and c.body["model"] == "fake-model"
            assert c.headers["X-Program-Id"] == pid and c.headers["X-SMG-Routing-Key"] == pid
    # Every program opens with the same system prompt.
    assert len({c.body["messages"][0]["content"] for c in fake.calls}) == 1


async def test_driver_sends_the_generators_programs(fake_openai):
    fake = await fake_openai()
    profile = tiny(steps=2)
    await run(fake, profile, total_programs=3, seed=9)
    for i in range(3):
        spec = program_at(profile, 9, i)
        assert [c.body["max_tokens"] for c in fake.program_calls(spec.program_id)] == [
            s.output_tokens for s in spec.steps
        ]


async def test_release_is_called_once_per_program(fake_openai):
    fake = await fake_openai()
    result = await run(fake, total_programs=6, concurrency=3)
    assert fake.releases == Counter({p.program_id: 1 for p in result.programs})
    assert all(p.released and p.outcome == "completed" for p in result.programs)
    assert not fake.live


async def test_concurrency_is_respected_and_reached(fake_openai):
    fake = await fake_openai(delay_s=0.02)
    result = await run(fake, total_programs=9, concurrency=3)
    assert fake.max_live == 3 and fake.max_in_flight == 3
    assert len(result.programs) == 9


@pytest.mark.parametrize("time_scale", [10.0, 50.0])
async def test_time_scale_divides_tool_waits(fake_openai, time_scale):
    fake = await fake_openai()
    result = await run(
        fake,
        tiny(steps=2, tool_seconds=1.0),
        total_programs=1,
        concurrency=1,
        time_scale=time_scale,
    )
    for s in result.steps:
        waited = s.tool_end_s - s.end_s
        assert 1.0 / time_scale <= waited < 1.0 / time_scale + 0.15  # unscaled would be 1.0
    assert result.wall_s < 2 * 1.0 / time_scale + 0.6


async def test_failed_calls_are_retried_then_succeed(fake_openai):
    fake = await fake_openai(fail=lambda pid, n: 503 if n < 2 else None)
    result = await run(fake, total_programs=3)
    assert result.errors == Counter({"http_503": 6})
    assert all(p.outcome == "completed" and p.steps_done == 3 for p in result.programs)
    assert [s.attempt for s in result.steps if s.step == 0 and s.program_id == "tiny-0-0"] == [
        0,
        1,
        2,
    ]
    assert result.steps_completed == 9


async def test_a_step_that_keeps_failing_abandons_and_releases_the_program(fake_openai):
    fake = await fake_openai(fail=lambda pid, n: 500 if n >= 1 else None)
    result = await run(fake, total_programs=3, max_retries=2)
    assert all(p.outcome == "failed" and p.steps_done == 1 for p in result.programs)
    assert result.errors == Counter({"http_500": 9})  # 3 programs × (1 try + 2 retries)
    assert fake.releases == Counter({p.program_id: 1 for p in result.programs})


async def test_client_errors_are_not_retried(fake_openai):
    fake = await fake_openai(fail=lambda pid, n: 400)
    result = await run(fake, total_programs=2)
    assert result.errors == Counter({"http_400": 2})
    assert [p.outcome for p in result.programs] == ["failed", "failed"]


async def test_unreachable_endpoint_fails_fast_and_never_hangs():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = await asyncio.wait_for(
        run_workload(
            f"http://127.0.0.1:{port}",
            tiny(),
            2,
            total_programs=2,
            max_retries=1,
            retry_backoff_s=0.001,
        ),
        10,
    )
    assert result.errors == Counter({"connection": 4})
    assert [p.outcome for p in result.programs] == ["failed", "failed"]


async def test_metrics_equal_what_the_server_returned(fake_openai):
    fake = await fake_openai()
    result = await run(fake, total_programs=5, concurrency=2, time_scale=20.0)
    ok = fake.ok_calls
    assert result.prompt_tokens == sum(c.prompt_tokens for c in ok)
    assert result.cached_tokens == sum(c.cached_tokens for c in ok) > 0
    assert result.kv_hit_rate == sum(c.cached_tokens for c in ok) / sum(c.prompt_tokens for c in ok)
    s = result.summary()
    assert s["completion_tokens"] == sum(c.completion_tokens for c in ok)
    assert s["steps_completed"] == 15 and s["programs_completed"] == 5
    assert s["steps_per_min"] == pytest.approx(60 * 15 / (result.wall_s * 20.0))
    done = [(p.end_s - p.start_s) * 20.0 for p in result.programs]
    assert s["program_completion_p50_s"] == percentile(done, 50)
    assert s["step_latency_p99_s"] == percentile([x.latency_s * 20.0 for x in result.steps], 99)
    # The fake's cached tokens are the previous turn's prompt + completion: check the driver
    # recorded them per step, not just in sum.
    by_step = {(x.program_id, x.step): x for x in result.steps}
    for c in ok:
        rec = by_step[(c.body["program_id"], len(c.body["messages"]) // 2 - 1)]
        assert (rec.prompt_tokens, rec.completion_tokens, rec.cached_tokens) == (
            c.prompt_tokens,
            c.completion_tokens,
            c.cached_tokens,
        )


async def test_stock_router_release_is_tried_once(fake_openai):
    fake = await fake_openai(release_mode="stock")
    result = await run(fake, total_programs=5, concurrency=1)
    assert sum(fake.releases.values()) == 1
    assert not result.release_supported
    assert all(p.outcome == "completed" for p in result.programs)


async def test_duration_stops_cleanly_and_releases_every_started_program(fake_openai):
    fake = await fake_openai()
    t0 = asyncio.get_running_loop().time()
    result = await run(
        fake, tiny(steps=5, tool_seconds=100.0), duration_s=0.3, concurrency=3, time_scale=1.0
    )
    assert asyncio.get_running_loop().time() - t0 < 2.0
    assert len(result.programs) == 3
    assert all(p.outcome == "cancelled" for p in result.programs)
    assert set(fake.releases) == {p.program_id for p in result.programs}
    assert not fake.live
    assert result.steps_completed == 0 and result.wall_s == pytest.approx(0.3, abs=0.2)


@pytest.mark.parametrize("api", ["chat", "completions"])
async def test_streaming_collects_reply_and_usage(fake_openai, api):
    fake = await fake_openai()
    result = await run(fake, total_programs=2, stream=True, api=api)
    assert all(p.outcome == "completed" for p in result.programs)
    assert result.cached_tokens == sum(c.cached_tokens for c in fake.ok_calls) > 0
    calls = fake.program_calls("tiny-0-0")
    assert all(
        c.body["stream"] is True and c.body["stream_options"] == {"include_usage": True}
        for c in calls
    )
    if api == "chat":
        assert calls[1].body["messages"][2]["content"] == calls[0].reply
    else:
        assert calls[0].path == "/v1/completions" and calls[1].body["prompt"].startswith(
            calls[0].body["prompt"] + calls[0].reply
        )


async def test_events_report_progress(fake_openai):
    fake = await fake_openai()
    events: list[DriverEvent] = []
    await run(fake, total_programs=2, on_event=events.append)
    kinds = Counter(e.kind for e in events)
    assert kinds == Counter({"program_start": 2, "step": 6, "tool_end": 6, "program_end": 2})


async def test_options_object_headers_and_api_key(fake_openai):
    fake = await fake_openai()
    opts = DriverOptions(total_programs=1, time_scale=100.0, model="m1", api_key="sk-x")
    result = await run_workload(fake.url, tiny(steps=1), 1, opts, headers={"X-Tenant": "t"})
    assert result.summary()["programs_completed"] == 1
    (call,) = fake.calls
    assert call.body["model"] == "m1" and call.body["ignore_eos"] is True
    assert call.headers["Authorization"] == "Bearer sk-x" and call.headers["X-Tenant"] == "t"


async def test_run_needs_an_end_and_known_options():
    with pytest.raises(ValueError):
        await run_workload("http://127.0.0.1:1", tiny(), 1)
    with pytest.raises(TypeError):
        await run_workload("http://127.0.0.1:1", tiny(), 1, total_programs=1, colour="blue")


async def test_with_several_endpoints_each_slot_keeps_one_and_programs_never_cross(fake_openai):
    a, b = await fake_openai(), await fake_openai()
    result = await asyncio.wait_for(run_workload([a.url, b.url], tiny(), 4, total_programs=8, time_scale=100.0,
                                                 retry_backoff_s=0.001), 20)
    assert len(result.programs) == 8 and all(p.outcome == "completed" for p in result.programs)
    for p in result.programs:
        here = a if p.endpoint == a.url else b
        there = b if here is a else a
        assert len(here.program_calls(p.program_id)) == 3 and not there.program_calls(p.program_id)
    # Two slots per endpoint: each saw half the programs' calls at most one program apart.
    assert abs(len(a.ok_calls) - len(b.ok_calls)) <= 3


async def test_a_warm_start_sends_each_slots_first_program_with_its_history(fake_openai):
    fake = await fake_openai()
    profile = tiny(steps=6)
    result = await run(fake, profile, total_programs=5, concurrency=3, seed=2, warm_start=True)
    starts = {}
    for i in range(5):
        spec = program_at(profile, 2, i)
        calls = fake.program_calls(spec.program_id)
        first = calls[0].body["messages"]
        k = (len(first) - 2) // 2  # system + task, then a reply and an observation per step of history
        starts[i] = k
        assert len(calls) == 6 - k, "the steps from the start step on, each once"
        assert [c.body["max_tokens"] for c in calls] == [s.output_tokens for s in spec.steps[k:]]
        assert all(m["role"] == ("assistant" if j % 2 == 0 else "user") for j, m in enumerate(first[2:]))
    assert all(starts[i] == 0 for i in (3, 4)), "programs after the first slot-full start new"
    assert any(starts[i] > 0 for i in (0, 1, 2)), "the slots' first programs join mid-life"
    assert all(p.outcome == "completed" for p in result.programs)
