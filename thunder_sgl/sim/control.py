"""Engine control of a simulated worker, as SGLang 0.5.23 does it for RL weight updates.

- ``pause(worker, mode, now)``, SGLang's ``/pause_generation`` modes:
  ``abort`` aborts every request (each answered with finish reason ``abort``, usage of what
  was generated); ``in_place`` stops the engines where they are, requests and KV kept, and
  generation resumes from there; ``retract`` stops them and sends every running request back
  to the waiting queue, its KV released (its prefix stays cached until a flush), to be
  prefilled again after ``continue``. In every mode new requests wait at the front end
  (``SimServer``) until generation continues, as SGLang's tokenizer manager holds them.
- ``update_weights(worker, version, flush)``: a new weight version and, by default, a cache
  flush — refused, as on SGLang, while requests are running (an ``in_place`` pause): the
  weights change but the stale KV stays.
- ``release`` / ``resume``: memory occupation by tag (``weights``, ``kv_cache``,
  ``cuda_graph``); releasing ``kv_cache`` drops the cache. Where SGLang asserts (release of a
  busy engine, resume of a tag never released — both crash a real server), the simulator
  refuses with an error instead.
"""

from __future__ import annotations

from thunder_sgl.sim.batching import release as release_kv
from thunder_sgl.sim.engine import Engine
from thunder_sgl.sim.worker import SimWorker

PAUSE_MODES = ("abort", "in_place", "retract")
MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")


def pause(w: SimWorker, mode: str, now: float) -> None:
    if mode not in PAUSE_MODES:
        raise ValueError(mode)
    w.paused = mode
    for e in w.engines:
        if mode == "abort":
            for rid in list(e.reqs):
                e.abort(rid, now)
        else:
            _pause_engine(e, mode, now)


def resume_generation(w: SimWorker, now: float) -> None:
    """``/continue_generation``: engines run again from where they stopped."""
    w.paused = None
    for e in w.engines:
        if e.paused is not None:
            e.paused = None
            e._wake(now)


def _pause_engine(e: Engine, mode: str, now: float) -> None:
    e._step_to(now, e._buffered)  # what finished by now is handed out by the next advance
    e.paused = mode
    if mode == "in_place":
        e._truncate(now)  # the step in progress ends; nothing starts after it
        return
    # retract: the step in progress is dropped (its requests are prefilled again later) —
    # those it was prefilling too: they are in neither the running list nor the queue
    p = e._plan
    prefilling: list = []
    if p is not None:
        for r in p.decode:
            r.in_plan = False
        prefilling = [r for r, _ in p.prefill if r is not e.chunked]
        e._plan = None
    e._t = max(e._t, now)
    back = list(e.running) + prefilling + ([e.chunked] if e.chunked is not None else [])
    for r in back:
        release_kv(e, r)
    e.running = []
    e.chunked = None
    e.waiting.extendleft(reversed(back))


def has_requests(w: SimWorker) -> bool:
    return any(e.reqs for e in w.engines)


def update_weights(w: SimWorker, version: str | None, flush: bool) -> tuple[bool, str]:
    """New weights are in place; returns (success, message) as SGLang's scheduler does."""
    w.weight_updates += 1
    if version is not None:
        w.weight_version = version
    msg = "Succeeded to update model weights."
    if flush and not w.flush_cache():
        return False, ("Weights were updated, but the cache was not flushed because requests are still "
                       "running or queued. Retract or finish them, then call /flush_cache.")
    if version is not None:
        msg += f" Weight version updated to {version}."
    return True, msg


def release(w: SimWorker, tags: list[str] | None) -> str | None:
    """Release memory occupation; returns an error message instead of crashing like SGLang."""
    busy = any(e.running or e.chunked is not None or (e.waiting and e.paused is None) for e in w.engines)
    if busy:
        return "release_memory_occupation should be called only when server is idle."
    chosen = set(tags or MEMORY_TAGS)
    if "kv_cache" in chosen:
        for e in w.engines:
            if e.can_flush():
                e.cache.flush()
    w.released |= chosen
    return None


def resume(w: SimWorker, tags: list[str] | None) -> str | None:
    chosen = set(tags or MEMORY_TAGS)
    missing = sorted(chosen - w.released)
    if missing:
        return f"cannot resume {missing}: not released"
    w.released -= chosen
    return None
