"""The request path of the thunder policy, without I/O: programs, backends, policy, tickets.

The gateway (asyncio, HTTP) and the discrete-event benchmark (virtual time) drive the same
``Controller``, so the benchmark measures the policy the product runs. A request is a
``Ticket``; ``submit`` either dispatches it now (returns the backend) or holds it. Held tickets
come back, dispatched, from later calls (``finish``, ``tick``) — the caller then sends them.

Rules (design.md, "Program model" and "Scheduling model"):
- A request without a program id is stateless: least-loaded backend, never held, never tracked.
- The first request of an unknown program creates it, new and queued: the next tick (an
  event-driven one, soon) admits it where it fits.
- A request of an active program is dispatched unless, in tier-aware mode, the KV of the
  backend's reasoning programs plus this one would not fit in HBM (the HBM condition): then
  it is held until a running request on that backend finishes, instead of letting the engine
  retract.
- A request of a paused program is held until the program is restored (on any backend).
- One request per program at a time: a second concurrent request is refused (409), the
  state of the first is untouched.
- Completion updates tokens from usage; every end of a request (success, error, abort)
  returns the program to ACTING — errors never leave it REASONING.
- Held requests have a timeout; programs idle longer than the idle timeout are released.
- While a weight-update window is open (``windows``), every new request — stateless ones
  too — and every restore is held, never failed; time inside windows does not count towards
  the held timeout. When the engines drop their cached KV (``reset_kv``), the programs there
  go back to the global queue, so the scheduler refills the cluster in aging order.
- While a backend's engine is paused behind the router (``Backend.engine_paused``, the rule in
  ``backends.pause``), requests of its programs are held and its programs stay; the time it
  is paused does not count towards their held timeout; ``engine_resumed`` lets them go.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable

from thunder_sgl.backends.backend import Backend
from thunder_sgl.config import RouterConfig, SchedulerConfig
from thunder_sgl.control.conversations import CONTEXT_OVERFLOW
from thunder_sgl.control.kvdrop import KVDropWatch
from thunder_sgl.control.kvrefs import KVRefs
from thunder_sgl.control.tickets import Stats, Ticket, TickResult
from thunder_sgl.control.windows import Reason, Windows
from thunder_sgl.errors import BadRequest, Conflict, NoBackend, NotFound, Overloaded
from thunder_sgl.programs import GroupTable, Program, ProgramState, ProgramTable, Usage
from thunder_sgl.programs.lengths import ProgramLengths
from thunder_sgl.scheduler import Decisions, apply, least_loaded, make_policy
from thunder_sgl.smoothing import ema

__all__ = ["Controller"]


log = logging.getLogger("thunder_sgl.admission")


def _log_level(key: str, level: object) -> None:
    """A backend's admission level changed (``scheduler.goodput``): one line, for operators."""
    v = level.view() if hasattr(level, "view") else {}
    log.info("admission %s: level %s (model %s, bias %s, probe %s), %.1f programs, predicted %.3f steps/s "
             "(fixed %.3f), measured %.3f", key, v.get("level"), v.get("model_level"), v.get("bias"), v.get("probe"),
             v.get("programs", 0.0), v.get("predicted_steps_per_s", 0.0), v.get("predicted_fixed_steps_per_s", 0.0),
             v.get("measured_steps_per_s", 0.0))


BEYOND_CONTEXT_MARGIN = 0.02
"""A prompt estimated from characters (``Controller._beyond_context``) must exceed the model's
context by this share before the router takes the engine's refusal as sure."""


class Controller:
    def __init__(self, config: RouterConfig, policy: str = "thunder") -> None:
        self.cfg = config
        self.policy_name = policy
        self.policy = make_policy(policy, config.scheduler, config.monitor.stale_after_seconds)
        self.sched: SchedulerConfig = self.policy.cfg
        """The one source of scheduling parameters: the configuration as the policy adjusted it."""
        self.kvrefs = KVRefs(self.sched.session_refs)
        mon = config.monitor
        self.kvdrop = KVDropWatch(mon.kv_drop_confirm, mon.kv_drop_fraction)
        self.programs = ProgramTable(GroupTable(config.programs.completed_groups_kept))
        self.backends: dict[str, Backend] = {}
        self.stats = Stats()
        self._held: dict[str, deque[Ticket]] = {}
        self._held_count = 0
        self._held_stateless: deque[Ticket] = deque()
        self.windows = Windows(config.windows.max_window_seconds)
        self._prefix_tokens: dict[str, int] = {}
        self._last_tick = float("-inf")
        self._kick = False
        self._inferred_live = 0
        """Live programs whose ids were inferred (``_pause_dormant`` looks at none otherwise)."""
        self.lengths = ProgramLengths()
        """How many steps programs take (``_pause_dormant`` reads it of an idle inferred program)."""

    # ---- backends -----------------------------------------------------------------------
    def add_backend(self, b: Backend) -> None:
        self.backends[b.key] = b

    def remove_backend(self, key: str) -> Backend | None:
        """Drop a backend: its idle programs go back to the queue at the next tick."""
        self._kick = True
        return self.backends.pop(key, None)

    def backend_list(self) -> list[Backend]:
        return list(self.backends.values())

    # ---- request path -------------------------------------------------------------------
    @property
    def held_count(self) -> int:
        return self._held_count

    def held_tickets(self) -> list[Ticket]:
        """Every ticket held now, oldest first per program (stateless ones last)."""
        return [t for q in self._held.values() for t in q] + list(self._held_stateless)

    def submit(self, t: Ticket, now: float) -> Backend | None:
        """Dispatch ``t`` now (returns its backend) or hold it (returns None).
        Raises NoBackend (stateless, nothing available), Conflict (concurrent request of one
        program), Overloaded (bounded queues full)."""
        t.created = now
        self.stats.requests += 1
        if t.program_id is None:
            if self.windows.holding:
                self._hold_stateless(t, now)
                return None
            b = least_loaded(self.backend_list(), now, self.policy.stale_after)
            if b is None:
                raise NoBackend("no available workers", retry_after=self.cfg.gateway.retry_after_seconds)
            self.stats.stateless_requests += 1
            return self._dispatch_stateless(t, b, now)
        p = self.programs.get(t.program_id)
        if p is None:
            p = self._create(t, now)
        elif t.group_id is not None and (p.group is None or p.group.id != t.group_id):
            raise BadRequest(
                f"program {p.id!r} is {'in group ' + repr(p.group.id) if p.group else 'in no group'}; "
                f"a program joins its group with its first request and stays in it (got {t.group_id!r})",
                param="group_id", code="group_mismatch")
        elif p.in_flight or p.held:
            raise Conflict(
                f"program {p.id!r} already has a request {'in flight' if p.in_flight else 'waiting'}; "
                "an agent program sends one request at a time",
                code="program_busy",
            )
        if p.steps:
            self._returned(p, now)
        if p.end_hint is not None:  # it asked again after an answer that looked like its last
            self.lengths.hint_outcome(p.end_hint, ended=False)
            p.end_hint = None
        t.program = p
        cap = t.max_output or 0
        if cap != p.output_cap:
            p.output_cap = cap
        estimate = self._estimate(p, t)
        if not self.windows.holding and self._beyond_context(p, t, estimate):
            # the engine will refuse it whatever it holds: it needs no room, so it waits for none
            b = least_loaded(self.backend_list(), now, self.policy.stale_after)
            if b is not None:
                self.stats.beyond_context += 1
                t.beyond_context = True
                return self._dispatch_stateless(t, b, now)
        if p.state is ProgramState.ACTIVE and not self.windows.holding:
            b = self.backends.get(p.backend)  # type: ignore[arg-type]
            if b is not None and b.engine_paused:
                self.stats.engine_paused_held += 1  # held until the engine continues (engine_resumed)
            elif self._gate_open(p, estimate, now):
                if b is None or b.weights_pending is None:
                    return self._dispatch(t, p, now, estimate)
                # its worker failed a weight update since the last tick: nothing goes there; the
                # next tick evacuates the program and its request goes where it is placed
                self._kick = True
        self._hold(t, p, now, estimate)
        return None

    def finish(self, t: Ticket, now: float, usage: Usage | None) -> list[Ticket]:
        """A dispatched request ended (usage None: failed or aborted). Returns held tickets
        that the freed HBM room lets through now."""
        b = t.backend
        idle_at = float("-inf")
        if b is not None:
            idle_at = b.idle_at  # before this request's end moves it (control.kvdrop)
            b.ended(now)
        if usage is not None:
            self.stats.prompt_tokens += usage.prompt_tokens
            self.stats.cached_tokens += usage.cached_tokens
        else:
            self.stats.failed_requests += 1
        p = t.program
        if t.beyond_context:  # sent outside its program's accounting (``_beyond_context``)
            if usage is not None:
                self.stats.beyond_context_served += 1
                if usage.weight_version is not None and b is not None:
                    self.weight_version_seen(b, usage.weight_version, now)
            elif p is not None and p.inferred and t.end_hint == CONTEXT_OVERFLOW and self.programs.get(p.id) is p:
                p.end_hint = CONTEXT_OVERFLOW
            return []
        if p is None or self.programs.get(p.id) is not p or p.in_flight == 0:
            if usage is not None and usage.weight_version is not None and b is not None:
                self.weight_version_seen(b, usage.weight_version, now)
            return []  # stateless, or released meanwhile
        first = p.steps == 0
        if usage is not None and b is not None:
            self._measure(b, p, t, usage, now)
            self._watch_kv(b, p, usage, idle_at, now)
        p.finish_request(now, usage, self.sched.output_ema_alpha)
        p.last_step_backend = b.key if usage is not None and b is not None and p.backend == b.key else None
        p.last_step_end = now
        if usage is not None:
            p.last_step_prompt = usage.prompt_tokens
            self.lengths.step(p.steps)
            if p.inferred:
                p.end_hint = t.end_hint
            self._learn_sizes(p, t, usage, first)
        elif p.inferred and t.end_hint == CONTEXT_OVERFLOW:  # refused for the model's context: likely its end
            p.end_hint = CONTEXT_OVERFLOW
        if usage is not None and usage.weight_version is not None and b is not None:
            self.weight_version_seen(b, usage.weight_version, now)
        self.policy.changed(p)
        return self._drain_gated(b, now) if b is not None else []

    def weight_version_seen(self, b: Backend, version: str, now: float) -> list[Program]:
        """The engine of ``b`` reports weights ``version`` (in an answer, or its model info).
        A version other than the one last seen means the weights changed behind the router
        (a framework updating the engines directly): the engine flushed its cache with them,
        so its programs' KV accounting is reset as after an update through the router
        (``reset_kv``). A worker kept out of routing after a failed update
        (``Backend.weights_pending``) comes back when it reports the version expected.
        Returns the programs sent back to the queue."""
        old = b.weight_version
        ranks = self._ranks(b)
        pending = b.weights_pending
        if pending is not None and pending.met_by(version):  # a failed update's worker caught up
            for x in ranks:
                x.weights_pending = None
            self._kick = True
            log.warning("worker %s reports weights %r after its failed %s: back in routing", b.worker_url, version,
                        pending.call)
        if old == version:
            return []
        for x in ranks:
            x.weight_version = version
        if old is None or self.windows.has(Reason.UPDATING):
            return []  # first sight; or an update through the router, which resets what it flushed
        self.stats.weight_changes_seen += 1
        log.warning("worker %s reports weights %r (was %r): updated behind the router; its KV accounting is reset",
                    b.key, version, old)
        return self.reset_kv([x.key for x in ranks], now)

    def _ranks(self, b: Backend) -> list[Backend]:
        """Every backend (DP rank) of ``b``'s worker: an engine drops or reloads them together."""
        return [x for x in self.backends.values() if x.worker_url == b.worker_url]

    def _watch_kv(self, b: Backend, p: Program, usage: Usage, idle_at: float, now: float) -> None:
        """``control.kvdrop``: did this step find its KV gone from an engine that went idle
        since its last step, as another program's did before it, the first with nothing of
        its shared prefix left? Then the engine dropped its
        cache behind the router (a flush, weights reloaded with no new version): its
        accounting is reset as for a new weight version. ``p``, still in flight, keeps its
        place (it has just rebuilt its KV there)."""
        eligible = (p.last_step_backend == b.key and p.backend == b.key and idle_at >= p.last_step_end
                    and p.id not in self.kvrefs.unref)
        if not self.kvdrop.step(b.key, p.id, eligible, p.last_step_prompt, usage.cached_tokens, p.shared_prefix_tokens):
            return
        self.stats.kv_drops_seen += 1
        log.warning("worker %s: %d programs in a row found their KV gone after the engine was idle, the first without "
                    "its shared prefix, no new weight version: its cache was dropped behind the router (a flush, a "
                    "reload); its KV accounting is reset", b.worker_url, self.kvdrop.confirm)
        self.reset_kv([x.key for x in self._ranks(b)], now)

    def _measure(self, b: Backend, p: Program, t: Ticket, usage: Usage, now: float) -> None:
        """What the admission rule reads of this step (``Backend.served``): its tokens, the part
        of the program's previous context the engine had to compute again, the request time."""
        s = b.served
        s.steps += 1
        s.prompt_tokens += usage.prompt_tokens
        s.cached_tokens += usage.cached_tokens
        s.output_tokens += usage.completion_tokens
        if p.steps > 0:  # context_tokens is still the previous step's
            new = max(0, usage.prompt_tokens - p.context_tokens)
            s.new_tokens += new
            s.recompute_tokens += max(0, usage.prompt_tokens - usage.cached_tokens - new)
        else:
            s.new_tokens += max(0, usage.prompt_tokens - usage.cached_tokens)
        if t.dispatched_at is not None:
            s.request_s = ema(s.request_s, now - t.dispatched_at, self.sched.admission.cost_ema_alpha)

    def _learn_sizes(self, p: Program, t: Ticket, usage: Usage, first: bool) -> None:
        """Sizes learned from usage: the program's characters per token (to estimate its next
        prompt) and, from a first request's cached tokens, the shared prefix."""
        if t.prompt_chars and usage.prompt_tokens:
            cpt = t.prompt_chars / usage.prompt_tokens
            p.chars_per_token = ema(p.chars_per_token, cpt, self.cfg.programs.size_ema_alpha)
        if first and p.group is not None and p.group.first_step(
                min(usage.cached_tokens, usage.prompt_tokens), p.shared_prefix_tokens if p.prefix_key else 0):
            return  # cached beyond the system prompt: the group's task prompt (``Group.first_step``)
        if first and p.prefix_key and usage.cached_tokens > 0:
            learned = min(usage.cached_tokens, usage.prompt_tokens)
            if learned > self._prefix_tokens.get(p.prefix_key, 0):
                self._prefix_tokens[p.prefix_key] = learned
            p.shared_prefix_tokens = max(p.shared_prefix_tokens, learned)

    def cancel(self, t: Ticket) -> bool:
        """Withdraw a held ticket (client gone, or timed out). True if it was held."""
        p = t.program
        if t.dispatched_at is not None:
            return False
        if p is None:
            if t not in self._held_stateless:
                return False
            self._held_stateless.remove(t)
            self._held_count -= 1
            return True
        q = self._held.get(p.id)
        if not q or t not in q:
            return False
        q.remove(t)
        if not q:
            del self._held[p.id]
        self._held_count -= 1
        if self.programs.get(p.id) is p:
            p.unhold()
            if not p.held:
                p.pending_prompt_tokens = 0
            self.policy.changed(p)
        return True

    def release(self, pid: str, now: float) -> tuple[Program, list[Ticket]]:
        """Terminate a program: accounting dropped; its held tickets are returned (the caller
        answers them). Raises NotFound for an unknown program."""
        p = self.programs.remove(pid, now)
        if p is None:
            raise NotFound(f"program {pid!r} not found (never seen, or already released)", code="program_not_found")
        q = self._held.pop(pid, deque())
        self._held_count -= len(q)
        self.stats.released += 1
        where = p.prev_backend  # released: its last backend, or where it ran before a pause
        b = self.backends.get(where) if p.steps and where else None
        if b is not None:  # how many steps programs take (the admission rule tells open streams by it)
            b.served.ended += 1
            b.served.ended_steps += p.steps
        self.lengths.end(p.steps, hinted=p.end_hint is not None)
        if p.end_hint is not None:
            self.lengths.hint_outcome(p.end_hint, ended=True)
        if p.inferred:
            self._inferred_live -= 1
        self.kvrefs.left(p)
        self._kick = True
        return p, list(q)

    def ensure_program(self, pid: str, now: float) -> Program:
        """The program, created new (queued, nothing held) if unknown: a sandbox can come
        before the first LLM call."""
        p = self.programs.get(pid)
        return p if p is not None else self._create(Ticket(pid), now)

    def tool_started(self, pid: str, now: float) -> None:
        p = self._require(pid)
        p.tool_started(now)
        if p.in_flight == 0:
            p.acting_since = now

    def tool_finished(self, pid: str, now: float, seconds: float) -> None:
        """The tool returned: the program's next LLM call is imminent, so its decay clock
        restarts (its KV is about to be needed again)."""
        p = self.programs.get(pid)
        if p is None:
            return
        p.tool_finished(now, seconds)
        if p.in_flight == 0:
            p.acting_since = now

    def failover(self, t: Ticket, now: float) -> list[Ticket]:
        """``t`` could not reach its backend before any byte was sent: the request ends without
        usage and its program goes back to the queue, to be placed wherever the next tick
        chooses (the caller retries ``t``). Returns held tickets the freed room lets through."""
        out = self.finish(t, now, None)
        p = t.program
        if p is not None and self.programs.get(p.id) is p and p.active and not p.in_flight:
            self._pause(p, now)
        t.backend = t.dispatched_at = t.session_id = None
        self._kick = True
        return out

    # ---- the tick -----------------------------------------------------------------------
    def kick(self) -> None:
        """Something arrived that waits for the scheduler: tick soon."""
        self._kick = True

    def next_tick_at(self) -> float:
        """When the next tick is due: ``tick_seconds`` after the last one, or — once something
        waits for the scheduler (a new or held program, a release, a worker change) —
        ``kick_min_interval_seconds`` after it. Both drivers (the gateway's loop and the DES)
        tick at this time."""
        due = self._last_tick + self.sched.tick_seconds
        if self._kick:
            due = min(due, self._last_tick + self.sched.kick_min_interval_seconds)
        return due

    def tick(self, now: float) -> TickResult:
        self._last_tick = now
        self._kick = False
        self.stats.ticks += 1
        closed = self.windows.expire(now)
        if self.windows.holding:
            return TickResult(decisions=Decisions())  # held: no restores, no timeouts, no releases
        dormant = self._pause_dormant(now)
        d = self.policy.tick(now, self.programs, self.backend_list())
        paused, placed = apply(d, self.programs, now)
        for key, level in d.admission.items():
            b = self.backends.get(key)
            if b is not None:
                old, b.admission = b.admission, level
                if old is not None and getattr(old, "level", None) != getattr(level, "level", None):
                    _log_level(key, level)
        for p in paused:
            self.kvrefs.left(p)
        self.kvrefs.overcommitted(d.unref, self.programs)
        self.stats.pauses += len(paused)
        admitted = [p for p in placed if p.restores == 0]
        self.stats.admissions += len(admitted)
        self.stats.restores += len(placed) - len(admitted)
        placed_ids = {p.id for p in placed}
        self.stats.migrations += sum(1 for pl in d.placements if pl.migrated and pl.program_id in placed_ids)
        res = TickResult(decisions=d, paused=dormant + paused, placed=placed)
        for p in placed:
            res.dispatched.extend(self._drain_program(p, now))
        for b in self.backend_list():
            res.dispatched.extend(self._drain_gated(b, now))
        res.dispatched.extend(self._drain_stateless(now))
        res.expired = self._expire(now)
        res.released = self._release_idle(now)
        res.window_closed = closed
        return res

    def engine_paused(self, backend_keys: Iterable[str], now: float) -> None:
        """The engines of ``backend_keys`` were seen paused (``backends.pause``; the monitor
        marked the backends): counted when no window of the router's own pause is open."""
        if any(k in self.backends for k in backend_keys) and not self.windows.has(Reason.PAUSED):
            self.stats.engine_pauses_seen += 1

    def engine_resumed(self, backend_keys: Iterable[str], now: float) -> list[Ticket]:
        """The engines of ``backend_keys`` continue (or their pause is no longer held for):
        returns the held requests of their programs that go out now, oldest first as the HBM
        condition allows; the others follow as room frees."""
        out: list[Ticket] = []
        for k in backend_keys:
            b = self.backends.get(k)
            if b is not None:
                out.extend(self._drain_gated(b, now))
        self._kick = True
        return out

    def reset_kv(self, backend_keys: Iterable[str] | None, now: float) -> list[Program]:
        """The engines of ``backend_keys`` (None: every backend) dropped their cached KV —
        new weights, a flushed cache, released KV memory. Every program there is reset
        (``Program.reset_kv``: its next request is a full prefill, its demand counts fully)
        and the idle active ones go back to the global queue, a held request keeping its
        seniority. The next tick re-admits them in aging order where they fit, so the cluster
        refills within the scheduler's limits instead of every program prefilling at once on
        its old backend. Returns the programs sent back to the queue."""
        keys = None if backend_keys is None else set(backend_keys)
        self.kvdrop.forget(keys)
        requeued = []
        for p in self.programs.values():
            where = p.backend if p.active else p.prev_backend
            if keys is not None and where not in keys:
                continue
            if p.active and p.in_flight == 0:
                self.programs.pause(p, now)
                q = self._held.get(p.id)
                if q:
                    p.waiting_since = min(now, q[0].created)
                requeued.append(p)
            p.reset_kv(now)
            self.kvrefs.forget(p)
            self.stats.kv_resets += 1
        groups = self.programs.groups
        for g in (*groups.live(), *groups.completed):
            if g.home is not None and (keys is None or g.home in keys):
                g.home = None  # its task prompt is gone from that engine's cache
        self._kick = True
        return requeued

    def queue(self, now: float) -> list[Program]:
        """The global waiting queue, best first."""
        return self.policy.queue_order(now, self.programs.waiting())

    # ---- internals ----------------------------------------------------------------------
    def _require(self, pid: str) -> Program:
        p = self.programs.get(pid)
        if p is None:
            raise NotFound(f"program {pid!r} not found (never seen, or already released)", code="program_not_found")
        return p

    def can_create(self) -> bool:
        """Whether a new program would be taken now (not refused by ``max_programs`` or
        ``max_waiting_programs``)."""
        return (len(self.programs) < self.cfg.programs.max_programs
                and self.programs.waiting_count < self.cfg.gateway.max_waiting_programs)

    def _create(self, t: Ticket, now: float) -> Program:
        g = self.cfg.gateway
        if len(self.programs) >= self.cfg.programs.max_programs:
            raise Overloaded(f"router tracks {len(self.programs)} programs (max_programs); release finished programs",
                             retry_after=g.retry_after_seconds)
        if self.programs.waiting_count >= g.max_waiting_programs:
            raise Overloaded(f"{self.programs.waiting_count} programs already wait for admission (max_waiting_programs)",
                             retry_after=g.retry_after_seconds)
        cpt = self.cfg.programs.chars_per_token
        p = self.programs.create(t.program_id, now, t.group_id, int(t.group_chars / cpt))  # type: ignore[arg-type]
        if p.group is not None and self.sched.groups:
            p.group_key = p.group.key
        p.inferred = t.inferred
        if t.inferred:
            self._inferred_live += 1
        if t.prefix_key:
            p.prefix_key = t.prefix_key
            p.shared_prefix_tokens = self._prefix_tokens.get(
                t.prefix_key, int(t.prefix_chars / self.cfg.programs.chars_per_token))
        return p

    def _estimate(self, p: Program, t: Ticket) -> int:
        if t.prompt_tokens is not None:
            return t.prompt_tokens
        cpt = p.chars_per_token if p.chars_per_token > 0 else self.cfg.programs.chars_per_token
        return int(t.prompt_chars / cpt)

    def _beyond_context(self, p: Program, t: Ticket, estimate: int) -> bool:
        """Whether the engine will surely refuse ``t`` for the model's context (SGLang refuses a
        prompt of at least the context, or prompt + ``max_tokens`` beyond it). A program's
        paused request would otherwise wait to be restored — room found for its whole context,
        the largest the program ever had — only to be refused (an agent that has outgrown the
        window sends exactly that request, and stops on the 400: ``conversations`` rule 7).
        Sure means: the prompt's token count is known (token ids), or estimated from the
        program's own learnt characters per token and still beyond the context at
        ``BEYOND_CONTEXT_MARGIN`` fewer tokens; with the context unknown on some backend, never.
        A request judged so is sent at once, outside its program's accounting, to the
        least-loaded backend; one the engine takes after all is served as a stateless request
        (``Stats.beyond_context_served``)."""
        if t.prompt_tokens is not None:
            low = float(t.prompt_tokens)
        elif p.chars_per_token > 0:
            low = estimate * (1.0 - BEYOND_CONTEXT_MARGIN)
        else:
            return False
        asked = t.max_output if t.max_output is not None and t.max_output > 0 else 0
        ctx = 0
        for b in self.backends.values():
            if b.context_length <= 0:
                return False
            ctx = max(ctx, b.context_length)
        return ctx > 0 and (low >= ctx or (asked > 0 and low + asked > ctx))

    def _gate_open(self, p: Program, estimate: int, now: float) -> bool:
        """The scheduler's HBM condition (``scheduler.gate.RequestGate``) for p's request, which
        waits behind any other request of the same backend held at it for
        ``reserve_after_seconds`` or longer (``gate``: a long waiter reserves)."""
        if p.backend is None:
            return True
        placed = self.programs.placed_on(p.backend)
        held = self._held
        queued = False
        if held and self.sched.tier_aware:  # only the tier-aware policy gates: no scan otherwise
            since = now - self.sched.reserve_after_seconds
            queued = any(q is not p and q.held and not q.in_flight and q.id in held and held[q.id][0].created <= since
                         for q in placed)
        return self.policy.gate.admits(p, estimate, self.backends.get(p.backend), placed, queued)

    def session_for(self, t: Ticket) -> str | None:
        """The ``session_id`` a request of the dispatched ticket's program would carry now
        (``kvrefs``); its own request carries ``t.session_id``, stamped at dispatch."""
        p, b = t.program, t.backend
        if p is None or b is None or self.programs.get(p.id) is not p:
            return None
        return self.kvrefs.session_for(p, b)

    def _dispatch(self, t: Ticket, p: Program, now: float, estimate: int) -> Backend:
        b = self.backends[p.backend]  # type: ignore[index]
        returning = p.steps > 0 and p.in_flight == 0
        p.start_request(now, estimate)
        if returning:  # the tool time since its last step or its restore (start_request measured it)
            b.served.tool_s = ema(b.served.tool_s, p.last_tool_seconds, self.sched.admission.cost_ema_alpha)
            b.served.tool_hist.add(p.last_tool_seconds)
        b.sent(now)
        self.kvrefs.dispatched(p, b)
        t.backend, t.dispatched_at = b, now
        t.session_id = self.kvrefs.session_for(p, b)
        self.policy.changed(p)  # last, once the ticket is stamped as dispatched
        return b

    def _returned(self, p: Program, now: float) -> None:
        """p's next request arrived: its time since its last answer (whether or not it was
        paused, restored or held since) goes to ``returns`` of the backend it ran on, which the
        inferred-program rules read. ``tool_hist`` (the goodput model's, measured at dispatch)
        counts a program paused in a long tool only from its restore, so its tail misses the
        long tools, the ones that get paused: read for the dormant rule, it made a third of the
        guesses wrong on mini-swe-agent (bench/results/inferred-des/README.md)."""
        tool = p.returned(now)
        b = self.backends.get(p.backend if p.backend is not None else p.prev_backend)  # type: ignore[arg-type]
        if b is not None:
            b.served.returns.add(tool)

    def _dispatch_stateless(self, t: Ticket, b: Backend, now: float) -> Backend:
        b.sent(now)
        t.backend, t.dispatched_at = b, now
        return b

    def _hold(self, t: Ticket, p: Program, now: float, estimate: int) -> None:
        if self._held_count >= self.cfg.gateway.max_held_requests:
            raise Overloaded(f"{self._held_count} requests are already held (max_held_requests)",
                             retry_after=self.cfg.gateway.retry_after_seconds)
        if p.dormant and not p.held:
            p.waiting_since = now  # it waits from its request on, not from when it went dormant
        p.hold(now, estimate)
        self.policy.changed(p)
        t.window_mark = self.windows.elapsed(now)
        b = self.backends.get(p.backend) if p.backend is not None else None
        if b is not None:
            t.pause_mark = (b, b.paused_seconds(now))
        self._held.setdefault(p.id, deque()).append(t)
        self._held_count += 1
        self.stats.held += 1
        if self.windows.holding:
            self.stats.window_held += 1
        elif p.state is ProgramState.ACTIVE:
            if b is None or not b.engine_paused:
                self.stats.gated += 1
        else:
            self._kick = True

    def _take(self, p: Program, now: float, estimate: int) -> Ticket:
        """Dispatch p's oldest held ticket, whose prompt ``estimate`` the caller computed when it
        checked the gate (p has a held ticket)."""
        q = self._held[p.id]
        t = q.popleft()
        if not q:
            del self._held[p.id]
        self._held_count -= 1
        p.unhold()
        self._dispatch(t, p, now, estimate)
        return t

    def _hold_stateless(self, t: Ticket, now: float) -> None:
        if self._held_count >= self.cfg.gateway.max_held_requests:
            raise Overloaded(f"{self._held_count} requests are already held (max_held_requests)",
                             retry_after=self.cfg.gateway.retry_after_seconds)
        t.window_mark = self.windows.elapsed(now)
        self._held_stateless.append(t)
        self._held_count += 1
        self.stats.held += 1
        self.stats.window_held += 1

    def _drain_stateless(self, now: float) -> list[Ticket]:
        """Stateless requests held by a window that closed, oldest first, while a backend is up."""
        out: list[Ticket] = []
        while self._held_stateless:
            b = least_loaded(self.backend_list(), now, self.policy.stale_after)
            if b is None:
                break
            t = self._held_stateless.popleft()
            self._held_count -= 1
            self.stats.stateless_requests += 1
            out.append(t)
            self._dispatch_stateless(t, b, now)
        return out

    def _drain_program(self, p: Program, now: float) -> list[Ticket]:
        """A just-placed program's held request, if the HBM gate lets it through."""
        if self.windows.holding:
            return []
        q = self._held.get(p.id)
        if not q or p.state is not ProgramState.ACTIVE or p.in_flight:
            return []
        est = self._estimate(p, q[0])
        if not self._gate_open(p, est, now):
            return []
        return [self._take(p, now, est)]

    def _drain_gated(self, b: Backend, now: float) -> list[Ticket]:
        """Held tickets of active programs on ``b``, in the order and as far as the scheduler's
        gate lets them (``RequestGate.drain``: oldest first, while the HBM condition holds)."""
        if not self._held or self.windows.holding or b.engine_paused:
            return []
        held = [(p, self._estimate(p, self._held[p.id][0]), self._held[p.id][0].created)
                for p in self.programs.on_backend(b.key) if p.held and not p.in_flight and p.id in self._held]
        if not held:
            return []
        est = {p.id: e for p, e, _ in held}
        return [self._take(p, now, est[p.id]) for p in self.policy.gate.drain(b, held, self.programs.placed_on(b.key))]

    def _expire(self, now: float) -> list[Ticket]:
        limit = self.cfg.gateway.held_timeout_seconds
        in_windows = self.windows.elapsed(now)
        out = []
        for t in self.held_tickets():
            waited = now - t.created - (in_windows - t.window_mark)
            if waited > limit and t.pause_mark is not None:
                b, mark = t.pause_mark
                waited -= b.paused_seconds(now) - mark  # its engine paused behind the router
            if waited > limit:
                self.cancel(t)
                out.append(t)
        self.stats.expired += len(out)
        return out

    def _pause_dormant(self, now: float) -> list[Program]:
        """Inferred programs that may have ended are paused and made dormant: an agent run
        without ids cannot say it ended, and until its idle timeout releases it a finished one
        would hold its place and its counted KV. Dormant, it gives both back and waits for its
        next request (then restored as any paused program with a held request). Two rules
        (``ProgramsConfig``): while programs wait with a request, one per waiting program among
        the inferred programs idle at least ``inferred_pause_min_seconds`` whose probability of
        having ended (``programs.lengths``: how many steps programs take, against how long
        tools on their backend last, and what its last answer hinted, ``conversations`` rule
        7) is at least ``inferred_pause_belief``, the likeliest first; and any idle for
        ``inferred_pause_seconds`` (a multiple of the longest tool it has shown).

        On the way it reads each idle inferred program's probability of having ended into
        ``Program.ended_p``, which its backend's admission rule reads (``scheduler.goodput``:
        an ended agent that could not say so is no program that cycles)."""
        if not self._inferred_live:
            return []
        pc = self.cfg.programs
        forced: list[Program] = []
        maybe: list[tuple[float, Program]] = []
        waiting = -1  # counted once, when a candidate needs it
        for p in self.programs.values():
            if not p.inferred or not p.active or p.in_flight or p.held or p.tool_running:
                p.ended_p = 0.0
                continue
            idle = now - p.last_active
            if idle > pc.inferred_pause_seconds(p.max_tool_seconds):
                forced.append(p)
                continue
            b = self.backends.get(p.backend)  # type: ignore[arg-type]
            ended = self.lengths.ended_probability(p.steps, b.served.returns.survival(idle), p.end_hint) if b else 0.0
            p.ended_p = ended  # the admission rule counts it out of the programs that cycle
            if waiting < 0:
                waiting = sum(1 for q in self.programs.waiting() if q.held)
            if waiting and b is not None and idle > pc.inferred_pause_min_seconds and ended >= pc.inferred_pause_belief:
                maybe.append((ended, p))
        maybe.sort(key=lambda x: -x[0])
        out = forced + [p for _, p in maybe[:max(0, waiting)]]
        for p in out:
            self._pause(p, now)
            p.dormant = True
            p.ended_p = 0.0
        self.stats.dormant += len(out)
        return out

    def _pause(self, p: Program, now: float) -> None:
        """Pause ``p`` outside the policy's decisions (a failover, a dormant program): counted,
        its KV reference dropped."""
        self.programs.pause(p, now)
        self.stats.pauses += 1
        self.kvrefs.left(p)

    def _release_idle(self, now: float) -> list[Program]:
        pc = self.cfg.programs
        limit = pc.idle_timeout_seconds
        idle = [p.id for p in self.programs if not p.in_flight and not p.held and not p.tool_running
                and now - p.last_active > (pc.inferred_idle_seconds(p.max_tool_seconds) if p.inferred else limit)]
        out = []
        for pid in idle:
            p, _ = self.release(pid, now)
            out.append(p)
        self.stats.released_idle += len(out)
        return out
