"""RL rollouts as a workload: tasks × samples (groups), released in batches or waves, with the
trainer's weight updates on a timer. Pure: the DES (``rollout.des``) runs it; HTTP mode has no
rollout driver.

GRPO-style training samples G trajectories per task (a *group*: same system prompt, same task,
own steps and observations) and, in synchronous RL, a training step waits for the whole batch
of T tasks × G samples before the next batch starts. Two release modes:

- ``sync``: batch k (T×G programs) is released at once when batch k−1 has finished entirely;
  ``batches`` of them. Per batch: makespan, steps/min, completions, group spread.
- ``async`` (asynchronous RL, off-policy by a bounded lag): N = ``programs`` in flight, topped
  up by whole groups — whenever G slots are free, the next task's G samples start together —
  so the cluster always holds N programs in waves of groups. Measured over a window after a
  warm-up, like the closed-loop benchmark, plus per-group measures.

The trainer updates the weights every ``update_every_s`` simulated seconds; an update takes
``update_seconds`` and pauses every engine (``update_pause``: SGLang's pause modes) whatever the
router, as a trainer that owns the engines does. Members of task k have ids
``<profile>-<seed>-t<k>-s<i>`` and group ``<profile>-<seed>-t<k>``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from thunder_sgl.benchmark.measures.stats import percentile
from thunder_sgl.benchmark.workloads.profile import ProgramSpec, WorkloadProfile, program_at

MODES = ("sync", "async")
PAUSE_MODES = ("retract", "abort", "in_place")
SAMPLE_INDEX_BASE = 1 << 30
"""Sample programs draw their steps at indices past those of ordinary programs."""


@dataclass(frozen=True)
class RolloutSpec:
    """One rollout configuration. Times are simulated seconds."""

    mode: str = "sync"
    """``sync`` (batches, each released at once when the previous one has finished) or
    ``async`` (``programs`` in flight, topped up by whole groups)."""
    tasks: int = 18
    """Sync: tasks (groups) per batch (T)."""
    group_size: int = 8
    """Samples per task (G)."""
    batches: int = 3
    """Sync: batches run."""
    update_every_s: float = 600.0
    """Trainer: a weight update this often (0: none)."""
    update_seconds: float = 30.0
    """Trainer: how long one weight update holds the engines paused."""
    update_pause: str = "retract"
    """Pause mode of the engines during an update (SGLang's /pause_generation modes)."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown rollout mode {self.mode!r}; valid: {', '.join(MODES)}")
        if self.update_pause not in PAUSE_MODES:
            raise ValueError(f"unknown pause mode {self.update_pause!r}; valid: {', '.join(PAUSE_MODES)}")
        if self.tasks < 1 or self.group_size < 1 or self.batches < 1:
            raise ValueError("need tasks, group_size and batches >= 1")
        if self.update_every_s < 0 or self.update_seconds < 0:
            raise ValueError("need update_every_s >= 0 and update_seconds >= 0")
        if self.update_every_s and self.update_seconds >= self.update_every_s:
            raise ValueError("a weight update must be shorter than the time between updates")

    @property
    def batch_programs(self) -> int:
        return self.tasks * self.group_size

    def update_times(self, until: float) -> list[float]:
        """Start times of the weight updates before ``until``."""
        if not self.update_every_s:
            return []
        return [k * self.update_every_s for k in range(1, int(until // self.update_every_s) + 1)]


def group_id(profile: WorkloadProfile, seed: int, task: int) -> str:
    return f"{profile.name}-{seed}-t{task}"


def sample_spec(profile: WorkloadProfile, seed: int, task: int, sample: int, group_size: int) -> ProgramSpec:
    """Sample ``sample`` of task ``task``: the task's instance (size and, in the DES, tokens),
    its own steps, outputs, observations and tool times."""
    instance = program_at(profile, seed, task).instance_tokens
    index = SAMPLE_INDEX_BASE + task * group_size + sample
    spec = program_at(profile, seed, index, instance_tokens=instance)
    gid = group_id(profile, seed, task)
    return replace(spec, program_id=f"{gid}-s{sample}", group_id=gid, task=task)


def task_specs(profile: WorkloadProfile, seed: int, task: int, group_size: int) -> list[ProgramSpec]:
    return [sample_spec(profile, seed, task, s, group_size) for s in range(group_size)]


# ---------------------------------------------------------------- measures


@dataclass
class ProgramDone:
    """One finished program of a rollout: its group, when its batch (or group) was released,
    its first response, its end, its steps, how it ended."""

    group: str
    batch: int
    released: float
    first_response: float | None
    end: float
    steps: int
    ok: bool


def group_measures(done: list[ProgramDone]) -> dict[str, float]:
    """Per group (members complete): spread = last − first member's completion; ratio = last
    member's completion / the group's median completion (completion from the group's release)."""
    by: dict[str, list[float]] = {}
    for d in done:
        by.setdefault(d.group, []).append(d.end - d.released)
    spreads, ratios = [], []
    for c in by.values():
        c.sort()
        med = float(np.median(c))
        spreads.append(c[-1] - c[0])
        ratios.append(c[-1] / med if med > 0 else 1.0)
    return {
        "groups": len(by),
        "group_spread_p50_s": percentile(spreads, 50, empty=0.0),
        "group_spread_max_s": max(spreads, default=0.0),
        "last_over_median_p50": percentile(ratios, 50, empty=0.0),
        "last_over_median_max": max(ratios, default=0.0),
    }


def batch_measures(batch: int, released: float, done: list[ProgramDone], steps: int) -> dict[str, float]:
    """Makespan (release to the last program's end), steps/min over it, completion and time to
    first response percentiles, group measures, programs that did not end well."""
    ends = [d.end for d in done]
    makespan = (max(ends) - released) if ends else 0.0
    comp = [d.end - d.released for d in done]
    ttfr = [d.first_response - d.released for d in done if d.first_response is not None]
    out: dict[str, float] = {
        "batch": batch, "released_s": released, "programs": len(done), "steps": steps,
        "makespan_s": makespan, "steps_per_min": 60.0 * steps / makespan if makespan > 0 else 0.0,
        "completion_p50_s": percentile(comp, 50, empty=0.0),
        "completion_p99_s": percentile(comp, 99, empty=0.0),
        "first_response_p50_s": percentile(ttfr, 50, empty=0.0),
        "first_response_max_s": max(ttfr, default=0.0),
        "programs_failed": sum(1 for d in done if not d.ok),
    }
    out.update(group_measures(done))
    return out
