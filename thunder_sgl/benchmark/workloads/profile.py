"""Agent workload profiles and the deterministic program generator.

A *profile* (``configs/workloads/<name>.yaml``) describes one kind of agent as distributions:
steps per program, tokens of the task, output tokens per LLM call, tokens of each tool
observation, and tool time. A *program* is one concrete trajectory drawn from it::

    system prompt (shared by every program of the profile) + instance (the task)
    step i: LLM call (output_tokens_i) → tool call (tool_seconds_i) → observation_tokens_i

The generator is a pure function of ``(profile, seed, index)``: program ``index`` draws from its
own ``random.Random`` seeded by ``(seed, index)``, so the same seed yields the same programs in
the same order however they are consumed — by the HTTP driver, by locust users in any order, or
by a discrete-event simulation that never renders a byte of text. Tool seconds are in the
workload's own (virtual, GPU-time) seconds; an HTTP client against a simulator running S times
faster than real time waits ``tool_seconds / S`` real seconds.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from thunder_sgl.benchmark.workloads.distributions import Distribution, Mixture, parse_distribution
from thunder_sgl.config import from_dict, load_yaml, resolve_config_path
from thunder_sgl.errors import ConfigError

_DIST_FIELDS = ("instance_tokens", "steps", "output_tokens", "observation_tokens", "tool_seconds")


@dataclass(frozen=True)
class WorkloadProfile:
    """One kind of agent workload, as distributions (numbers and sources: the YAML files)."""

    name: str
    """Profile name; prefixes program ids. Defaults to the YAML file's stem."""

    system_prompt_tokens: int
    """Tokens of the system prompt (plus tool schemas), byte-identical across the profile's
    programs, so prefix caches share it."""

    instance_tokens: Distribution
    """Tokens of the first user message (the task or issue); specific to each program."""

    steps: Distribution
    """LLM calls per program (rounded, at least 1)."""

    output_tokens: Distribution
    """Output tokens per LLM call (``max_tokens`` of the request; rounded, at least 1)."""

    observation_tokens: Distribution
    """Tokens of the tool observation appended after each LLM call (rounded, >= 0)."""

    tool_seconds: Distribution
    """Tool time per step in workload seconds. A mixture labels each step with its component
    (the tool kind)."""

    tool_name: str = "tool"
    """Label of the tool when ``tool_seconds`` is not a mixture."""

    max_context_tokens: int = 0
    """Context limit of the model: a program's steps end before the call whose prompt plus
    output would exceed it; the agent sends that call and stops when the engine refuses it
    (``ProgramSpec.overflow_output``; the DES sends it, the HTTP drivers do not). 0: no limit."""

    end_sign_share: float = 0.0
    """Share of the programs that end on their own (not by the context limit) whose last answer
    carries their framework's end sign — mini-swe-agent's submit command, OpenHands' ``finish``
    call (``control.conversations`` rule 7). Only a client without program ids shows it to the
    router (the DES's ``thunder-inferred``). 0 in every shipped profile: how many real runs end
    that way, rather than at a step or cost limit, is not measured here; a sweep sets it."""

    description: str = ""
    """One line on what the profile models."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("workload name must not be empty")
        if not 0.0 <= self.end_sign_share <= 1.0:
            raise ConfigError(f"workload {self.name}: end_sign_share must be in [0, 1]")
        if self.system_prompt_tokens < 0 or self.max_context_tokens < 0:
            raise ConfigError(f"workload {self.name}: token counts must be >= 0")
        if self.max_context_tokens and self.max_context_tokens <= self.system_prompt_tokens:
            raise ConfigError(
                f"workload {self.name}: max_context_tokens must exceed system_prompt_tokens"
            )

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "workload") -> WorkloadProfile:
        """Build from plain data (YAML); distributions are parsed, unknown keys fail loudly."""
        raw = dict(data)
        for key in _DIST_FIELDS:
            if key in raw:
                raw[key] = parse_distribution(raw[key], f"{where}.{key}")
        return from_dict(cls, raw, where)


def load_profile(name_or_path: str | Path) -> WorkloadProfile:
    """A profile by bare name (``mini-swe-agent``: found in ``configs/workloads/``) or by path."""
    path = resolve_config_path(name_or_path, "workloads")
    data = load_yaml(path)
    data.setdefault("name", path.stem)
    return WorkloadProfile.from_dict(data, path.stem)


@dataclass(frozen=True, slots=True)
class StepSpec:
    """One step: an LLM call, then a tool call whose result is the next user message."""

    observation_tokens: int
    """Tokens of the tool observation appended after this step's reply."""

    output_tokens: int
    """Output tokens asked of the LLM call (``max_tokens``)."""

    tool_seconds: float
    """Tool time after the LLM call, in workload (virtual) seconds."""

    tool: str = "tool"
    """Which tool ran (a mixture component's name, else the profile's ``tool_name``)."""


@dataclass(frozen=True, slots=True)
class ProgramSpec:
    """One agent program: its id, its prompt sizes and its steps, all drawn from a profile."""

    program_id: str
    index: int
    """Position in the seed's sequence (0-based)."""
    system_prompt_tokens: int
    instance_tokens: int
    steps: tuple[StepSpec, ...]
    group_id: str | None = None
    """The group (RL task) this program is a sample of (``rollout.spec``); None: no group."""
    task: int | None = None
    """Index of the task whose instance the program shares with its group (its token ids are
    the task's, ``des.tokens``); None: the instance is the program's own."""
    start_step: int = 0
    """First LLM call the driver sends (``warm_start``): the steps before it are history, whose
    replies and observations the first request already carries. 0: the program starts new."""
    start_wait_s: float = 0.0
    """Workload seconds before that first call (the rest of the previous step's tool time)."""
    signs_end: bool = False
    """Its last answer carries the end sign (``WorkloadProfile.end_sign_share``)."""
    overflow_output: int = 0
    """Cut by the model's context (``WorkloadProfile.max_context_tokens``): after its last
    step's tool the agent sends one more call, with that step's observation and this many
    output tokens, which the model's window cannot hold, and stops when the engine refuses it
    (as mini-swe-agent does on SGLang's 400). 0: it stops on its own after its last step."""

    def output_tokens_at(self, step: int) -> int:
        """``max_tokens`` of LLM call ``step``; ``len(steps)``: the refused call of a program cut
        by the context (``overflow_output``)."""
        return self.steps[step].output_tokens if step < len(self.steps) else self.overflow_output

    def prompt_tokens_at(self, step: int) -> int:
        """Nominal prompt tokens of LLM call ``step``: system + instance + every earlier output
        and observation (the server's tokenizer and chat template make the real count differ)."""
        return (
            self.system_prompt_tokens
            + self.instance_tokens
            + sum(s.output_tokens + s.observation_tokens for s in self.steps[:step])
        )

    @property
    def final_context_tokens(self) -> int:
        """Nominal context after the last LLM call (its observation is never sent)."""
        return self.prompt_tokens_at(len(self.steps) - 1) + self.steps[-1].output_tokens

    @property
    def tool_seconds(self) -> float:
        return sum(s.tool_seconds for s in self.steps)


def program_rng(seed: int, index: int) -> random.Random:
    """The generator of program ``index`` under ``seed``: independent of every other program."""
    digest = hashlib.sha256(f"thunder-workload:{seed}:{index}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def program_at(profile: WorkloadProfile, seed: int, index: int, instance_tokens: int | None = None) -> ProgramSpec:
    """Program ``index`` of the sequence named by ``(profile, seed)``: a pure function.
    ``instance_tokens`` replaces the drawn instance size (a sample of a task whose instance is
    given); every other draw is unchanged."""
    if index < 0:
        raise ValueError(f"program index must be >= 0, got {index}")
    rng = program_rng(seed, index)
    instance = max(0, round(profile.instance_tokens.sample(rng)))
    if instance_tokens is not None:
        instance = instance_tokens
    n = max(1, round(profile.steps.sample(rng)))
    steps = []
    for _ in range(n):
        output = max(1, round(profile.output_tokens.sample(rng)))
        observation = max(0, round(profile.observation_tokens.sample(rng)))
        if isinstance(profile.tool_seconds, Mixture):
            comp = profile.tool_seconds.pick(rng)
            tool, seconds = comp.name, comp.dist.sample(rng)
        else:
            tool, seconds = profile.tool_name, profile.tool_seconds.sample(rng)
        steps.append(StepSpec(observation, output, max(0.0, seconds), tool))
    # All draws are made before truncation so that the draws a program takes never depend on it.
    overflow = 0
    if profile.max_context_tokens:
        context, kept = profile.system_prompt_tokens + instance, 0
        for s in steps:
            if kept and context + s.output_tokens > profile.max_context_tokens:
                overflow = s.output_tokens  # the call the window cannot hold: sent, and refused
                break
            context += s.output_tokens + s.observation_tokens
            kept += 1
        steps = steps[:kept]
    # Drawn last, so that no other draw depends on the share.
    signs = profile.end_sign_share > 0 and len(steps) == n and rng.random() < profile.end_sign_share
    return ProgramSpec(
        program_id=f"{profile.name}-{seed}-{index}",
        index=index,
        system_prompt_tokens=profile.system_prompt_tokens,
        instance_tokens=instance,
        steps=tuple(steps),
        signs_end=signs,
        overflow_output=overflow,
    )


def generate_programs(profile: WorkloadProfile, seed: int, start: int = 0) -> Iterator[ProgramSpec]:
    """Programs ``start, start+1, …`` of ``(profile, seed)``, without end."""
    index = start
    while True:
        yield program_at(profile, seed, index)
        index += 1


def warm_start(spec: ProgramSpec, seed: int) -> ProgramSpec:
    """``spec`` joined mid-life, as a closed loop at its steady state holds it: at a step drawn
    uniformly from its steps, after a wait drawn uniformly from the previous step's tool time
    (the slot is mid-tool). A pure function of ``(seed, spec.index)``, independent of the
    program's own draws.

    A closed loop of N programs that all start at step 0 needs about one program lifetime to
    reach its steady state (every context starts at its smallest, programs that start together
    step together); N programs started this way carry contexts of the steady mix from the first
    request, and their steps are spread out. What stays transient is that their KV is in no
    cache yet: each program's first request prefills its whole history (a cold start of one
    step per program, ``measures.derived.window_check``). The steady state holds a program with
    probability proportional to its length; a uniform step of the next program in the sequence
    ignores that length bias (small where steps per program vary little)."""
    digest = hashlib.sha256(f"thunder-warm-start:{seed}:{spec.index}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "big"))
    k = rng.randrange(len(spec.steps))
    wait = rng.random() * spec.steps[k - 1].tool_seconds if k else 0.0
    return replace(spec, start_step=k, start_wait_s=wait)


class ProgramSource:
    """Hands out the programs of ``(profile, seed)`` in order, up to ``limit`` (None: no end).

    The closed-loop driver and a DES share this contract: a slot that finishes a program asks
    ``next()`` for the following one; ``None`` means the workload is exhausted. The first
    ``warm`` programs (one per slot of a closed loop) start mid-life (``warm_start``); the
    programs are the same either way.
    """

    def __init__(self, profile: WorkloadProfile, seed: int, limit: int | None = None, warm: int = 0) -> None:
        if limit is not None and limit < 0:
            raise ValueError("limit must be >= 0")
        if warm < 0:
            raise ValueError("warm must be >= 0")
        self.profile = profile
        self.seed = seed
        self.limit = limit
        self.warm = warm
        self.issued = 0
        """Programs handed out so far."""

    def next(self) -> ProgramSpec | None:
        if self.limit is not None and self.issued >= self.limit:
            return None
        spec = program_at(self.profile, self.seed, self.issued)
        if self.issued < self.warm:
            spec = warm_start(spec, self.seed)
        self.issued += 1
        return spec


def mean_context_tokens(profile: WorkloadProfile, seed: int, n: int = 300) -> float:
    """Average prompt tokens over the LLM calls of programs 0..n−1 of ``(profile, seed)``: a
    program's resident context averaged over its life (c̄ of calibration.md §10, nominal)."""
    total = steps = 0
    for k in range(n):
        spec = program_at(profile, seed, k)
        for i in range(len(spec.steps)):
            total += spec.prompt_tokens_at(i)
        steps += len(spec.steps)
    return total / max(1, steps)
