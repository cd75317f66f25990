"""Typed, frozen configuration of the thunder router, loaded from ``configs/thunder.yaml``.

Every field carries a docstring; invariants are checked in ``__post_init__``. Time constants
are in seconds of *real* time for a real cluster; ``RouterConfig.scaled(S)`` divides every one
of them by S so that the router runs correctly in front of simulated workers whose virtual
clock runs S times faster than real time (``--time-scale S`` / ``--thunder-time-scale S``).
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from thunder_sgl.errors import ConfigError
from thunder_sgl.errors import check_config as _check
from thunder_sgl.sandboxes.config import SandboxConfig

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
MIN_POLL_SECONDS = 0.1
"""The monitor's poll period is scaled with the time scale down to this (wall seconds)."""


@dataclass(frozen=True)
class AdmissionConfig:
    """How far each backend's pool is filled beyond the watermarks (``scheduler.goodput``).

    ``goodput`` predicts the steps/s of each admission level from an engine model fitted online
    and the programs' closed loop, picks the best and checks it by measurement (probes);
    ``occupancy`` is the previous default, a controller on the share of time a request is in
    flight (``scheduler.occupancy``); ``fixed`` admits what fits the watermarks only."""

    mode: str = "goodput"
    """goodput | occupancy | fixed."""

    max_overcommit: float = 4.0
    """Largest extra admission, as a share of the pool (4: up to five times what fits)."""

    cost_ema_alpha: float = 0.2
    """Smoothing of the router's measured times (request and tool time per step)."""

    levels: int = 12
    """goodput: admission levels between the watermarks (0) and ``max_overcommit·pool``."""

    min_gain: float = 0.05
    """goodput: predicted gain a level needs over the fixed watermarks to be chosen."""

    fit_half_life_periods: float = 24.0
    """goodput: half-life of the engine fit's memory, in periods (``tick_seconds``)."""

    probe_every_periods: int = 6
    """goodput: periods at a level between two probes of the neighbouring level."""

    probe_periods: int = 4
    """goodput: periods a probe lasts (one more settles first)."""

    probe_min_steps: int = 12
    """goodput: steps a window needs before it is compared or probed from."""

    probe_margin: float = 0.05
    """goodput: least relative gain of a probe to move the level (more when the windows are
    short: ``probe_sigmas`` times the relative noise of the step counts)."""

    probe_sigmas: float = 1.5
    """goodput: standard deviations of the step counts' noise a probe must win by."""

    reference_probes: bool = False
    """goodput: every other probe down goes straight to the watermarks, and when they win the
    level falls back there. Off by default: from a high level it pauses most programs at once."""

    calibrate: bool = True
    """goodput: rate level 0 and the levels above it by what each measured against what the
    model predicted there (``goodput._calibration``). Off: the model's predictions as they are,
    corrected only by probes."""

    probe_up: str = "idle"
    """goodput: probes of levels above the model's choice. ``idle`` (default): only while the
    engine is busy less than ``probe_up_busy`` of the time, lately and over the window the
    probe is compared with — a probe up costs the recompute
    of what it admits and then pauses (4% of a 25-minute DES run on 2 saturated GLM nodes) and
    can only pay where the engine has idle time to fill; ``on``: where the model predicts
    ``min_gain`` there; ``off``: never."""

    probe_down_busy: float = 0.8
    """goodput: probes of levels below the current one run only while the engine is busy at
    least this share of the time, lately (averaged over the fit's half-life) or over the window
    the probe is compared with (0: always). A probe down asks whether fewer programs relieve a
    saturated engine; on one that idles it can only hold back programs the engine has room for
    (the Mooncake trace replayed open-loop on two simulated CPU engines about 50% busy: probes
    down to the watermarks queued up to 200 requests at the router)."""

    probe_up_busy: float = 0.9
    """goodput: the engine's busy share (prefill and decode iterations, from its counters)
    below which ``probe_up: idle`` probes up."""

    max_bias: int = 4
    """goodput: most levels that measurement may move the choice away from the model's."""

    occupancy_target: float = 0.95
    """occupancy: the share of time a backend should have a request in flight."""

    gain: float = 1.0
    """occupancy: share of the idle engine time one period's increase aims to fill."""

    decrease: float = 0.5
    """occupancy: multiplicative decrease of the extra admission once a backend is saturated."""

    deadband: float = 0.03
    """occupancy: no change while the occupancy is within this of the target."""

    max_step: float = 0.25
    """occupancy: largest increase of the extra admission in one period, as a share of the pool."""

    MODES = ("goodput", "occupancy", "fixed")

    @classmethod
    def shorthand(cls, mode: str) -> AdmissionConfig:
        """``admission: <mode>``; the previous configuration's ``cost`` is ``occupancy``."""
        mode = {"cost": "occupancy"}.get(mode, mode)
        return cls(mode=mode)

    def __post_init__(self) -> None:
        _check(self.mode in self.MODES, f"scheduler.admission.mode must be one of {list(self.MODES)}")
        _check(0 <= self.max_overcommit <= 8, "scheduler.admission.max_overcommit must be in [0, 8]")
        _check(0 < self.cost_ema_alpha <= 1, "scheduler.admission.cost_ema_alpha must be in (0, 1]")
        _check(1 <= self.levels <= 64, "scheduler.admission.levels must be in [1, 64]")
        _check(0 <= self.min_gain < 1, "scheduler.admission.min_gain must be in [0, 1)")
        _check(self.fit_half_life_periods > 0, "scheduler.admission.fit_half_life_periods must be > 0")
        _check(self.probe_every_periods >= 1 and self.probe_periods >= 1, "scheduler.admission probe periods must be >= 1")
        _check(self.probe_min_steps >= 1, "scheduler.admission.probe_min_steps must be >= 1")
        _check(0 <= self.probe_margin < 1, "scheduler.admission.probe_margin must be in [0, 1)")
        _check(0 < self.probe_sigmas <= 6, "scheduler.admission.probe_sigmas must be in (0, 6]")
        _check(self.probe_up in ("idle", "on", "off"), "scheduler.admission.probe_up must be idle, on or off")
        _check(0 <= self.probe_down_busy <= 1, "scheduler.admission.probe_down_busy must be in [0, 1]")
        _check(0 < self.probe_up_busy <= 1, "scheduler.admission.probe_up_busy must be in (0, 1]")
        _check(0 <= self.max_bias <= self.levels, "scheduler.admission.max_bias must be in [0, levels]")
        _check(0 < self.occupancy_target < 1, "scheduler.admission.occupancy_target must be in (0, 1)")
        _check(0 < self.gain <= 4 and 0 < self.decrease <= 1, "scheduler.admission: gain in (0, 4], decrease in (0, 1]")
        _check(0 <= self.deadband < self.occupancy_target, "scheduler.admission.deadband must be in [0, target)")
        _check(0 < self.max_step <= 1, "scheduler.admission.max_step must be in (0, 1]")


@dataclass(frozen=True)
class SchedulerConfig:
    """Parameters of the program scheduler (design.md, "Scheduling model")."""

    tick_seconds: float = 5.0
    """Δt: period of the thrash check. Paper default 5 s."""

    decay_base: float = 2.0
    """x in f(k) = x^(-k): weight of an acting program after k whole ticks of tool time."""

    max_decay_ticks: int = 64
    """Ticks after which an acting program's weight is taken as exactly 0."""

    decay: str = "paper"
    """How an acting program's weight decays (``cost.returns_weights``). ``paper`` (the
    default): ``x^-k`` alone. ``returns`` (opt-in: 0.9% lower on 8 GLM nodes): the larger of
    ``x^-k`` and the probability, from the backend's measured client silences
    (``Served.returns``), that a program silent k ticks asks again within one request time
    (``Served.request_s``): where tools outlast the ticks, a program likely back before a
    newcomer's step would end keeps its room."""

    lambda_max: float = 0.95
    """High watermark: pause when demand exceeds lambda_max × pool. Below 1: the engine needs
    room for decode growth between ticks (the paper uses 1; see bench/results/tuning)."""

    lambda_min: float = 0.85
    """Low watermark: restore only while demand is below lambda_min × pool. The gap to
    lambda_max is room for the active programs' growth: it halves pause/restore churn."""

    hbm_lambda: float = 1.2
    """Reasoning programs' KV (context + expected output) must fit hbm_lambda × HBM. Above 1
    because the engine admits by exact free KV and reserves less than the full expected output;
    1.2 was best in bench/results/tuning (1.0 held requests the engine could run, no gate let it retract)."""

    tier_aware: bool = True
    """Count HiCache host and storage tiers in the pool and gate reasoning KV on HBM.
    False gives the paper-faithful policy: the pool is HBM only."""

    host_weight: float = 1.0
    """Fraction of the host tier's capacity counted in the pool."""

    storage_weight: float = 1.0
    """Fraction of the storage tier's capacity counted in the pool."""

    held_bonus_seconds: float = 60.0
    """Restore order: a paused program with a held request ranks as if it had waited this much longer."""

    idle_bonus_seconds: float = 30.0
    """Restore order: a paused program without a held request (idle) gets this bonus; new programs get 0."""

    reserve_after_seconds: float = 60.0
    """When the head of the queue has waited this long and fits nowhere, nothing behind it is
    placed until it fits (head-of-line reservation: bounds every program's wait); one that only
    the HBM condition keeps out is placed by the pool alone. A request held at the HBM condition
    this long makes newer requests of its backend wait behind it (``scheduler.gate``)."""

    groups: bool = True
    """Count group members' shared task prompt once per backend, place members together when
    that saves its prefill, and age groups in the queue (``groups``; thunder-paper: off)."""

    group_bonus_seconds: float = 120.0
    """Restore order: a waiting group member gets ``done share × this`` on top of its class
    bonus, where ``done share`` is the share of its group's members already finished, so a
    group's last members go before newer work (a training step waits for the whole group)."""

    default_output_tokens: int = 256
    """Expected output per step for a program with no history yet."""

    output_ema_alpha: float = 0.3
    """Smoothing of a program's expected output tokens per step."""

    pressure_waiting_reqs: int = 8
    """A backend whose engine reports more waiting requests than this gets no restores this tick."""

    kick_min_interval_seconds: float = 0.05
    """Minimum spacing of event-driven ticks (on arrivals of held or new programs)."""

    admission: AdmissionConfig = field(default_factory=lambda: AdmissionConfig())
    """How far each backend's pool is filled (``scheduler.goodput``): a section of its own.
    The shorthand ``admission: fixed`` (or ``goodput``, ``occupancy``) sets only its mode."""

    session_refs: bool = True
    """Reference the KV of the programs thunder keeps (``session_id`` = program id, on workers
    started with ``--enable-session-radix-cache``) and dereference it on pause and release."""

    def __post_init__(self) -> None:
        _check(self.tick_seconds > 0, "scheduler.tick_seconds must be > 0")
        _check(self.decay_base >= 1.0, "scheduler.decay_base must be >= 1 (1 disables decay)")
        _check(self.max_decay_ticks >= 1, "scheduler.max_decay_ticks must be >= 1")
        _check(self.decay in ("paper", "returns"), "scheduler.decay must be 'paper' or 'returns'")
        _check(0 < self.lambda_min <= self.lambda_max, "need 0 < lambda_min <= lambda_max")
        _check(self.lambda_max <= 4.0, "scheduler.lambda_max above 4 makes no physical sense")
        _check(0 < self.hbm_lambda <= 2.0, "scheduler.hbm_lambda must be in (0, 2]")
        _check(0 <= self.host_weight <= 1 and 0 <= self.storage_weight <= 1, "tier weights must be in [0, 1]")
        _check(self.held_bonus_seconds >= self.idle_bonus_seconds >= 0, "need held_bonus >= idle_bonus >= 0")
        _check(self.reserve_after_seconds >= 0, "scheduler.reserve_after_seconds must be >= 0")
        _check(self.group_bonus_seconds >= 0, "scheduler.group_bonus_seconds must be >= 0")
        _check(self.default_output_tokens >= 1, "scheduler.default_output_tokens must be >= 1")
        _check(0 < self.output_ema_alpha <= 1, "scheduler.output_ema_alpha must be in (0, 1]")
        _check(self.kick_min_interval_seconds >= 0, "scheduler.kick_min_interval_seconds must be >= 0")
        if isinstance(self.admission, str):
            object.__setattr__(self, "admission", AdmissionConfig.shorthand(self.admission))

    _TIME_FIELDS = ("tick_seconds", "held_bonus_seconds", "idle_bonus_seconds", "reserve_after_seconds", "kick_min_interval_seconds",
                    "group_bonus_seconds")


@dataclass(frozen=True)
class ProgramsConfig:
    """Program table limits and lifecycle."""

    idle_timeout_seconds: float = 1800.0
    """A program with no request for this long is released (sandboxes reaped)."""

    max_programs: int = 100_000
    """Live programs the router will track; past this, new programs get 503."""

    chars_per_token: float = 4.0
    """Initial estimate used to size a request before its usage is known; refined per program."""

    size_ema_alpha: float = 0.3
    """Smoothing of a program's learned characters per token."""

    group_id_pattern: str | None = None
    """Derive a program's group from its id when the request names none: a regular expression
    matched at the start of the program id; the group id is its first capture group (or the
    whole match). E.g. ``^(.+)-s\\d+$`` makes ``task7-s3`` a member of ``task7``. None: no
    derivation."""

    completed_groups_kept: int = 1000
    """Completed groups kept for ``GET /groups`` (their members' completion times)."""

    infer_ids: bool = True
    """A chat request with no program id is matched to a program by its messages
    (``control.conversations``); False: such requests are stateless."""

    inferred_idle_min_seconds: float = 60.0
    """An inferred program is released after ``inferred_idle_tool_factor`` × the longest tool
    time it has shown, at least this, at most ``idle_timeout_seconds``."""

    inferred_idle_tool_factor: float = 4.0

    inferred_pause_min_seconds: float = 2.0
    """An inferred program cannot say it ended. While programs wait with a request, one idle at
    least this long whose probability of having ended is at least ``inferred_pause_belief`` is
    paused and waits for its next request (``Program.dormant``) instead of holding its place;
    any is, once idle for ``inferred_pause_seconds``."""

    inferred_pause_belief: float = 0.9
    """P(ended | steps answered, idle time) needed to make an inferred program dormant while
    others wait (``programs.lengths``): from how many steps programs took before they ended and
    how long tools last. 0.9: one wrong guess, a live program whose KV goes, per nine right."""

    inferred_end_tools: tuple[str, ...] = ("finish", "submit", "attempt_completion")
    """Tool names whose call ends an agent (OpenHands, SWE-agent, Cline): an answer calling one
    hints that its inferred program ended (``control.conversations`` rule 7)."""

    inferred_end_markers: tuple[str, ...] = ("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",)
    """Text whose presence in an answer (content or tool-call arguments) hints the same
    (mini-swe-agent's submit command). Empty: none."""

    def __post_init__(self) -> None:
        if self.group_id_pattern is not None:
            try:
                re.compile(self.group_id_pattern)
            except re.error as e:
                raise ConfigError(f"programs.group_id_pattern is not a valid regular expression: {e}") from None
        _check(self.completed_groups_kept >= 0, "programs.completed_groups_kept must be >= 0")
        _check(self.inferred_idle_min_seconds > 0, "programs.inferred_idle_min_seconds must be > 0")
        _check(self.inferred_idle_tool_factor >= 1, "programs.inferred_idle_tool_factor must be >= 1")
        _check(self.inferred_pause_min_seconds > 0, "programs.inferred_pause_min_seconds must be > 0")
        _check(0 < self.inferred_pause_belief <= 1, "programs.inferred_pause_belief must be in (0, 1]")
        _check(self.idle_timeout_seconds > 0, "programs.idle_timeout_seconds must be > 0")
        _check(self.max_programs >= 1, "programs.max_programs must be >= 1")
        _check(self.chars_per_token > 0, "programs.chars_per_token must be > 0")
        _check(0 < self.size_ema_alpha <= 1, "programs.size_ema_alpha must be in (0, 1]")

    _TIME_FIELDS = ("idle_timeout_seconds", "inferred_idle_min_seconds", "inferred_pause_min_seconds")

    def inferred_idle_seconds(self, longest_tool_s: float) -> float:
        """The idle timeout of an inferred program that has shown tools of up to
        ``longest_tool_s`` (docs/deploy.md, "Program ids")."""
        return min(self.idle_timeout_seconds,
                   max(self.inferred_idle_min_seconds, self.inferred_idle_tool_factor * longest_tool_s))

    def inferred_pause_seconds(self, longest_tool_s: float) -> float:
        """How long an inferred program may idle, with nobody waiting, before it is paused,
        dormant (``Program.dormant``): ``inferred_idle_tool_factor`` × its longest tool, at
        least 10 × ``inferred_pause_min_seconds``."""
        return max(10 * self.inferred_pause_min_seconds, self.inferred_idle_tool_factor * longest_tool_s)


@dataclass(frozen=True)
class MonitorConfig:
    """Polling of workers' /server_info, /v1/loads, /metrics and health."""

    poll_interval_seconds: float = 1.0
    """Period of /v1/loads and /metrics polling per worker."""

    stale_after_seconds: float = 10.0
    """Live numbers older than this make the backend count as full."""

    request_timeout_seconds: float = 2.0
    """Timeout of one monitor request. A worker that stops answering is marked unhealthy
    within failure_threshold × (poll_interval + request_timeout) seconds (9 s by default)."""

    failure_threshold: int = 3
    """Consecutive failed polls before a worker is marked unhealthy."""

    success_threshold: int = 1
    """Consecutive good polls before an unhealthy worker rejoins."""

    version_poll_seconds: float = 5.0
    """Period of reading each worker's weight version (``/model_info``): weights updated behind
    the router are seen within it even when no answer says so (streams do not)."""

    kv_drop_confirm: int = 2
    """An engine that dropped its cache behind the router with no new weight version (a direct
    ``/flush_cache``, weights reloaded without a version label) is recognised when this many
    programs in a row, each placed there since its last step and each after the router saw the
    engine idle, find less than ``kv_drop_fraction`` of their previous prompt cached
    (``control.kvdrop``); its KV accounting is then reset. 0: off."""

    kv_drop_fraction: float = 0.5
    """See ``kv_drop_confirm``."""

    storage_tokens: int = 0
    """Capacity of a worker's HiCache storage (L3) tier per rank, in tokens, counted in the
    pool when the worker runs a storage backend. SGLang 0.5.23 reports none (a file tier is
    bounded by its disk, a remote store by its own configuration): 0 leaves storage out of the
    pool. A worker that reports ``hicache_storage_capacity_tokens`` (our simulator) wins."""

    def __post_init__(self) -> None:
        _check(self.poll_interval_seconds > 0, "monitor.poll_interval_seconds must be > 0")
        _check(self.version_poll_seconds > 0, "monitor.version_poll_seconds must be > 0")
        _check(self.stale_after_seconds > self.poll_interval_seconds, "monitor.stale_after_seconds must exceed the poll interval")
        _check(self.request_timeout_seconds > 0, "monitor.request_timeout_seconds must be > 0")
        _check(self.storage_tokens >= 0, "monitor.storage_tokens must be >= 0")
        _check(self.kv_drop_confirm >= 0, "monitor.kv_drop_confirm must be >= 0 (0: off)")
        _check(0 < self.kv_drop_fraction <= 1, "monitor.kv_drop_fraction must be in (0, 1]")
        _check(self.failure_threshold >= 1 and self.success_threshold >= 1, "monitor thresholds must be >= 1")

    # The poll period is scaled: what matters is how fresh the readings are relative to the
    # engine's own dynamics, so a worker whose clock runs S× faster is read S× as often (a 1 s
    # period in front of a simulation at ×8 would be 8 s of engine time, and the HTTP benchmark
    # would schedule on older readings than a real cluster or the DES does). Timeouts and the
    # staleness limit are network timings: not scaled.
    _TIME_FIELDS = ("poll_interval_seconds", "version_poll_seconds")


@dataclass(frozen=True)
class GatewayConfig:
    """The router process and its request path: workers, policy, keys, identity and limits.

    ``thunder-router`` sets the process options from its command line (sglang_router's flags
    and the ``--thunder-*`` ones, named under each field); a flag given wins over the YAML."""

    worker_urls: tuple[str, ...] = ()
    """Workers routed to from the start (``--worker-urls``); more join through ``POST /workers``."""

    policy: str = "thunder"
    """The program policy (``scheduler.policies``; ``--thunder-variant`` names one)."""

    api_key: str | None = field(default=None, repr=False)
    """Key of the inference, program and tool routes (``--api-key``), also sent to the workers
    (they were started with it). None: those routes are open."""

    instance_id: str | None = None
    """Stable id of this router (``--thunder-instance-id``): labels its sandboxes, and a restart
    with the same id sweeps what the last run left. None: ``thunder-<host>-<port>`` when
    ``thunder-router`` starts it, ``thunder-router`` for a router built in process."""

    state_dir: str | None = None
    """Directory for router state, the sandboxes' working dirs (``--thunder-state-dir``)."""

    request_id_headers: tuple[str, ...] = ("x-request-id", "x-correlation-id", "x-trace-id", "request-id")
    """Client headers passed on to the worker (``--request-id-headers``), besides
    ``traceparent`` and ``tracestate``."""

    max_held_requests: int = 10_000
    """Requests held for paused programs, all programs together; past this, 503 + Retry-After."""

    max_waiting_programs: int = 20_000
    """Programs in the global waiting queue; past this, new programs get 503 + Retry-After."""

    max_body_bytes: int = 32 * 1024 * 1024
    """Largest request body accepted (413 past it; ``--max-payload-size`` when given)."""

    held_timeout_seconds: float = 1800.0
    """A request held longer than this is answered 503 + Retry-After (the program stays queued)."""

    upstream_timeout_seconds: float = 1800.0
    """Total time allowed for one upstream request."""

    retries_before_first_byte: int = 2
    """Transparent retries on another worker when the upstream fails before any byte was sent."""

    retry_after_seconds: float = 5.0
    """Value of Retry-After on 429/503."""

    admin_api_key: str | None = field(default=None, repr=False)
    """Key for admin routes (workers, flush, listing/releasing all programs;
    ``--thunder-admin-api-key``). None: admin routes use ``api_key`` if one is set, else are
    open (loopback deployments)."""

    def __post_init__(self) -> None:
        _check(self.max_held_requests >= 1, "gateway.max_held_requests must be >= 1")
        _check(self.max_waiting_programs >= 1, "gateway.max_waiting_programs must be >= 1")
        _check(self.max_body_bytes >= 1024, "gateway.max_body_bytes must be >= 1024")
        _check(self.held_timeout_seconds > 0 and self.upstream_timeout_seconds > 0, "gateway timeouts must be > 0")
        _check(self.retries_before_first_byte >= 0, "gateway.retries_before_first_byte must be >= 0")

    _TIME_FIELDS = ("held_timeout_seconds", "upstream_timeout_seconds", "retry_after_seconds")


@dataclass(frozen=True)
class WindowConfig:
    """Weight-update windows and the engine control routes (``thunder_sgl.control.windows``)."""

    max_window_seconds: float = 1800.0
    """A window open longer than this is closed by the router, so a trainer that died
    mid-sync does not hold rollouts forever (the engines are left as they are)."""

    control_timeout_seconds: float = 900.0
    """Total time allowed for one engine control call to one worker (loading weights from
    disk can take minutes)."""

    def __post_init__(self) -> None:
        _check(self.max_window_seconds > 0, "windows.max_window_seconds must be > 0")
        _check(self.control_timeout_seconds > 0, "windows.control_timeout_seconds must be > 0")

    # The trainer runs in real time, also in front of a simulated cluster.
    _TIME_FIELDS = ()


@dataclass(frozen=True)
class RouterConfig:
    """Everything the thunder policy and its gateway need; one object handed down from create_app."""

    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    programs: ProgramsConfig = field(default_factory=ProgramsConfig)
    monitor: MonitorConfig = field(default_factory=MonitorConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    sandboxes: SandboxConfig = field(default_factory=SandboxConfig)
    windows: WindowConfig = field(default_factory=WindowConfig)
    time_scale: float = 1.0
    """Speed of the workers' clock relative to real time; set by scaled(), 1 for real clusters."""

    def __post_init__(self) -> None:
        _check(self.time_scale > 0, "time_scale must be > 0")

    def scaled(self, time_scale: float) -> RouterConfig:
        """The same config with every policy time constant divided by ``time_scale``."""
        _check(time_scale > 0, "time scale must be > 0")
        if time_scale == 1.0:
            return self
        parts = {}
        for name in ("scheduler", "programs", "monitor", "gateway", "sandboxes", "windows"):
            part = getattr(self, name)
            parts[name] = dataclasses.replace(
                part, **{f: getattr(part, f) / time_scale for f in part._TIME_FIELDS}
            )
        mon = parts["monitor"]
        if mon.poll_interval_seconds < MIN_POLL_SECONDS:  # a floor: polls cost the workers too
            parts["monitor"] = dataclasses.replace(mon, poll_interval_seconds=min(MIN_POLL_SECONDS, self.monitor.poll_interval_seconds))
        return dataclasses.replace(self, time_scale=self.time_scale * time_scale, **parts)

    def with_overrides(self, dotted: dict[str, Any]) -> RouterConfig:
        """Apply ``{"scheduler.tick_seconds": 2.0, "scheduler.admission.mode": "fixed", ...}``
        overrides (any depth), validating each."""
        tree = to_dict(self)
        for key, value in dotted.items():
            *path, name = key.split(".")
            node = tree
            for part in path:
                if not isinstance(node.get(part), dict):
                    raise ConfigError(f"unknown config section {part!r} in override {key!r}")
                node = node[part]
            node[name] = value
        return from_dict(RouterConfig, tree)


def to_dict(obj: Any) -> Any:
    """Plain-data form of a config dataclass (tuples become lists)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple):
        return [to_dict(v) for v in obj]
    return obj


def from_dict(cls: type, data: dict[str, Any] | None, where: str = "") -> Any:
    """Build a frozen config dataclass from nested plain data; unknown keys fail loudly."""
    data = dict(data or {})
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"unknown key(s) {unknown} in {where or cls.__name__}; valid keys: {sorted(fields)}"
        )
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _coerce(hints[name], value, f"{where}.{name}" if where else name)
    try:
        return cls(**kwargs)
    except TypeError as e:  # pragma: no cover - guarded by the unknown-key check
        raise ConfigError(f"{where or cls.__name__}: {e}") from e


def _coerce(hint: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if isinstance(value, str) and hasattr(hint, "shorthand"):
            return hint.shorthand(value)
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping")
        return from_dict(hint, value, where)
    if origin in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            return None
        return _coerce(args[0], value, where)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list")
        item = typing.get_args(hint)[0]
        return tuple(_coerce(item, v, where) for v in value)
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {value!r}")
        return value
    return value


def resolve_config_path(name_or_path: str | Path, subdir: str = "") -> Path:
    """A config given as a path, or as a bare name found in the packaged ``configs/`` folder."""
    p = Path(name_or_path)
    if p.exists():
        return p
    base = CONFIG_DIR / subdir if subdir else CONFIG_DIR
    for cand in (base / p, base / f"{p}.yaml", base / p.name, base / f"{p.name}.yaml"):
        if cand.exists():
            return cand
    known = sorted(x.stem for x in base.glob("*.yaml"))
    raise ConfigError(f"config {str(name_or_path)!r} not found; packaged {subdir or 'configs'}: {known}")


def load_yaml(path: str | Path, subdir: str = "") -> dict[str, Any]:
    p = resolve_config_path(path, subdir)
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: invalid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: top level must be a mapping")
    return data


def load_config(path: str | Path | None = None) -> RouterConfig:
    """Load ``configs/thunder.yaml`` (or the given file) into a RouterConfig."""
    if path is None:
        return RouterConfig()
    return from_dict(RouterConfig, load_yaml(path), "")
