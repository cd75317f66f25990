"""What a DES run records, and the measures computed from it (same definitions as ``measures.stats``).

- **steps/min**: steps (an LLM call plus its tool) counted when the tool ends, inside the
  window [warm-up, warm-up + duration], per simulated minute.
- **KV hit rate**: Σ cached / Σ prompt tokens of the calls that completed in the window.
- **recompute tokens**: per call, ``max(0, min(H, prompt) − cached)`` where H is what the
  program had already had computed before this call (its previous prompt and answer, but the
  answer's last token, whose KV is never computed): prefill spent re-doing its own history.
- **node imbalance**: every ``sample_every_s``, max − min over nodes of HBM used / capacity
  (``device_used_tokens``, cached prefixes included); mean and max over the window's samples.
  ``kv_imbalance_mean`` (the same over SGLang's ``token_usage``: requests' KV without evictable
  cache) goes to the notes, since under overload the caches fill every node.
- **program completion**: first request to the end of the last tool, programs ending in the
  window; **step latency**: request submitted (held time included) to reply, calls ending in
  the window; **held wait** (thunder): submit to dispatch of requests that were held,
  dispatched in the window.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from thunder_sgl.benchmark.measures.derived import imbalance
from thunder_sgl.benchmark.measures.stats import percentile


@dataclass
class Recorder:
    warmup_s: float
    end_s: float
    calls: list[tuple[float, float, int, int, int, int]] = field(default_factory=list)
    """(end, start, prompt, cached, completion, recompute) of successful LLM calls."""
    tool_ends: list[float] = field(default_factory=list)
    programs: list[tuple[float, float, str]] = field(default_factory=list)
    """(start, end, outcome) of programs that ended."""
    held: list[tuple[float, float]] = field(default_factory=list)
    """(dispatch time, seconds held) of requests the router held."""
    memory: list[tuple[float, list[float]]] = field(default_factory=list)
    usage: list[tuple[float, list[float]]] = field(default_factory=list)
    """(time, per-node token_usage) samples."""
    errors: Counter[str] = field(default_factory=Counter)

    def window(self, t: float) -> bool:
        return self.warmup_s <= t <= self.end_s

    @property
    def duration(self) -> float:
        return self.end_s - self.warmup_s

    def steps_in_window(self) -> int:
        return sum(1 for t in self.tool_ends if self.window(t))

    def summary(self) -> dict[str, float | int]:
        win = self.window
        calls = [c for c in self.calls if win(c[0])]
        prompt = sum(c[2] for c in calls)
        cached = sum(c[3] for c in calls)
        steps = self.steps_in_window()
        done = [e - s for s, e, o in self.programs if o == "completed" and win(e)]
        lat = [e - s for e, s, *_ in calls]
        held = [h for t, h in self.held if win(t)]
        imb_mean, imb_max = imbalance([(t, v) for t, v in self.memory if win(t)])
        kv_imb_mean, _ = imbalance([(t, v) for t, v in self.usage if win(t)])
        return {
            "steps_completed": steps,
            "steps_per_min": 60.0 * steps / self.duration if self.duration > 0 else 0.0,
            "kv_hit_rate": cached / prompt if prompt else 0.0,
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "completion_tokens": sum(c[4] for c in calls),
            "recompute_tokens": sum(c[5] for c in calls),
            "node_imbalance_mean": imb_mean,
            "node_imbalance_max": imb_max,
            "kv_imbalance_mean": kv_imb_mean,
            "program_completion_p50_s": percentile(done, 50, empty=0.0),
            "program_completion_p99_s": percentile(done, 99, empty=0.0),
            "step_latency_p50_s": percentile(lat, 50, empty=0.0),
            "step_latency_p99_s": percentile(lat, 99, empty=0.0),
            "held_wait_p50_s": percentile(held, 50, empty=0.0),
            "held_wait_p99_s": percentile(held, 99, empty=0.0),
            "held_wait_max_s": max(held) if held else 0.0,
            "held_requests": len(held),
            "programs_completed": len(done),
            "programs_failed": sum(1 for _, e, o in self.programs if o == "failed" and win(e)),
        }
