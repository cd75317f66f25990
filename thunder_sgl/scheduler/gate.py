"""The HBM condition, in one place: the KV of a backend's running requests must fit in HBM.

Decode reads every running request's KV each step, so it must be in HBM; when it is not, the
engine retracts requests and recomputes them later. The condition (design.md)::

    used + need ≤ limit,   limit = hbm_lambda × HBM tokens,   need = c + expected output

``used`` is the KV the backend's reasoning programs hold or will hold (their ``cost.hbm``).
The same rule serves two callers, each with its own ``used``:

- the controller, for one request of an active program (``Controller.submit`` and the drain of
  held requests): ``used`` sums the programs with a request in flight, then each held request
  let through in age order (oldest first) adds its own need;
- the scheduler, for restoring a paused program that has a held request: ``used`` sums every
  program on the backend that is reasoning or holds a request (``BackendLoad.reasoning``), so
  the restored request counts as the last in line.

A backend with nothing reasoning always lets one request through (``used == 0``): otherwise a
request larger than the limit would wait forever. Only the tier-aware policy gates.
"""

from __future__ import annotations


def hbm_fits(used: float, need: float, limit: float) -> bool:
    """Whether a request needing ``need`` tokens may run beside ``used`` within ``limit``."""
    return used <= 0.0 or used + need <= limit


def hbm_room(used: float, limit: float) -> float:
    """The largest need ``hbm_fits`` accepts (infinite while nothing runs)."""
    return float("inf") if used <= 0.0 else limit - used
