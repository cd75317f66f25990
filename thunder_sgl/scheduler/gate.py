"""The HBM condition, in one place: the KV of a backend's running requests must fit in HBM.

Decode reads every running request's KV each step, so it must be in HBM; when it is not, the
engine retracts requests and recomputes them later. The condition (design.md)::

    used + need ≤ limit,   limit = hbm_lambda × HBM tokens + hbm_extra,   need = c + expected output

``hbm_extra`` is the admission rule's (``Backend.admission``): 0 at the watermarks and for the
``occupancy`` and ``fixed`` rules; under ``goodput`` the level's extra tokens, so that programs
admitted beyond the pool — chosen because recomputing them is cheaper than leaving the batch
idle — send their requests to the engine, whose own scheduler queues what its KV cannot hold,
instead of waiting at the router until a tick lets them go (DES, cell ctx05-tool8-out128-x6,
3 seeds of 1,200 s: 190 steps/min with the condition at ``hbm_lambda·HBM``, 193 with it raised,
198 for request-level routing).

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

**A long waiter reserves.** Held requests go oldest first as room frees (``drain``), but a new
request that fits goes at once, past the held ones (first fit: a large held request does not
leave the batch under-filled). Once a held request of the backend has waited
``reserve_after_seconds`` (the queue's reservation age), a new one waits behind it even when it
would fit (``RequestGate.admits``, ``queued``): letting small new requests past a large held one
starves it for as long as the programs that cycle keep the room taken (real CPU engine with the
file storage tier, cpu-agent N = 32: programs held 120–300 s while the rest cycled in 7 s, step
p99 252 s). Strict first come, first served from the first second cost 3–6% in the DES cells
with 128-token outputs, where a held large request leaves the decode batch short.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from thunder_sgl.backends.backend import Backend
from thunder_sgl.config import SchedulerConfig
from thunder_sgl.programs import Program
from thunder_sgl.scheduler.cost import hbm_with_prompt, in_flight_hbm


def hbm_fits(used: float, need: float, limit: float) -> bool:
    """Whether a request needing ``need`` tokens may run beside ``used`` within ``limit``."""
    return used <= 0.0 or used + need <= limit


def hbm_limit(cfg: SchedulerConfig, b: Backend, extra: float) -> float:
    """``hbm_lambda × HBM tokens``, raised by what the admission rule says (``hbm_extra``)."""
    return cfg.hbm_lambda * b.tiers.hbm_tokens + extra


def hbm_room(used: float, limit: float) -> float:
    """The largest need ``hbm_fits`` accepts (infinite while nothing runs)."""
    return float("inf") if used <= 0.0 else limit - used


@dataclass(frozen=True)
class RequestGate:
    """The HBM condition for one request of an active program: the scheduler's answer to the
    controller (``Controller.submit`` and the drains of held requests). Only the tier-aware
    policy gates; ``placed`` are the programs placed on the request's backend."""

    cfg: SchedulerConfig

    def limit(self, b: Backend) -> float:
        if not self.cfg.tier_aware:
            return float("inf")
        return hbm_limit(self.cfg, b, b.admission.hbm_extra if b.admission is not None else 0.0)

    def need(self, p: Program, estimate: int) -> float:
        """What p's request holds in HBM when it finishes (``cost.hbm`` with the estimate)."""
        return hbm_with_prompt(p, float(self.cfg.default_output_tokens), estimate)

    def used(self, placed: Iterable[Program], exclude: Program | None = None) -> float:
        """KV the programs with a request in flight hold or will hold."""
        return in_flight_hbm(placed, float(self.cfg.default_output_tokens), exclude)

    def admits(self, p: Program, estimate: int, b: Backend | None, placed: Iterable[Program],
               queued: bool = False) -> bool:
        """Whether p's request of ``estimate`` prompt tokens may go to ``b`` now; ``queued``: a
        request of ``b`` held past the reservation age waits at the condition, so this one
        waits behind it."""
        if not self.cfg.tier_aware:
            return True
        if b is None or queued:
            return False
        return hbm_fits(self.used(placed, exclude=p), self.need(p, estimate), self.limit(b))

    def drain(self, b: Backend, held: list[tuple[Program, int, float]], placed: Iterable[Program]) -> list[Program]:
        """Of the held requests of active programs on ``b`` — (program, prompt estimate, time
        held) — those that go now: oldest first, while the condition lets them (the oldest
        waits first: the walk stops at the first that does not fit)."""
        used = self.used(placed)
        limit = self.limit(b)
        out = []
        for p, est, _ in sorted(held, key=lambda h: h[2]):
            need = self.need(p, est)
            if not hbm_fits(used, need, limit):
                break
            out.append(p)
            used += need
        return out
