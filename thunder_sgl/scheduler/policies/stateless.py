"""The stateless fallback: where a request without a program id goes.

**Decides** one backend per request, with no memory between requests: the available backend
(``Backend.available``: healthy, fresh within ``stale_after`` and not draining) with the fewest requests in
flight from this router plus those its engine reports waiting, then the lowest KV usage, then
the lowest key (so ties resolve the same way every time); one whose engine is paused behind
the router (``backends.pause``) only when every available one is (the request then waits at
its door, as SGLang holds it). None when no backend is available.
Such requests are not tracked as programs.

**Parameters**: ``stale_after`` only (``monitor.stale_after_seconds``, read from the program
policy).
"""

from __future__ import annotations

from collections.abc import Sequence

from thunder_sgl.backends.backend import Backend


def least_loaded(backends: Sequence[Backend], now: float, stale_after: float) -> Backend | None:
    """The available backend, not paused if one is not, with the fewest requests in flight plus
    waiting, then the lowest KV usage; None when no backend is available."""
    best: Backend | None = None
    best_key: tuple[bool, int, float, str] | None = None
    for b in backends:
        if not b.available(now, stale_after):
            continue
        k = (b.engine_paused, b.inflight + b.live.waiting_reqs, b.live.token_usage, b.key)
        if best_key is None or k < best_key:
            best, best_key = b, k
    return best
