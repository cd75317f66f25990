"""Workload profiles, distributions and the deterministic program generator."""

from __future__ import annotations

import random
import re
import statistics
from dataclasses import replace

import pytest

from thunder_sgl.benchmark.workloads.distributions import (
    Fixed,
    LogNormal,
    Mixture,
    Normal,
    UniformInt,
    parse_distribution,
)
from thunder_sgl.benchmark.workloads.profile import (
    ProgramSource,
    WorkloadProfile,
    generate_programs,
    load_profile,
    program_at,
    warm_start,
)
from thunder_sgl.config import CONFIG_DIR
from thunder_sgl.errors import ConfigError

PROFILES = ["mini-swe-agent", "openhands", "toolorchestra"]


def quantile(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=1000)[round(q * 1000) - 1]


@pytest.mark.parametrize("name", PROFILES)
def test_profiles_load_by_bare_name(name):
    p = load_profile(name)
    assert p.name == name
    assert p.system_prompt_tokens > 0
    assert load_profile(CONFIG_DIR / "workloads" / f"{name}.yaml") == p


def test_unknown_profile_lists_the_packaged_ones():
    with pytest.raises(ConfigError, match="mini-swe-agent"):
        load_profile("no-such-agent")


@pytest.mark.parametrize("name", PROFILES)
def test_every_number_in_a_profile_states_its_status(name):
    text = (CONFIG_DIR / "workloads" / f"{name}.yaml").read_text()
    for line in text.splitlines():
        code = line.split("#", 1)[0]
        if re.search(r":\s*-?\d", code):
            assert re.search(r"#\s*(source|plot|derived|estimate)\b", line), (
                f"no status on: {line!r}"
            )


@pytest.mark.parametrize(
    "mutation, message",
    [
        ({"colour": "blue"}, "unknown key"),
        ({"system_prompt_tokens": -5}, ">= 0"),
        ({"steps": {"kind": "normal", "mean": 30, "std": -1}}, "std >= 0"),
        ({"steps": {"kind": "uniform_int", "low": 10, "high": 5}}, "low <= high"),
        ({"tool_seconds": {"kind": "lognormal", "median": 2, "p95": 1}}, "p95 must exceed"),
        ({"tool_seconds": {"kind": "lognormal", "median": 2}}, "exactly one of p95 and sigma"),
        ({"tool_seconds": {"kind": "lognormal", "median": 2, "sigma": 1, "cap": 9}}, "unknown key"),
        ({"tool_seconds": {"kind": "gamma", "shape": 2}}, "unknown distribution kind"),
        (
            {
                "tool_seconds": {
                    "kind": "mixture",
                    "components": [{"name": "a", "weight": -1, "dist": 1}],
                }
            },
            "weight",
        ),
        ({"output_tokens": "lots"}, "must be a number or a mapping"),
        ({"steps": {"kind": "fixed", "value": -3}}, ">= 0"),
    ],
)
def test_broken_profile_fails_loudly(tmp_path, mutation, message):
    import yaml

    data = yaml.safe_load((CONFIG_DIR / "workloads" / "mini-swe-agent.yaml").read_text())
    data.update(mutation)
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=message):
        load_profile(path)


def test_same_seed_gives_the_same_programs_however_consumed():
    p = load_profile("mini-swe-agent")
    in_order = [program_at(p, 7, i) for i in range(40)]
    backwards = [program_at(p, 7, i) for i in reversed(range(40))][::-1]
    gen = generate_programs(p, 7)
    from_gen = [next(gen) for _ in range(40)]
    # Two sources consumed interleaved (two locust users, or DES and driver side by side).
    a, b = ProgramSource(p, 7), ProgramSource(p, 7)
    interleaved = []
    for i in range(40):
        interleaved.append(a.next())
        if i % 3 == 0:
            b.next()
    assert in_order == backwards == from_gen == interleaved
    assert next(generate_programs(p, 7, start=10)) == in_order[10]
    assert [s.program_id for s in in_order[:2]] == ["mini-swe-agent-7-0", "mini-swe-agent-7-1"]


def test_different_seeds_and_indices_differ():
    p = load_profile("mini-swe-agent")
    assert program_at(p, 1, 0).steps != program_at(p, 2, 0).steps
    assert program_at(p, 1, 0).steps != program_at(p, 1, 1).steps


def test_source_limit_ends_the_workload():
    src = ProgramSource(load_profile("toolorchestra"), 0, limit=3)
    got = [src.next() for _ in range(5)]
    assert [g.index for g in got[:3]] == [0, 1, 2] and got[3:] == [None, None]
    assert src.issued == 3


def test_system_prompt_is_shared_and_instances_differ():
    p = load_profile("openhands")
    progs = [program_at(p, 0, i) for i in range(50)]
    assert {x.system_prompt_tokens for x in progs} == {6000}
    assert len({x.instance_tokens for x in progs}) > 10


def test_swe_tool_time_matches_its_configured_lognormal():
    p = load_profile("mini-swe-agent")
    tools = [s.tool_seconds for i in range(600) for s in program_at(p, 3, i).steps]
    assert len(tools) > 10_000
    assert statistics.median(tools) == pytest.approx(0.5, rel=0.08)
    assert quantile(tools, 0.95) == pytest.approx(8.0, rel=0.15)
    assert max(tools) <= 60.0
    assert {s.tool for s in program_at(p, 3, 0).steps} == {"bash"}


def test_mini_swe_agent_steps_and_final_context_match_calibration():
    p = load_profile("mini-swe-agent")
    progs = [program_at(p, 0, i) for i in range(1000)]
    steps = [len(x.steps) for x in progs]
    assert statistics.fmean(steps) == pytest.approx(30, abs=1.5)
    assert min(steps) >= 8 and max(steps) <= 100
    final = statistics.fmean(x.final_context_tokens for x in progs)
    assert 20_000 <= final <= 35_000
    outputs = [s.output_tokens for x in progs for s in x.steps]
    assert min(outputs) >= 100 and max(outputs) <= 400
    assert statistics.fmean(outputs) == pytest.approx(250, rel=0.03)
    assert max(s.observation_tokens for x in progs for s in x.steps) <= 2500


def test_openhands_has_longer_contexts_than_mini_swe_agent():
    mini, oh = load_profile("mini-swe-agent"), load_profile("openhands")
    f = lambda p: statistics.fmean(program_at(p, 0, i).final_context_tokens for i in range(400))  # noqa: E731
    assert f(oh) > 1.5 * f(mini)


def test_toolorchestra_tools_are_a_heavy_tailed_mixture_within_the_context_limit():
    p = load_profile("toolorchestra")
    assert isinstance(p.tool_seconds, Mixture)
    progs = [program_at(p, 0, i) for i in range(1500)]
    steps = [s for x in progs for s in x.steps]
    kinds = {s.tool for s in steps}
    assert kinds == {"search", "enhance_reasoning", "answer"}
    share = sum(s.tool == "enhance_reasoning" for s in steps) / len(steps)
    assert share == pytest.approx(0.45, abs=0.03)
    tools = [s.tool_seconds for s in steps]
    assert 4.0 <= statistics.median(tools) <= 10.0
    assert 35.0 <= quantile(tools, 0.95) <= 70.0
    enh = [s.tool_seconds for s in steps if s.tool == "enhance_reasoning"]
    assert statistics.median(enh) == pytest.approx(17.0, rel=0.1)
    assert all(x.final_context_tokens <= 40960 for x in progs)


@pytest.mark.parametrize(
    "dist, mean, median",
    [
        (Fixed(3.0), 3.0, 3.0),
        (UniformInt(100, 400), 250.0, 250.0),
        (Normal(30, 5, 0, None), 30.0, 30.0),
        (LogNormal(2.0, sigma=0.5), 2.0 * 2.718281828 ** (0.5**2 / 2), 2.0),
    ],
)
def test_distribution_sample_statistics(dist, mean, median):
    rng = random.Random(11)
    xs = [dist.sample(rng) for _ in range(20_000)]
    assert statistics.fmean(xs) == pytest.approx(mean, rel=0.03)
    assert statistics.median(xs) == pytest.approx(median, rel=0.03)


def test_lognormal_p95_and_cap():
    d = LogNormal(0.5, p95=8.0, max=60.0)
    assert d.quantile(0.95) == pytest.approx(8.0)
    assert d.quantile(0.5) == pytest.approx(0.5)
    rng = random.Random(0)
    assert max(d.sample(rng) for _ in range(50_000)) == 60.0


def test_bare_number_is_a_fixed_distribution():
    assert parse_distribution(4, "x") == Fixed(4.0)


def test_profile_from_dict_needs_every_distribution():
    with pytest.raises(ConfigError):
        WorkloadProfile.from_dict({"name": "x", "system_prompt_tokens": 10})


def test_context_limit_truncates_programs_but_keeps_one_step():
    p = WorkloadProfile.from_dict(
        {
            "name": "tiny",
            "system_prompt_tokens": 100,
            "instance_tokens": 50,
            "steps": 10,
            "output_tokens": 100,
            "observation_tokens": 100,
            "tool_seconds": 0,
            "max_context_tokens": 660,
        }
    )
    spec = program_at(p, 0, 0)
    # 150 + (100+100)·2 = 550; a third call would need 550 + 100 = 650 <= 660: kept; a fourth not.
    assert len(spec.steps) == 3
    assert spec.prompt_tokens_at(2) == 550 and spec.final_context_tokens == 650
    # the fourth call is the one the agent sends and the engine refuses: its 100 output tokens
    assert spec.overflow_output == 100 and spec.output_tokens_at(3) == 100 and spec.output_tokens_at(2) == 100
    assert program_at(replace(p, max_context_tokens=0), 0, 0).overflow_output == 0  # ends on its own
    assert program_at(replace(p, max_context_tokens=5000), 0, 0).overflow_output == 0


def test_warm_start_joins_the_first_programs_mid_life_and_keeps_the_program_sequence():
    p = load_profile("mini-swe-agent")
    cold, warm = ProgramSource(p, 4), ProgramSource(p, 4, warm=30)
    a = [cold.next() for _ in range(40)]
    b = [warm.next() for _ in range(40)]
    assert a[30:] == b[30:] and all(s.start_step == 0 and s.start_wait_s == 0 for s in a)
    for x, y in zip(a[:30], b[:30], strict=True):
        # The same program (same draws), joined at a step of its own: a pure function of (seed, index).
        assert replace(y, start_step=0, start_wait_s=0.0) == x and y == warm_start(x, 4)
        assert 0 <= y.start_step < len(y.steps)
        prev_tool = y.steps[y.start_step - 1].tool_seconds if y.start_step else 0.0
        assert 0 <= y.start_wait_s <= prev_tool
    starts = [s.start_step / len(s.steps) for s in b[:30]]
    # Spread over the programs' lives (uniform: not all at the start nor at the end).
    assert min(starts) < 0.25 and max(starts) > 0.6
    assert warm_start(a[0], 5) != warm_start(a[0], 4) or len(a[0].steps) == 1
    with pytest.raises(ValueError, match="warm"):
        ProgramSource(p, 4, warm=-1)


def test_the_end_sign_is_drawn_last_and_never_on_a_program_the_context_limit_cut():
    """``end_sign_share``: the share of programs whose last answer signs their end (the DES's
    ``thunder-inferred`` reads it, ``conversations`` rule 7); drawn after every other draw, so
    the programs are the same whatever the share, and no program cut short by the context limit
    signs."""
    base = replace(load_profile("mini-swe-agent"), max_context_tokens=0)
    half, full = replace(base, end_sign_share=0.5), replace(base, end_sign_share=1.0)
    signs = []
    for i in range(400):
        p0, p5, p1 = (program_at(p, 7, i) for p in (base, half, full))
        assert p0.steps == p5.steps == p1.steps and p0.instance_tokens == p1.instance_tokens
        assert not p0.signs_end and p1.signs_end
        signs.append(p5.signs_end)
    assert 0.4 < sum(signs) / len(signs) < 0.6
    tight = replace(full, max_context_tokens=full.system_prompt_tokens + 20_000)
    cut = [program_at(tight, 7, i) for i in range(400)]
    whole = [program_at(full, 7, i) for i in range(400)]
    shortened = [c for c, w in zip(cut, whole, strict=True) if len(c.steps) < len(w.steps)]
    assert shortened and not any(c.signs_end for c in shortened)
    assert all(c.signs_end for c, w in zip(cut, whole, strict=True) if len(c.steps) == len(w.steps))
    with pytest.raises(ConfigError):
        replace(base, end_sign_share=1.5)
