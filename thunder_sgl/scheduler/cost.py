"""What one program costs a backend, in tokens: the definition of this arithmetic.

For a program p (design.md, "Scheduling model")::

    c_p       = max(context tokens, pending prompt tokens)    what it holds, or will once its
                                                              held or in-flight request runs
    s_p       = min(shared prefix tokens + group tokens, c_p) its part of a prefix shared with
                                                              other programs: the system prompt,
                                                              and for a group member the task
                                                              prompt its group shares (``groups``)
    private_p = c_p − s_p                                     its own KV
    hbm_p     = c_p + expected output                         the KV its request holds at the end
                                                              (the output EMA; before any, the default
                                                              at most the request's max_tokens)
    gated_p   = reasoning or held                             its KV counts in the HBM condition

Each shared prefix — a system prompt (``prefix_key``), a group's task prompt (``group_key``) —
is counted once per backend (``capacity.BackendLoad``), whatever number of programs use it. A program's weight in its backend's demand (1, or the decay ``x^(−k)`` of an
acting program after k whole ticks of tool time) is time-dependent and applied by the caller:
``weight(p, now, tick, table)``.

``cost_of(p, default_output)`` is the one place this arithmetic runs: it computes a program's
``ProgramCost`` when the program changed since the last call and returns the cached one
otherwise. The program clears its cache whenever one of the inputs above is written
(``Program.__setattr__``); the group's task prompt, learned later, and the default output are
checked on each call. Everything that sizes a program reads it: the per-tick accounting of
every active program (``capacity.BackendLoad.account``), the pause order, the queue, and the
controller's HBM gate of one request (``gate``). Only the decay weight depends on the clock
and is applied by the caller: ``weight(p, now, tick, table)`` (written out in ``account``, the
hot loop, and held equal to it by ``test_the_written_out_accounting_equals_the_cost_functions``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from thunder_sgl.backends.backend import ToolTimes
from thunder_sgl.config import SchedulerConfig
from thunder_sgl.programs import Phase, Program


class ProgramCost(NamedTuple):
    tokens: int
    """c: the larger of the known context and the pending prompt."""
    shared: int
    """s: the part of c that is the shared prefix (0 without a prefix key)."""
    prefix_key: str | None
    prefix_tokens: int
    """The whole shared prefix, as added to a backend by its first program of that key."""
    private: int
    """c − s."""
    hbm: float
    """c + expected output: what a request of the program holds in HBM when it finishes."""
    gated: bool
    """Reasoning or held: the program's KV counts in its backend's HBM condition."""
    group_key: str | None
    """Prefix key of its group's task prompt (None outside a group, or groups not counted)."""
    group_tokens: int
    """The group's task prompt beyond the system prompt, added to a backend by the group's
    first member there."""
    output: float
    """Expected output tokens per step (the program's EMA, or the scheduler's default)."""


def expected_output(p: Program, default_output: float) -> float:
    """The program's output EMA; before it has one, ``default_output`` bounded by its request's
    ``max_tokens`` (``Program.output_cap``): a burst of new programs asking 128 tokens each is
    not sized at the default 256. Once learned, the EMA alone (a bound is not an estimate)."""
    eo = p.expected_output_tokens
    if eo > 0:
        return eo
    cap = p.output_cap
    return cap if 0 < cap < default_output else default_output


_REASONING = Phase.REASONING
_new = tuple.__new__
_set = object.__setattr__


def program_cost(p: Program, default_output: float) -> ProgramCost:
    """The cost computed afresh (``cost_of`` caches it)."""
    c = p.context_tokens
    pp = p.pending_prompt_tokens
    if pp > c:
        c = pp
    key = p.prefix_key
    full = p.shared_prefix_tokens if key else 0
    gkey = p.group_key
    g = p.group
    gt = g.prefix_tokens if gkey and g is not None else 0
    s = full + gt
    if s > c:
        s = c
    eo = expected_output(p, default_output)
    # tuple.__new__: a named tuple built without its Python-level __new__.
    return _new(ProgramCost, (c, s, key, full, c - s, c + eo, p.phase is _REASONING or p.held > 0, gkey, gt, eo))


def cost_of(p: Program, default_output: float) -> ProgramCost:
    """The program's cost, computed again only when it changed: the cache is cleared by any
    write to an input (``Program.__setattr__``), and checked here against the two inputs that
    live outside the program (its group's task prompt, the default output)."""
    pc = p.cost_cache
    if pc is not None:
        g = p.group
        if (g is None or not pc[7] or pc[8] == g.prefix_tokens) and (
                p.expected_output_tokens > 0 or pc[9] == expected_output(p, default_output)):
            return pc  # type: ignore[no-any-return]
    pc = program_cost(p, default_output)
    # past Program.__setattr__: its hook clears this cache when a cost input is written, and
    # the cache is not one (a Python call saved per changed program per tick)
    _set(p, "cost_cache", pc)
    return pc


def hbm_with_prompt(p: Program, default_output: float, prompt: int) -> float:
    """What a request about to be sent holds in HBM when it finishes, ``prompt`` being its
    estimated prompt: the cost's ``hbm`` with the prompt in ``c``."""
    pc = cost_of(p, default_output)
    c = pc.tokens
    return (prompt if prompt > c else c) + pc.output


def in_flight_hbm(programs: Iterable[Program], default_output: float, exclude: Program | None = None) -> float:
    """The sum of ``hbm`` over the programs with a request in flight (the controller's HBM
    gate reads it for every request)."""
    total = 0.0
    for q in programs:
        if q.in_flight and q is not exclude:
            total += cost_of(q, default_output).hbm
    return total


def decay_weights(cfg: SchedulerConfig) -> list[float]:
    """f(k) = x^(−k) for k = 0..max_decay_ticks−1; f(k) = 0 beyond."""
    x = cfg.decay_base
    return [x ** (-k) for k in range(cfg.max_decay_ticks)]


RETURNS_MIN_SAMPLES = 20.0
"""Client silences (decayed count) a backend must have measured before ``returns_weights``
reads them; before that the paper's ``x^-k`` alone."""


def returns_weights(cfg: SchedulerConfig, paper: Sequence[float], returns: ToolTimes,
                    request_s: float) -> list[float]:
    """The decay table of one backend under ``decay: returns``: for k whole ticks of silence,

        w(k) = max(x^-k, 1 − S(k·Δt + H) / S(k·Δt))

    with S the survival of the backend's measured client silences (``Served.returns``: answer
    to next request) and H its request time (``Served.request_s``, dispatch to last byte): the
    probability that a program silent k ticks asks again before a program admitted into its
    room would have finished one step there. Where tools end within a tick (SWE agents: a
    median of 0.5 s) it is close to the paper's ``x^-k``; where they outlast the ticks and a
    step (ToolOrchestra: remote tools of 5–240 s beside 20-s steps) a silent program is still
    likely back soon, and admitting another into its room evicts KV it will need (there half
    the recomputed tokens were of programs never paused: the engine evicted their referenced
    KV for programs admitted into their decayed room). Never below ``x^-k``: it only ever keeps
    more room than the paper. Beyond the longest silence seen (S = 0), ``x^-k``. ``paper`` is
    the ``x^-k`` table; with fewer than ``RETURNS_MIN_SAMPLES`` silences, or no request time
    yet, it is returned as is."""
    if request_s <= 0 or sum(returns.weights) < RETURNS_MIN_SAMPLES:
        return list(paper)
    tick = cfg.tick_seconds
    out = []
    for k, pw in enumerate(paper):
        s0 = returns.survival(k * tick)
        w = 1.0 - returns.survival(k * tick + request_s) / s0 if s0 > 0 else 0.0
        out.append(w if w > pw else pw)
    return out


def weight(p: Program, now: float, tick: float, table: Sequence[float]) -> float:
    """Weight of an active program's KV in its backend's demand: 1 while reasoning or held,
    else the decay of the whole ticks it has spent acting."""
    if p.phase is _REASONING or p.held:
        return 1.0
    a = p.acting_since
    if now <= a:
        return 1.0
    k = int((now - a) // tick)
    return table[k] if k < len(table) else 0.0
