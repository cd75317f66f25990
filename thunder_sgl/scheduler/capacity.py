"""Demand accounting per backend: decayed program weights, shared prefix counted once.

For backend b (design.md), with the per-program quantities of ``cost``::

    D_b = Σ_p w_p·private_p + Σ_{prefix keys present on b} prefix_tokens_key

where the prefix keys are the system prompts and the groups' task prompts (``groups``): a
group member carries both, so its group's task prompt is counted once per backend too.
    R_b = Σ_{p gated} hbm_p                    (the HBM condition's ``used``, see ``gate``)

``BackendLoad`` is a small mutable accumulator used inside one tick: programs are added,
removed (paused) and placed (restored) and the totals stay exact, including the shared
prefixes, each freed only when the last program of its key leaves the backend. Its limits
are the watermarks of the pool (``limit_hi``, ``limit_lo``) and of HBM (``hbm_limit``),
set by the tick from the policy and the backend's admission state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from thunder_sgl.backends.backend import Backend
from thunder_sgl.config import SchedulerConfig
from thunder_sgl.programs import Program
from thunder_sgl.scheduler.cost import ProgramCost, cost_of, weight
from thunder_sgl.scheduler.gate import hbm_fits, hbm_limit, hbm_room

_new = tuple.__new__


class PauseCandidate(NamedTuple):
    """A pausable program in pause order: a named tuple, so that sorting compares the keys in
    C (fields in sort order; the unique id means the program itself is never compared)."""

    held: bool
    """A held request: paused last."""
    weight: float
    """Its decayed weight (``cost.weight``): lowest first."""
    tokens: int
    """Its context c: shortest first."""
    id: str
    program: Program


@dataclass(slots=True, eq=False)
class Member:
    """A program as counted on one backend during a tick."""

    program: Program
    cost: ProgramCost
    weight: float
    private: float
    """Weighted private tokens: w·(c − s)."""

    @property
    def reasoning_tokens(self) -> float:
        return self.cost.hbm if self.cost.gated else 0.0


@dataclass(slots=True, eq=False)
class BackendLoad:
    backend: Backend
    pool: float
    limit_hi: float
    limit_lo: float
    hbm_limit: float
    extra: float = 0.0
    """Tokens the admission rule allows beyond the watermarks."""
    fit_limit: float = 0.0
    """``λ_max·pool``: what fits."""
    protect_limit: float = 0.0
    """``min(λ_max·pool, protect)``: programs beyond it in pause order run without a KV
    reference (overcommitted) when the backend is admitted beyond ``fit_limit``."""
    demand: float = 0.0
    reasoning: float = 0.0
    tokens: float = 0.0
    """Σ c of the accounted programs (their mean context is ``tokens / accounted``)."""
    private_tokens: float = 0.0
    """Σ (c − s) of the accounted programs, undecayed."""
    output: float = 0.0
    """Σ expected output per step of the accounted programs."""
    active: int = 0
    """Programs counted now (accounted + placed − removed in this tick)."""
    ended: float = 0.0
    """Of them, how many are expected to have ended: Σ ``Program.ended_p`` (admitted inferred
    programs whose clients have been silent for long)."""
    max_active: int | None = None
    """Most programs placements may bring the backend to (None: no bound). Set where the
    admission rule admits beyond the watermarks: its share of the programs there are
    (``ThunderScheduler._shares``; with one backend, all of them, so it never binds)."""
    request_level: bool = False
    """The admission rule serves an open stream of programs (``goodput``, request-level service):
    placements ignore the engine's own queue (``open_backends``), as request-level routing
    does, instead of holding new conversations at the router until it drains."""
    progs: list[Program] = field(default_factory=list)
    key_counts: dict[str, int] = field(default_factory=dict)
    key_shared: dict[str, int] = field(default_factory=dict)
    clock: tuple[float, float, Sequence[float], float] = (0.0, 1.0, (), 0.0)
    """(now, tick, decay table, default output) of the last ``account``: what ``members``
    needs to give each program the cost and weight the totals were made of."""

    @classmethod
    def for_backend(cls, b: Backend, cfg: SchedulerConfig, extra: float = 0.0,
                    protect: float = float("inf"), hbm_extra: float = 0.0) -> BackendLoad:
        """The backend's load with the policy's watermarks; ``extra``: tokens the admission
        rule allows beyond both, ``protect``: tokens it keeps referenced (``goodput``),
        ``hbm_extra``: tokens by which it raises the HBM condition."""
        pool = b.tiers.pool(cfg.tier_aware, cfg.host_weight, cfg.storage_weight)
        load = cls(backend=b, pool=pool, limit_hi=0.0, limit_lo=0.0, hbm_limit=0.0)
        load.set_extra(cfg, extra, protect, hbm_extra)
        return load

    def set_extra(self, cfg: SchedulerConfig, extra: float, protect: float = float("inf"),
                  hbm_extra: float = 0.0) -> None:
        """Watermarks ``λ·pool + extra``; ``fit_limit`` stays ``λ_max·pool`` (what fits); the
        HBM condition's limit ``hbm_lambda·HBM + hbm_extra``."""
        self.extra = extra
        self.hbm_limit = hbm_limit(cfg, self.backend, hbm_extra)
        self.fit_limit = cfg.lambda_max * self.pool
        self.protect_limit = min(self.fit_limit, protect)
        self.limit_hi = self.fit_limit + extra
        self.limit_lo = cfg.lambda_min * self.pool + extra

    def account(self, progs: list[Program], now: float, tick: float, table: Sequence[float], default_out: float) -> None:
        """Add the backend's active programs to the totals: the hot loop of every tick.

        Each program's cost is its cached one (``cost.cost_of``, computed again only when it
        changed); the decay ``cost.weight`` is written out here (a call per program per tick
        was most of a tick at 10,000 programs), and ``members`` builds the objects for the few
        backends that must pause: a test checks that both give the same totals."""
        demand = reasoning = tokens = private_total = output = ended = 0.0
        counts, shared = self.key_counts, self.key_shared
        ntab = len(table)
        for p in progs:
            ended += p.ended_p
            pc = p.cost_cache
            if pc is None or pc[7] or (pc[9] != default_out and p.expected_output_tokens <= 0):  # type: ignore[index]
                pc = cost_of(p, default_out)
            c, _, key, full, private, hbm, gated, gkey, gt, eo = pc  # type: ignore[misc]
            private_total += private
            output += eo
            if gated:  # reasoning or held: full weight, counts in the HBM condition
                reasoning += hbm
                demand += private
            else:
                a = p.acting_since
                if now <= a:
                    demand += private
                else:
                    k = int((now - a) // tick)
                    if k < ntab:
                        demand += table[k] * private
            tokens += c
            if key:
                cnt = counts.get(key)
                if cnt is None:
                    counts[key] = 1
                    shared[key] = full
                    demand += full
                else:
                    counts[key] = cnt + 1
            if gkey:
                cnt = counts.get(gkey)
                if cnt is None:
                    counts[gkey] = 1
                    shared[gkey] = gt
                    demand += gt
                else:
                    counts[gkey] = cnt + 1
        self.progs.extend(progs)
        self.clock = (now, tick, table, default_out)
        self.demand += demand
        self.reasoning += reasoning
        self.tokens += tokens
        self.private_tokens += private_total
        self.output += output
        self.active += len(progs)
        self.ended += ended

    def pause_candidates(self) -> list[PauseCandidate]:
        """The pausable programs (no request in flight) in pause order — acting first (held
        last), lowest decayed weight, then shortest context: no Member is built for the many
        a pause does not reach (``member`` builds one for those it does)."""
        now, tick, table, default_out = self.clock
        out = [_new(PauseCandidate, (p.held > 0, weight(p, now, tick, table), cost_of(p, default_out).tokens, p.id, p))
               for p in self.progs if not p.in_flight]
        out.sort()  # by (held, weight, tokens, id): ids are unique, the program is never compared
        return out

    def member(self, p: Program) -> Member:
        """One accounted program as a Member (its cost and weight as ``account`` counted them)."""
        now, tick, table, default_out = self.clock
        pc = cost_of(p, default_out)
        w = 1.0 if pc.gated else weight(p, now, tick, table)
        return Member(p, pc, w, w * pc.private)

    def members(self, idle_only: bool = False) -> list[Member]:
        """The accounted programs as Members (built only for backends that must pause);
        ``idle_only``: just those with no request in flight (the pausable ones)."""
        return [self.member(p) for p in self.progs if not (idle_only and p.in_flight)]

    @staticmethod
    def placed(p: Program, pc: ProgramCost) -> Member:
        """A program being placed this tick: full weight (it is about to run)."""
        return Member(p, pc, 1.0, float(pc.private))

    def add(self, m: Member) -> None:
        self.active += 1
        self.ended += m.program.ended_p
        self.demand += m.private + self.shared_added(m.cost)
        self.reasoning += m.reasoning_tokens
        pc = m.cost
        for key, tokens in ((pc.prefix_key, pc.prefix_tokens), (pc.group_key, pc.group_tokens)):
            if key:
                n = self.key_counts.get(key, 0)
                if not n:
                    self.key_shared[key] = tokens
                self.key_counts[key] = n + 1

    def remove(self, m: Member) -> None:
        """Take ``m`` out of the totals (it stays in ``members``; callers track the pause set)."""
        self.active -= 1
        self.ended -= m.program.ended_p
        self.demand -= m.private + self.shared_freed(m.cost)
        self.reasoning -= m.reasoning_tokens
        for key in (m.cost.prefix_key, m.cost.group_key):
            if key:
                n = self.key_counts[key] - 1
                if n:
                    self.key_counts[key] = n
                else:
                    del self.key_counts[key]
                    del self.key_shared[key]

    def shared_added(self, pc: ProgramCost) -> int:
        """Shared-prefix tokens a new program of ``pc`` adds: each of its prefixes (system
        prompt, group task prompt) not yet present here."""
        counts = self.key_counts
        k, g = pc.prefix_key, pc.group_key
        return ((pc.prefix_tokens if k and k not in counts else 0)
                + (pc.group_tokens if g and g not in counts else 0))

    def shared_freed(self, pc: ProgramCost) -> int:
        """Shared-prefix tokens freed if one program of ``pc`` leaves (a prefix is freed only
        by the last program of its key)."""
        counts, out = self.key_counts, 0
        for key in (pc.prefix_key, pc.group_key):
            if key and counts.get(key) == 1:
                out += self.key_shared[key]
        return out

    def freed_by(self, m: Member) -> float:
        return m.private + self.shared_freed(m.cost)

    def adds(self, pc: ProgramCost) -> float:
        """Demand a placed program adds here: its private part, plus its prefixes if new here."""
        return pc.private + self.shared_added(pc)

    def holds(self, key: str) -> int:
        """Programs counted here that carry prefix ``key``."""
        return self.key_counts.get(key, 0)

    # ---- room ----------------------------------------------------------------------------
    def accepting(self) -> bool:
        """Below the low watermark and its share (or empty): the backend takes restores this tick."""
        return self.active == 0 or (self.demand < self.limit_lo and not self.full())

    def room(self) -> float | None:
        """Free pool under the high watermark (infinite when empty); None when not accepting."""
        if self.active == 0:
            return float("inf")
        if self.demand >= self.limit_lo or self.full():
            return None
        return self.limit_hi - self.demand

    def full(self) -> bool:
        """At its share of the programs (``max_active``): it takes no more this tick."""
        return self.max_active is not None and self.active >= self.max_active

    def hbm_room(self) -> float:
        """The largest HBM need the gate accepts here (infinite when empty or nothing reasons)."""
        return float("inf") if self.active == 0 else hbm_room(self.reasoning, self.hbm_limit)

    def fits(self, pc: ProgramCost, gate_hbm: bool) -> bool:
        """Whether placing the program keeps the backend within its limits: the pool's high
        watermark, and (tier-aware, a held request) the HBM condition. An empty backend
        accepts any program (otherwise an oversized one would wait forever)."""
        if self.active == 0:
            return True
        if self.demand >= self.limit_lo or self.full() or self.demand + self.adds(pc) > self.limit_hi:
            return False
        if gate_hbm and pc.gated and not hbm_fits(self.reasoning, pc.hbm, self.hbm_limit):
            return False
        return True
