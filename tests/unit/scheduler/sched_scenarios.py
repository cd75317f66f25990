"""Scenario builders for scheduler tests: programs placed by hand, backends by capacity."""

from __future__ import annotations

from thunder_sgl.backends import Backend, Tiers
from thunder_sgl.programs import Phase, Program, ProgramTable, Usage


def backend(name: str, hbm: int, host: int = 0, storage: int = 0, inclusive: bool = True) -> Backend:
    return Backend(f"http://{name}", 0, Tiers(hbm_tokens=hbm, host_tokens=host, storage_tokens=storage, host_inclusive=inclusive))


def _create(table: ProgramTable, pid: str, now: float, group: tuple[str, int] | None) -> Program:
    """``group``: (group id, task prompt tokens); the member counts its group's prompt."""
    if group is None:
        return table.create(pid, now)
    p = table.create(pid, now, group[0], group[1])
    p.group_key = p.group.key  # type: ignore[union-attr]
    return p


def active(table: ProgramTable, pid: str, b: Backend, ctx: int, *, now: float = 0.0,
           acting_since: float | None = None, reasoning: bool = False, held: int = 0,
           prefix: tuple[str, int] | None = None, group: tuple[str, int] | None = None) -> Program:
    """An admitted, active program on ``b`` with context ``ctx`` (exact, as from usage)."""
    p = _create(table, pid, now, group)
    if prefix:
        p.prefix_key, p.shared_prefix_tokens = prefix
    table.admit(p, b.key, now)
    p.start_request(now, ctx)
    p.finish_request(now, Usage(ctx, 0), 0.3)
    p.acting_since = now if acting_since is None else acting_since
    if reasoning:
        p.start_request(now, ctx)
    if held:
        p.held = held
    return p


def paused(table: ProgramTable, pid: str, prev: Backend | None, ctx: int, *, since: float = 0.0,
           held: int = 0, prefix: tuple[str, int] | None = None, group: tuple[str, int] | None = None) -> Program:
    """An admitted program that was paused at ``since`` (last ran on ``prev``)."""
    p = _create(table, pid, since, group)
    if prefix:
        p.prefix_key, p.shared_prefix_tokens = prefix
    table.admit(p, prev.key if prev else "http://gone", since)
    p.start_request(since, ctx)
    p.finish_request(since, Usage(ctx, 0), 0.3)
    table.pause(p, since)
    if prev is None:
        p.prev_backend = None
    p.held = held
    return p


def new(table: ProgramTable, pid: str, prompt: int, *, since: float = 0.0,
        group: tuple[str, int] | None = None) -> Program:
    """A new program whose first request (``prompt`` tokens, estimated) is held."""
    p = _create(table, pid, since, group)
    p.hold(since, prompt)
    return p


def naive_demand(table: ProgramTable, b: Backend, now: float, tick: float, x: float, max_k: int) -> float:
    """Reference implementation of D_b, written independently of scheduler.capacity."""
    total, shared = 0.0, {}
    for p in table:
        if not p.active or p.backend != b.key:
            continue
        c = max(p.context_tokens, p.pending_prompt_tokens)
        if p.phase is Phase.REASONING or p.held:
            w = 1.0
        else:
            k = int((now - p.acting_since) // tick) if now > p.acting_since else 0
            w = x ** -k if k < max_k else 0.0
        system = p.shared_prefix_tokens if p.prefix_key else 0
        task = p.group.prefix_tokens if p.group_key and p.group else 0
        s = min(system + task, c)
        total += w * (c - s)
        if p.prefix_key:
            shared.setdefault(p.prefix_key, p.shared_prefix_tokens)
        if p.group_key:
            shared.setdefault(p.group_key, task)
    return total + sum(shared.values())


def place_all_within_bound(table: ProgramTable, pol, b: Backend, n: int, free_every: int, cfg,
                           before_tick=None) -> dict[str, int]:
    """Tick until all ``n`` waiting programs are placed while one running program ends every
    ``free_every`` ticks; fail if that takes longer than the bound aging and head-of-line
    reservation give. ``before_tick(now)`` runs before each tick. Returns the tick of each
    placement."""
    from thunder_sgl.scheduler import apply

    placed_at: dict[str, int] = {}
    now, tick = 0.0, 0
    max_ticks = int(cfg.reserve_after_seconds / cfg.tick_seconds) + free_every * n * 2 + 5
    while len(placed_at) < n:
        assert tick <= max_ticks, f"not all restored after {tick} ticks: {sorted(set(p.id for p in table) - set(placed_at))}"
        if before_tick is not None:
            before_tick(now)
        _, placed = apply(pol.tick(now, table, [b]), table, now)
        for p in placed:
            placed_at[p.id] = tick
            p.held = 0
            p.start_request(now, p.pending_prompt_tokens)  # running: weight 1 until it ends
        if tick % free_every == 0:
            running = [p for p in table if p.active]
            if running:
                table.remove(min(running, key=lambda p: p.id).id, now)
        now += cfg.tick_seconds
        tick += 1
    return placed_at
