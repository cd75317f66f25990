"""Demand accounting per backend: decayed program weights, shared prefix counted once.

For backend b (design.md):

    D_b = Σ_p w_p·(c_p − s_p) + Σ_{prefix keys present on b} s_key
    w_p = 1 for reasoning programs (or programs whose request is held), x^(−k) for acting ones,
          k = whole ticks spent acting, w = 0 past ``max_decay_ticks``
    R_b = Σ_{reasoning} (c_p + expected output)           (the HBM condition's left side)

``BackendLoad`` is a small mutable accumulator used inside one tick: programs are added,
removed (paused) and placed (restored) and the totals stay exact, including the shared
prefix, which is freed only when the last program of its key leaves the backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from thunder_sgl.backends.backend import Backend
from thunder_sgl.config import SchedulerConfig
from thunder_sgl.programs import Phase, Program


def decay_weights(cfg: SchedulerConfig) -> list[float]:
    """f(k) = x^(−k) for k = 0..max_decay_ticks−1; f(k) = 0 beyond."""
    x = cfg.decay_base
    return [x ** (-k) for k in range(cfg.max_decay_ticks)]


def program_weight(p: Program, now: float, tick: float, table: list[float]) -> float:
    """Weight of an active program's KV in its backend's demand."""
    if p.phase is Phase.REASONING or p.held:
        return 1.0
    k = int((now - p.acting_since) // tick) if now > p.acting_since else 0
    return table[k] if k < len(table) else 0.0


def expected_output(p: Program, cfg: SchedulerConfig) -> float:
    return p.expected_output_tokens if p.expected_output_tokens > 0 else float(cfg.default_output_tokens)


@dataclass(slots=True, eq=False)
class Member:
    """A program as counted on one backend during a tick."""

    program: Program
    weight: float
    private: float
    """Weighted private tokens: w·(c − s)."""
    shared: int
    key: str | None
    reasoning_tokens: float
    """c + expected output when reasoning or held, else 0."""


@dataclass(slots=True, eq=False)
class BackendLoad:
    backend: Backend
    pool: float
    limit_hi: float
    limit_lo: float
    hbm_limit: float
    demand: float = 0.0
    reasoning: float = 0.0
    active: int = 0
    """Programs counted now (accounted + placed − removed in this tick)."""
    progs: list[Program] = field(default_factory=list)
    _clock: tuple[float, float, list[float]] = (0.0, 1.0, [])
    key_counts: dict[str, int] = field(default_factory=dict)
    key_shared: dict[str, int] = field(default_factory=dict)

    @classmethod
    def for_backend(cls, b: Backend, cfg: SchedulerConfig) -> BackendLoad:
        pool = b.tiers.pool(cfg.tier_aware, cfg.host_weight, cfg.storage_weight)
        return cls(
            backend=b,
            pool=pool,
            limit_hi=cfg.lambda_max * pool,
            limit_lo=cfg.lambda_min * pool,
            hbm_limit=cfg.hbm_lambda * b.tiers.hbm_tokens,
        )

    def member(self, p: Program, weight: float, cfg: SchedulerConfig) -> Member:
        c = p.demand_tokens()
        key = p.prefix_key
        s = min(p.shared_prefix_tokens, c) if key else 0
        reasoning = c + expected_output(p, cfg) if (p.phase is Phase.REASONING or p.held) else 0.0
        return Member(p, weight, weight * (c - s), p.shared_prefix_tokens if key else 0, key, reasoning)

    def account(self, progs: list[Program], now: float, tick: float, table: list[float], default_out: float) -> None:
        """Add the backend's active programs to the totals: the hot loop of every tick, kept
        flat (the same arithmetic as ``member`` + ``add``, without building objects)."""
        n = len(table)
        demand = reasoning = 0.0
        counts, shared = self.key_counts, self.key_shared
        REASONING = Phase.REASONING
        for p in progs:
            c = p.context_tokens
            pp = p.pending_prompt_tokens
            if pp > c:
                c = pp
            if p.phase is REASONING or p.held:
                w = 1.0
                eo = p.expected_output_tokens
                reasoning += c + (eo if eo > 0 else default_out)
            else:
                a = p.acting_since
                if now > a:
                    k = int((now - a) // tick)
                    w = table[k] if k < n else 0.0
                else:
                    w = 1.0
            key = p.prefix_key
            if key:
                sp = p.shared_prefix_tokens
                demand += w * (c - (sp if sp < c else c))
                cnt = counts.get(key)
                if cnt is None:
                    counts[key] = 1
                    shared[key] = sp
                    demand += sp
                else:
                    counts[key] = cnt + 1
            else:
                demand += w * c
        self.progs.extend(progs)
        self._clock = (now, tick, table)
        self.demand += demand
        self.reasoning += reasoning
        self.active += len(progs)

    def members(self, cfg: SchedulerConfig, idle_only: bool = False) -> list[Member]:
        """The accounted programs as Members (built only for backends that must pause);
        ``idle_only``: just those with no request in flight (the pausable ones)."""
        now, tick, table = self._clock
        return [self.member(p, program_weight(p, now, tick, table), cfg)
                for p in self.progs if not (idle_only and p.in_flight)]

    def add(self, m: Member) -> None:
        self.active += 1
        self.demand += m.private + self.shared_added(m.key, m.shared)
        self.reasoning += m.reasoning_tokens
        if m.key:
            if m.key not in self.key_counts:
                self.key_shared[m.key] = m.shared
            self.key_counts[m.key] = self.key_counts.get(m.key, 0) + 1

    def remove(self, m: Member) -> None:
        """Take ``m`` out of the totals (it stays in ``members``; callers track the pause set)."""
        self.active -= 1
        self.demand -= m.private + self.shared_freed(m.key)
        self.reasoning -= m.reasoning_tokens
        if m.key:
            n = self.key_counts[m.key] - 1
            if n:
                self.key_counts[m.key] = n
            else:
                del self.key_counts[m.key]
                del self.key_shared[m.key]

    def shared_added(self, key: str | None, shared: int) -> int:
        """Shared-prefix tokens a new member of ``key`` adds (0 if the key is present)."""
        return shared if key and key not in self.key_counts else 0

    def shared_freed(self, key: str | None) -> int:
        """Shared-prefix tokens freed if one member of ``key`` leaves (only the last one frees)."""
        if key and self.key_counts.get(key) == 1:
            return self.key_shared[key]
        return 0

    def freed_by(self, m: Member) -> float:
        return m.private + self.shared_freed(m.key)

    def fits(self, add: float, reasoning_add: float, gate_hbm: bool) -> bool:
        """Whether placing a program that adds ``add`` keeps the backend within its limits.
        An empty backend accepts any program (otherwise an oversized one would wait forever)."""
        if self.active == 0:
            return True
        if self.demand >= self.limit_lo or self.demand + add > self.limit_hi:
            return False
        if gate_hbm and reasoning_add > 0 and self.reasoning + reasoning_add > self.hbm_limit:
            return False
        return True
