"""Engines that dropped their cached KV behind the router with no version to say so.

A framework that calls an engine's ``/flush_cache`` directly, or reloads its weights
(``/update_weights_from_disk``, ``/update_weights_from_tensor``, ...) without a new
``weight_version``, leaves thunder counting KV that is gone: programs it believes resident
there are full prefills, and its admission works from a pool that is fuller on paper than in
the engine. A new weight version is read (``Controller.weight_version_seen``); this module
reads the other case from the answers themselves.

The rule rests on one fact of SGLang: the cache is dropped only while the engine is fully idle
(``Scheduler.flush_cache`` refuses while requests are queued or running; a weight update drains
the engine first, then flushes). Whatever else reaches the engine, the router's own requests
there are then none. So a step of program ``p`` on backend ``b`` is *evidence* of a drop when

1. ``p``'s previous step ran on ``b`` and ``p`` stayed placed there since (no pause, no reset,
   no failover: ``Program.last_step_backend``), counted within what fits (not overcommitted):
   thunder believes its KV is there;
2. the router saw ``b`` with nothing in flight at some moment between that step's end and this
   request's dispatch (``Backend.idle_at``): a drop could have happened;
3. its previous prompt was at least ``min_prompt_tokens`` long, and the engine reports fewer
   than ``fraction`` of those tokens cached now. (The previous prompt, not the previous
   context: an answer sent back as text need not re-tokenize to the same ids, so the hit can
   end where the answer starts.)

A step that meets 1–2 and whose prefix *was* cached is a hit: the engine kept its KV, and the
evidence gathered on ``b`` is dropped. Eviction under memory pressure also takes a program's
KV, so evidence has to tell the two apart:

- the first piece must be *strong*: the step found less than ``fraction`` of its shared prefix
  (the system prompt its program shares with others, ``Program.shared_prefix_tokens``)
  cached, or nothing at all when it shares none. Eviction takes the least recently used KV
  first, the tails of programs that wait on their tools; the prefix every request reuses is
  the last thing it takes. A drop takes everything: the first program back finds nothing;
- the next ones only need to have lost most of their own prefix (the programs after the
  first find the shared prefix again, prefilled anew by the first);
- ``confirm`` pieces from distinct programs, no hit between, confirm the drop. The controller
  resets the KV accounting of every rank of that worker (``Controller.reset_kv``), as for a new
  weight version, and counts it (``thunder_kv_drops_seen_total``).

The rule would rather miss a drop than invent one: it misses where these do not hold (the
first program back was paused meanwhile, the engine was never idle at the router); the
monitor's weight version stays the signal for reloads that name one. ``confirm`` 0 turns the
rule off.

Pure bookkeeping: the controller feeds it each finished step (``step``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["KVDropWatch"]


@dataclass(slots=True)
class KVDropWatch:
    confirm: int = 2
    """Evidence from this many distinct programs, no hit between, confirms a drop (0: off)."""
    fraction: float = 0.5
    """A step is evidence when fewer than this share of its previous prompt is cached (the
    first one: of its shared prefix)."""
    min_prompt_tokens: int = 64
    """Shorter previous prompts are no evidence either way."""
    _evidence: dict[str, set[str]] = field(default_factory=dict)

    def step(self, backend: str, program: str, eligible: bool, previous_prompt: int, cached: int,
             shared_prefix: int = 0) -> bool:
        """A step of ``program`` on ``backend`` finished, ``cached`` of its prompt tokens cached;
        ``eligible`` when conditions 1–2 hold; ``shared_prefix``: the tokens it shares with
        other programs (0: none known). True when this step confirms a drop (the evidence on
        ``backend`` is then cleared)."""
        if not self.confirm or not eligible or previous_prompt < self.min_prompt_tokens:
            return False
        if cached >= self.fraction * previous_prompt:
            self._evidence.pop(backend, None)  # the engine kept this program's KV
            return False
        seen = self._evidence.get(backend)
        if seen is None:
            strong = (cached < self.fraction * shared_prefix if shared_prefix >= self.min_prompt_tokens
                      else cached == 0)
            if not strong:
                return False  # its tail evicted, the shared prefix kept: what eviction does
            seen = self._evidence[backend] = set()
        seen.add(program)
        if len(seen) < self.confirm:
            return False
        del self._evidence[backend]
        return True

    def forget(self, backends: set[str] | None = None) -> None:
        """The accounting of ``backends`` (None: all) was reset: evidence from before is void."""
        if backends is None:
            self._evidence.clear()
        else:
            for k in backends:
                self._evidence.pop(k, None)

    def evidence(self, backend: str) -> int:
        """Programs counted as evidence on ``backend`` since its last hit (for views and tests)."""
        return len(self._evidence.get(backend, ()))
