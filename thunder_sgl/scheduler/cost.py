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
    gated_p   = reasoning or held                             its KV counts in the HBM condition

Each shared prefix — a system prompt (``prefix_key``), a group's task prompt (``group_key``) —
is counted once per backend (``capacity.BackendLoad``), whatever number of programs use it. A program's weight in its backend's demand (1, or the decay ``x^(−k)`` of an
acting program after k whole ticks of tool time) is time-dependent and applied by the caller:
``weight(p, now, tick, table)``.

``program_cost`` is what the queue, the pause decisions and the controller's HBM gate of one
request read. The per-tick accounting of every active program (``capacity.BackendLoad.account``,
the hot loop) writes ``program_cost`` and ``weight`` out instead of calling them — an object per
program per tick doubled the tick at 10,000 programs — and a property test
(``test_the_written_out_accounting_equals_the_cost_functions``) holds the two equal: change
both together.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

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


def expected_output(p: Program, default_output: float) -> float:
    return p.expected_output_tokens if p.expected_output_tokens > 0 else default_output


_REASONING = Phase.REASONING
_new = tuple.__new__


def program_cost(p: Program, default_output: float, prompt: int = 0) -> ProgramCost:
    """``prompt``: the estimate of a request about to be sent (the controller's HBM gate)."""
    c = p.context_tokens
    pp = p.pending_prompt_tokens
    if pp > c:
        c = pp
    if prompt > c:
        c = prompt
    key = p.prefix_key
    full = p.shared_prefix_tokens if key else 0
    gkey = p.group_key
    gt = p.group.prefix_tokens if gkey and p.group is not None else 0  # type: ignore[union-attr]
    s = full + gt
    if s > c:
        s = c
    eo = p.expected_output_tokens
    # tuple.__new__: a named tuple built without its Python-level __new__ (this runs for every
    # program every tick).
    return _new(ProgramCost, (c, s, key, full, c - s, c + (eo if eo > 0 else default_output),
                              p.phase is _REASONING or p.held > 0, gkey, gt))


def in_flight_hbm(programs: Iterable[Program], default_output: float, exclude: Program | None = None) -> float:
    """The sum of ``program_cost(q).hbm`` over the programs with a request in flight (the
    controller's HBM gate reads it for every request), written out like the tick's accounting
    and held equal to it by the same property test."""
    total = 0.0
    for q in programs:
        if q.in_flight and q is not exclude:
            c = q.context_tokens
            pp = q.pending_prompt_tokens
            eo = q.expected_output_tokens
            total += (c if c >= pp else pp) + (eo if eo > 0 else default_output)
    return total


def decay_weights(cfg: SchedulerConfig) -> list[float]:
    """f(k) = x^(−k) for k = 0..max_decay_ticks−1; f(k) = 0 beyond."""
    x = cfg.decay_base
    return [x ** (-k) for k in range(cfg.max_decay_ticks)]


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
