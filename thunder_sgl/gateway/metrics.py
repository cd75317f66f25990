"""Prometheus metrics of the thunder router (one registry per app).

Request-path counters and the held-wait histogram are updated as things happen; program,
backend and scheduler state is read at scrape time by a custom collector (no bookkeeping twice).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from thunder_sgl.control.conversations import END_HINTS
from thunder_sgl.programs import Phase, ProgramState

if TYPE_CHECKING:
    from thunder_sgl.control.tickets import Ticket, TickResult
    from thunder_sgl.gateway.runtime import Gateway

HELD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800)


ADMISSION_GAUGES = (
    ("level", "Admission level chosen per backend (0: the fixed watermarks)"),
    ("model_level", "Admission level the goodput model predicts best"),
    ("bias", "Levels measurement moved the choice from the model's"),
    ("extra_tokens", "Tokens admitted beyond lambda_max x pool"),
    ("programs", "Programs the admission level runs (predicted)"),
    ("protected_programs", "Of them with their KV referenced"),
    ("likely_ended_programs", "Admitted programs likely ended (inferred ids, silent): not counted as cycling"),
    ("predicted_steps_per_s", "Steps/s the model predicts at the chosen level"),
    ("predicted_fixed_steps_per_s", "Steps/s the model predicts at the fixed watermarks"),
    ("measured_steps_per_s", "Steps/s measured at the chosen level (current window)"),
    ("fixed_measured_steps_per_s", "Steps/s measured at the fixed watermarks (discounted over the fit's half-life)"),
    ("slack_s", "Seconds per program cycle the goodput model does not see (read while the engine idles)"),
    ("calibration_fixed", "Measured over predicted steps at the fixed watermarks (the goodput model's calibration)"),
    ("calibration_above", "Measured over predicted steps above the fixed watermarks (the goodput model's calibration)"),
    ("open_stream", "1 when the programs ending here take few steps (an open stream): the top level"),
    ("steps_per_ended_program", "Steps per program that ended here (discounted over the fit's half-life)"),
    ("probes", "Admission probes started"),
    ("probes_won", "Admission probes whose level measured better"),
    ("fallbacks", "Falls back to the fixed watermarks after a measured loss"),
)
"""The admission rule's state per backend, as gauges (``scheduler.goodput.AdmissionState.view``)."""


class GatewayMetrics:
    def __init__(self, gw: Gateway) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("thunder_requests", "Inference requests by route and status",
                                ["route", "status"], registry=self.registry)
        self.upstream_errors = Counter("thunder_upstream_errors", "Upstream failures by kind",
                                       ["kind"], registry=self.registry)
        self.held_wait = Histogram("thunder_held_wait_seconds", "Time requests were held before dispatch",
                                   buckets=HELD_BUCKETS, registry=self.registry)
        self.registry.register(_StateCollector(gw))
        self.last_demand: dict[str, float] = {}
        self.held_wait_max = 0.0

    def observe_held(self, t: Ticket) -> None:
        self.held_wait.observe(t.held_seconds)
        self.held_wait_max = max(self.held_wait_max, t.held_seconds)

    def on_tick(self, res: TickResult) -> None:
        self.last_demand = dict(res.decisions.demand)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StateCollector(Collector):
    def __init__(self, gw: Gateway) -> None:
        self.gw = gw

    def describe(self) -> list[Any]:
        return []  # state is read at scrape time only

    def collect(self) -> Iterator[Any]:
        c = self.gw.controller
        by = GaugeMetricFamily("thunder_programs", "Live programs by state and phase", labels=["state", "phase"])
        counts: dict[tuple[str, str], int] = {}
        for p in c.programs:
            k = (p.state.value if p.admitted or p.state is not ProgramState.PAUSED else "new", p.phase.value)
            counts[k] = counts.get(k, 0) + 1
        for st in ("active", "paused", "new"):
            for ph in (Phase.REASONING.value, Phase.ACTING.value):
                by.add_metric([st, ph], counts.get((st, ph), 0))
        yield by
        yield GaugeMetricFamily("thunder_held_requests", "Requests held for paused programs or by the HBM gate",
                                value=c.held_count)
        yield GaugeMetricFamily("thunder_waiting_programs", "Programs in the global waiting queue",
                                value=c.programs.waiting_count)
        now = self.gw.clock()
        oldest = min((t.created for t in c.held_tickets()), default=now)
        yield GaugeMetricFamily("thunder_held_wait_oldest_seconds", "Age of the oldest request held now",
                                value=now - oldest)
        yield GaugeMetricFamily("thunder_held_wait_max_seconds", "Longest wait of any request dispatched after being held",
                                value=self.gw.metrics.held_wait_max)
        yield GaugeMetricFamily("thunder_window_open", "1 while a weight-update window holds requests",
                                value=1.0 if c.windows.holding else 0.0)
        mon = self.gw.monitor
        yield GaugeMetricFamily("thunder_workers_paused", "Workers paused now (GET /ready 503 while answering), "
                                "their programs held", value=sum(1 for w in mon.workers.values() if w.pause.holding)
                                if mon is not None else 0)
        s = c.stats
        for name, value, doc in (
            ("thunder_admissions", s.admissions, "New programs admitted"),
            ("thunder_pauses", s.pauses, "Program pauses"),
            ("thunder_restores", s.restores, "Program restores"),
            ("thunder_migrations", s.migrations, "Restores onto a different backend"),
            ("thunder_held", s.held, "Requests held (total)"),
            ("thunder_gated", s.gated, "Requests held by the HBM condition (total)"),
            ("thunder_held_expired", s.expired, "Held requests answered 503 after held_timeout"),
            ("thunder_released", s.released, "Programs released"),
            ("thunder_released_idle", s.released_idle, "Programs released by the idle timeout"),
            ("thunder_ticks", s.ticks, "Scheduler ticks"),
            ("thunder_window_held", s.window_held, "Requests held because a weight-update window was open"),
            ("thunder_kv_resets", s.kv_resets, "Programs whose cached KV the engines dropped (new weights, flush)"),
            ("thunder_weight_changes_seen", s.weight_changes_seen,
             "Engines seen with new weights the router did not load (updated behind it)"),
            ("thunder_dormant", s.dormant,
             "Inferred programs paused after idling past their tools (their client cannot say they ended)"),
            ("thunder_kv_drops_seen", s.kv_drops_seen,
             "Engines seen to drop their cached KV behind the router with no new weight version (flush, reload)"),
            ("thunder_engine_pauses_seen", s.engine_pauses_seen,
             "Workers seen paused behind the router (GET /ready 503 with no pause through the router)"),
            ("thunder_engine_paused_held", s.engine_paused_held,
             "Requests held because their program's engine was paused"),
            ("thunder_beyond_context", s.beyond_context,
             "Requests sent at once, without waiting for room, because the engine would surely refuse them for "
             "the model's context length"),
            ("thunder_beyond_context_served", s.beyond_context_served,
             "Of those, requests the engine served after all (served statelessly)"),
            ("thunder_windows_opened", c.windows.opened, "Weight-update windows opened"),
            ("thunder_windows_expired", c.windows.expired, "Weight-update windows closed by the watchdog"),
            ("thunder_usage_prompt_tokens", s.prompt_tokens, "Prompt tokens reported in usage"),
            ("thunder_usage_cached_tokens", s.cached_tokens, "Cached prompt tokens reported in usage"),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        conv = self.gw.conversations
        if conv is not None:
            inf = CounterMetricFamily("thunder_inferred_requests", "Chat requests without a program id, by how "
                                      "their program was inferred: matched (an existing program), new, ambiguous "
                                      "(several programs: sent statelessly), busy (its program had a request out: "
                                      "sent statelessly)", labels=["result"])
            for k, v in conv.counts.items():
                inf.add_metric([k], v)
            yield inf
            yield GaugeMetricFamily("thunder_inferred_conversations", "Conversations the program inference tracks",
                                    value=len(conv))
            hint = GaugeMetricFamily("thunder_inferred_end_hint_share", "Learnt share of answers with this end hint "
                                     "(sign: a finishing tool or marker; plain: offered tools left uncalled; "
                                     "context_overflow: a request the engine refused for the model's context length) that "
                                     "were their inferred program's last (prior until some are seen)", labels=["kind"])
            for kind in END_HINTS:
                hint.add_metric([kind], c.lengths.hint_rate(kind))
            yield hint
        rate = s.cached_tokens / s.prompt_tokens if s.prompt_tokens else 0.0
        yield GaugeMetricFamily("thunder_kv_hit_rate", "Cached / prompt tokens seen in usage since start", value=rate)
        demand = GaugeMetricFamily("thunder_backend_demand_tokens", "Decayed program demand per backend at the last tick",
                                   labels=["backend"])
        cap = GaugeMetricFamily("thunder_backend_capacity_tokens", "Capacity per backend and tier",
                                labels=["backend", "tier"])
        used = GaugeMetricFamily("thunder_backend_used_tokens", "Engine-reported used tokens per backend and tier",
                                 labels=["backend", "tier"])
        healthy = GaugeMetricFamily("thunder_backend_healthy", "1 when the backend is available", labels=["backend"])
        paused = GaugeMetricFamily("thunder_backend_paused", "1 while the backend's engine is paused (its programs "
                                   "held)", labels=["backend"])
        active = GaugeMetricFamily("thunder_backend_programs", "Active programs per backend", labels=["backend"])
        adm = {name: GaugeMetricFamily(f"thunder_admission_{name}", doc, labels=["backend"]) for name, doc in ADMISSION_GAUGES}
        probe = GaugeMetricFamily("thunder_admission_probe", "Admission probe under way: 1 up, -1 down, 0 none",
                                  labels=["backend"])
        last = self.gw.metrics.last_demand
        for b in c.backend_list():
            demand.add_metric([b.key], last.get(b.key, 0.0))
            cap.add_metric([b.key, "hbm"], b.tiers.hbm_tokens)
            cap.add_metric([b.key, "host"], b.tiers.host_tokens)
            cap.add_metric([b.key, "storage"], b.tiers.storage_tokens)
            used.add_metric([b.key, "hbm"], b.live.used_tokens)
            used.add_metric([b.key, "host"], b.live.host_used_tokens)
            healthy.add_metric([b.key], 1.0 if b.available(self.gw.clock(), self.gw.cfg.monitor.stale_after_seconds) else 0.0)
            paused.add_metric([b.key], 1.0 if b.engine_paused else 0.0)
            active.add_metric([b.key], len(c.programs.on_backend(b.key)))
            view = b.admission.view() if b.admission is not None else {}
            for name, _ in ADMISSION_GAUGES:
                v = view.get(name)
                if isinstance(v, (int, float)):
                    adm[name].add_metric([b.key], float(v))
            probe.add_metric([b.key], {"up": 1.0, "down": -1.0}.get(str(view.get("probe")), 0.0))
        yield from (demand, cap, used, healthy, paused, active, *adm.values(), probe)
