"""The policy comparison harness behind ``thunder-sgl bench``: every router × every concurrency,
side by side on the same cluster and the same seeded workload, into one results directory.

    thunder-sgl bench --cluster glm46-fp8-h100x8 --nodes 1 --programs 70,140,210 \\
        --routers thunder,thunder-paper,sglang-cache_aware,sglang-round_robin,smg-cache_aware \\
        --duration 900 --warmup 300 --time-scale 10 --seed 1 --mode http --name glm46-1n

Modes:
- ``http``: real processes on this machine (``drivers.http_mode``): the simulated cluster starts once;
  before each run it is made idle and flushed, the router under test starts in front of it and
  the closed-loop driver runs against the router. Times are simulated: ``--duration`` and
  ``--warmup`` are simulated seconds, wall time is their sum / ``--time-scale``.
- ``des``: the discrete-event simulation (``des.run.run_des``), same routers, same measures, no
  processes and no wall-clock limit on the simulated time.
- ``real``: HTTP mode on real SGLang CPU servers (``drivers.real_mode``): ``--nodes`` engines of
  ``--model`` with a ``--max-total-tokens`` pool each; times are wall seconds (time scale 1).
  The router ``direct`` (no router: each client slot straight to one engine) is the
  request-level baseline; it runs in the other modes too.

Traces (``--trace FILE``, ``workloads.trace``, ``des.trace``): a request trace in the Mooncake
FAST'25 format replayed open-loop, ``--trace-speed`` times its rate, one program per
conversation inferred from the block hash ids (DES: ``des.trace``; HTTP and real mode:
``drivers.trace_loop``, text prompts on ``/v1/completions``); ``--duration`` defaults to the
trace's span.

Rollouts (``--rollout sync|async``, ``rollout.spec``): RL rollouts of tasks × samples (groups)
in batches or waves with weight updates on a timer; DES mode only (``rollout.des``; HTTP and
real mode have no rollout driver). Per batch: makespan, steps/min, completion, group spread, requests lost.

A router that fails to start or a run that errors is recorded (``errors["run_failed"]`` and a
note) and the sweep goes on; results are rewritten after every run, so an interrupted sweep
(Ctrl-C stops every process) still leaves its finished runs in ``results.json``.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from thunder_sgl import __version__
from thunder_sgl.benchmark.measures.ideal import ideal_steps_per_min as physical_bound
from thunder_sgl.benchmark.reports.progress import LiveProgress, Progress
from thunder_sgl.benchmark.reports.results import ALL_ROUTERS, ROUTERS, THUNDER_INFERRED, RunResult
from thunder_sgl.benchmark.reports.sweep import FAILED, load_meta, load_results, write_report
from thunder_sgl.benchmark.rollout.spec import RolloutSpec
from thunder_sgl.benchmark.workloads.profile import WorkloadProfile, load_profile

if TYPE_CHECKING:
    from thunder_sgl.benchmark.drivers.http_mode import HttpCluster
    from thunder_sgl.benchmark.drivers.real_mode import RealCluster
    from thunder_sgl.config import RouterConfig

MODES = ("http", "des", "real")
REAL_ROUTERS = ("direct", "sglang-cache_aware", "smg-cache_aware", "thunder", "thunder-paper")
"""Default routers of a real-mode sweep."""


@dataclass(frozen=True)
class BenchSpec:
    """One sweep. Times are simulated seconds."""

    cluster: str = "glm46-fp8-h100x8"
    """Simulator config of every node: a name in ``configs/sim/`` or a YAML path."""
    nodes: int = 1
    """Simulated workers (nodes)."""
    programs: tuple[int, ...] = (24, 48, 96)
    """Concurrencies N (closed loop: N programs in flight at all times)."""
    profile: str = "mini-swe-agent"
    """Workload profile: a name in ``configs/workloads/`` or a YAML path."""
    routers: tuple[str, ...] = ROUTERS
    """Routers under test, run in this order (see ``reports.results.ROUTERS``)."""
    duration_s: float = 600.0
    """Measured window, after the warm-up."""
    warmup_s: float = 120.0
    """Start of each run excluded from the measures (caches fill, contexts grow)."""
    warm_start: bool = False
    """Start each slot's first program mid-life (``workloads.profile.warm_start``), so a short
    warm-up reaches the steady state (closed loop only)."""
    time_scale: float = 20.0
    """HTTP mode: simulated seconds per wall second (simulator, router and driver agree)."""
    seed: int = 1
    """Names the program sequence; the same for every router."""
    mode: str = "http"
    """``http`` (real processes) or ``des`` (discrete-event, in process)."""
    name: str = ""
    """Results directory name under ``out``; default derived from the other fields."""
    out: Path = Path("bench/results")
    sample_every_s: float = 5.0
    """Per-node memory sampling interval."""
    router_args: tuple[tuple[str, str], ...] = ()
    """Extra command-line arguments per router, ``(("thunder", "--thunder-lambda-max 0.9"), …)``
    (shell-quoted); recorded in the results' meta. HTTP and real modes pass them to the router's
    process; DES mode builds a thunder router's config from them (``launch_router.thunder_config``:
    ``--thunder-*`` options only, and no stock router takes any)."""
    model: str = "small"
    """Real mode: the engines' model size (``thunder-sgl engine prepare --model``)."""
    max_total_tokens: int = 24576
    """Real mode: KV pool of each engine in tokens."""
    engine_threads: int | None = None
    """Real mode: torch threads of each engine (None: all cores)."""
    hicache_ratio: float | None = None
    """Real mode: SGLang's real HiCache host tier of this many × the KV pool on every engine
    (``engine serve --hicache-ratio``); None: off."""
    hicache_write_policy: str = "write_through"
    """Real mode with HiCache: its write policy."""
    hicache_storage: bool = False
    """Real mode with HiCache: the file storage tier too, in an empty directory for every run
    (storage outlives ``/flush_cache`` and restarts, so each run starts its engines afresh)."""
    rollout: RolloutSpec | None = None
    """An RL rollout instead of the closed loop (``rollout.spec``). Sync: ``programs`` is the
    batch (tasks × group size), ``duration_s`` a cap on the simulated time, no warm-up."""
    trace: str = ""
    """A request trace to replay instead of the closed loop (``workloads.trace``, the Mooncake
    FAST'25 format): its arrivals in [0, warm-up + duration] trace seconds."""
    trace_speed: float = 1.0
    """Trace timestamps are divided by this (2: twice the request rate)."""
    trace_limit: int | None = None
    """Replay only the trace's first this many requests."""
    trace_token_scale: int = 1
    """Divide every request's input and output length (and the 512-token block) by this, a
    divisor of 512: the trace's sharing on a small engine (real mode)."""
    trace_drain_s: float = 600.0
    """Trace seconds the run goes on after the last arrival, for the window's requests to be
    answered (their TTFT and latency); rates stay over the window."""
    ttft_slo_s: float = 5.0
    """Trace replays: the TTFT objective of the SLO attainment."""

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; valid: {', '.join(MODES)}")
        unknown = [r for r in self.routers if r not in ALL_ROUTERS]
        if unknown:
            raise ValueError(f"unknown router(s) {', '.join(unknown)}; valid: {', '.join(ALL_ROUTERS)}")
        if not self.routers or not self.programs or min(self.programs) < 1:
            raise ValueError("need at least one router and concurrencies >= 1")
        if any(r not in self.routers for r, _ in self.router_args):
            raise ValueError("router_args names a router that is not in the sweep")
        if self.mode == "des":
            for r in {r for r, _ in self.router_args}:
                if not r.startswith("thunder"):
                    raise ValueError(f"DES mode: {r} is simulated in process and takes no router arguments")
                self.des_router_config(r)  # a bad option fails here, before any run
        if self.nodes < 1 or self.duration_s <= 0 or self.warmup_s < 0 or self.time_scale <= 0:
            raise ValueError("need nodes >= 1, duration > 0, warmup >= 0, time scale > 0")
        if self.mode == "des" and THUNDER_INFERRED in self.routers and (self.trace or self.rollout is not None):
            raise ValueError(f"{THUNDER_INFERRED} in DES mode is for agent loops: a trace's turns or a rollout's "
                             "samples are not inferred there (run the trace in http or real mode)")
        if self.mode == "real" and self.time_scale != 1.0:
            raise ValueError("real mode runs in real time: --time-scale must be 1")
        if self.hicache_ratio is not None and (self.mode != "real" or not self.hicache_ratio > 1.0):
            raise ValueError("--hicache-ratio is for real mode (simulated clusters name a -hicache config) and must be > 1")
        if self.hicache_storage and self.hicache_ratio is None:
            raise ValueError("--hicache-storage needs --hicache-ratio (the storage tier sits under the host tier)")
        if self.trace and (self.rollout is not None or self.warm_start):
            raise ValueError("--trace replays a trace: no --rollout, no --warm-start")
        if self.trace and (self.trace_speed <= 0 or self.trace_drain_s < 0 or self.trace_token_scale < 1
                           or 512 % self.trace_token_scale):
            raise ValueError("need --trace-speed > 0, --trace-drain >= 0 and a --trace-token-scale dividing 512")
        if self.warm_start and self.rollout is not None:
            raise ValueError("--warm-start is for the closed loop, not a rollout")
        if self.rollout is not None and self.rollout.mode == "sync" and (
                self.programs != (self.rollout.batch_programs,) or self.warmup_s):
            raise ValueError("a sync rollout runs batches of tasks x group size programs from t = 0: "
                             "programs must be that one number and warm-up 0")

    @property
    def cluster_name(self) -> str:
        if self.mode == "real":
            from thunder_sgl.benchmark.drivers.real_mode import cluster_name

            return cluster_name(self.model, self.hicache_ratio)
        return Path(self.cluster).stem if self.cluster.endswith((".yaml", ".yml")) else self.cluster

    @property
    def bound_config(self) -> str:
        """The simulator config the §10 bound is computed with (real mode: the one calibrated
        against these engines, ``configs/sim/sglang-cpu-gpt2-<model>.yaml``, or its ``-t1`` variant
        when every engine runs one torch thread, if it exists)."""
        if self.mode != "real":
            return self.cluster
        from thunder_sgl.benchmark.drivers.real_mode import cluster_name

        base = cluster_name(self.model)  # with HiCache too: the bound is then the device pool's
        if self.engine_threads == 1:
            from thunder_sgl.config import ConfigError, resolve_config_path

            try:
                return str(resolve_config_path(f"{base}-t1", "sim").stem)
            except ConfigError:  # no 1-thread config: the default one
                pass
        return base

    @property
    def results_name(self) -> str:
        kind = f"rollout-{self.rollout.mode}-" if self.rollout is not None else ""
        what = (f"trace-{Path(self.trace).stem}-x{self.trace_speed:g}"
                + (f"-t{self.trace_token_scale}" if self.trace_token_scale > 1 else "")) if self.trace \
            else Path(self.profile).stem
        return self.name or f"{kind}{what}-{self.cluster_name}-{self.nodes}n-{self.mode}"

    @property
    def results_dir(self) -> Path:
        return Path(self.out) / self.results_name

    def args_of(self, router: str) -> tuple[str, ...]:
        return tuple(a for r, text in self.router_args if r == router for a in shlex.split(text))

    def des_router_config(self, router: str) -> RouterConfig | None:
        """DES mode: the config of a thunder router given router arguments (None: the defaults)."""
        args = self.args_of(router)
        if not args:
            return None
        from thunder_sgl.launch_router import thunder_config

        return thunder_config(args)

    def wall_estimate_s(self) -> float:
        """HTTP mode: wall seconds of the measured parts (start-up and cleaning not counted)."""
        runs = len(self.routers) * len(self.programs)
        return runs * (self.warmup_s + self.duration_s) / self.time_scale


def ideal_steps_per_min(spec: BenchSpec, profile: WorkloadProfile, programs: int) -> float:
    """The §10 bound from ``measures/ideal.py`` (0 when it cannot be computed)."""
    try:
        return float(physical_bound(spec.bound_config, spec.nodes, profile, programs))
    except Exception:  # noqa: BLE001 - a missing bound must not stop a sweep
        return 0.0


def run_bench(spec: BenchSpec, command: str = "", progress: Progress | None = None,
              on_result: Callable[[RunResult], None] | None = None) -> list[RunResult]:
    """Run the sweep and write its report; returns the results in run order."""
    out = spec.results_dir
    out.mkdir(parents=True, exist_ok=True)
    if command:
        (out / "command.txt").write_text(command + "\n")
    profile = load_profile(spec.profile)
    meta = _meta(spec, command)
    progress = progress or LiveProgress(f"thunder-sgl bench {spec.results_name}")
    plan = [(r, n) for r in spec.routers for n in spec.programs]
    ideal = {n: 0.0 if spec.trace else ideal_steps_per_min(spec, profile, n) for n in spec.programs}
    results: list[RunResult] = []
    runner = _HttpRunner(spec, profile, out) if spec.mode in ("http", "real") else None
    try:
        with progress:
            progress.plan(plan)
            if runner is not None:
                progress.message(f"{spec.mode.upper()} mode: {spec.nodes} × {spec.cluster_name}, {len(plan)} runs, "
                                 f"≈ {spec.wall_estimate_s() / 60:.0f} min of measured wall time "
                                 f"at time scale {spec.time_scale:g}")
            for router, n in plan:
                if runner is not None:
                    r = runner.run(router, n, ideal[n], progress)
                else:
                    r = _des_run(spec, profile, router, n, ideal[n], progress)
                results.append(r)
                if on_result is not None:
                    on_result(r)
                meta["ended"] = time.strftime("%Y-%m-%d %H:%M:%S")
                write_report(results, out, meta, plots=False)
    except KeyboardInterrupt:
        meta["interrupted"] = True
        raise
    finally:
        if runner is not None:
            runner.close()
        if results:
            write_report(results, out, meta)
    return results


def report_only(directory: str | Path) -> list[Path]:
    """Rebuild every report file of a results directory from its ``results.json``."""
    d = Path(directory)
    return write_report(load_results(d), d, load_meta(d))


class _HttpRunner:
    def __init__(self, spec: BenchSpec, profile: WorkloadProfile, out: Path) -> None:
        from thunder_sgl.benchmark.drivers.http_mode import HttpCluster

        self.spec, self.profile, self.out = spec, profile, out
        self.tmp = Path(tempfile.mkdtemp(prefix="thunder-bench-"))
        self.cluster: HttpCluster | RealCluster
        if spec.mode == "real":
            from thunder_sgl.benchmark.drivers.real_mode import RealCluster
            from thunder_sgl.engine.serve import HiCacheOptions

            hicache = None
            if spec.hicache_ratio:
                hicache = HiCacheOptions(spec.hicache_ratio, spec.hicache_write_policy,
                                         self.tmp / "hicache-storage" if spec.hicache_storage else None)
            self.cluster = RealCluster(spec.nodes, spec.model, spec.max_total_tokens, self.tmp,
                                       threads=spec.engine_threads, hicache=hicache)
        else:
            self.cluster = HttpCluster(spec.cluster, spec.nodes, spec.time_scale, spec.seed, self.tmp)
        self.trace = None
        if spec.trace:
            from thunder_sgl.benchmark.drivers.http_mode import TraceReplay
            from thunder_sgl.benchmark.workloads.trace import (
                conversations,
                load_trace,
                summary,
                trace_name,
            )

            reqs = load_trace(spec.trace, spec.trace_speed, spec.trace_limit, until_s=spec.warmup_s + spec.duration_s,
                              token_scale=spec.trace_token_scale)
            convs = conversations(reqs)
            self.trace = TraceReplay(trace_name(spec.trace), reqs, convs, spec.trace_drain_s, spec.ttft_slo_s,
                                     spec.trace_speed, "words" if spec.mode == "real" else "sim")
            self.trace_summary = {f"trace_{k}": v for k, v in summary(reqs, convs).items()}
        self.timing_config = ""
        if spec.mode == "real":
            from thunder_sgl.config import ConfigError, resolve_config_path

            try:
                self.timing_config = resolve_config_path(spec.bound_config, "sim").stem
            except ConfigError:  # no simulator config calibrated against this model
                pass

    def run(self, router: str, programs: int, ideal: float, progress: Progress) -> RunResult:
        from thunder_sgl.benchmark.drivers.http_mode import RunPlan, http_run

        s = self.spec
        plan = RunPlan(router, programs, self.profile, s.warmup_s, s.duration_s, s.time_scale, s.seed,
                       s.sample_every_s, s.args_of(router),
                       {"cluster": s.cluster_name, "nodes": s.nodes, "ideal_steps_per_min": ideal},
                       timing_config=self.timing_config, warm_start=s.warm_start, trace=self.trace)
        r = http_run(self.cluster, plan, progress, self.out / "logs")
        if self.trace is not None:
            r.programs = len(self.trace.convs)
            r.trace.update(self.trace_summary)
        r.mode = s.mode
        progress.end_run(r)
        return r

    def close(self) -> None:
        self.cluster.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)


def _des_run(spec: BenchSpec, profile: WorkloadProfile, router: str, programs: int, ideal: float,
             progress: Progress) -> RunResult:
    progress.start_run(router, programs, spec.warmup_s + spec.duration_s, spec.warmup_s, 0.0)
    progress.status("running")
    t0 = time.monotonic()
    try:
        from thunder_sgl.benchmark.des.run import run_des

        if spec.trace:
            from thunder_sgl.benchmark.des.trace import TraceRun

            r = TraceRun(spec.cluster, spec.nodes, router, spec.trace, spec.duration_s, warmup_s=spec.warmup_s,
                         seed=spec.seed, speed=spec.trace_speed, limit=spec.trace_limit,
                         drain_s=spec.trace_drain_s, profile=spec.profile, ttft_slo_s=spec.ttft_slo_s,
                         token_scale=spec.trace_token_scale, router_config=spec.des_router_config(router),
                         sample_every_s=spec.sample_every_s, progress=_des_progress(progress)).run()
        elif spec.rollout is not None:
            from thunder_sgl.benchmark.rollout.des import RolloutRun

            r = RolloutRun(spec.cluster, spec.nodes, router, profile, programs, spec.duration_s,
                           warmup_s=spec.warmup_s, seed=spec.seed, router_config=spec.des_router_config(router),
                           sample_every_s=spec.sample_every_s, progress=_des_progress(progress),
                           rollout=spec.rollout).run()
        else:
            r = run_des(spec.cluster, spec.nodes, router, profile, programs, spec.duration_s,
                        warmup_s=spec.warmup_s, seed=spec.seed, router_config=spec.des_router_config(router),
                        sample_every_s=spec.sample_every_s, progress=_des_progress(progress),
                        warm_start=spec.warm_start)
        r.cluster = spec.cluster_name
        if not r.ideal_steps_per_min:
            r.ideal_steps_per_min = ideal
    except Exception as e:  # noqa: BLE001 - a failed run is a result
        r = RunResult(router=router, mode="des", programs=programs, nodes=spec.nodes,
                      cluster=spec.cluster_name, profile=profile.name, seed=spec.seed,
                      window_s=spec.duration_s, steps_per_min=0.0, kv_hit_rate=0.0,
                      ideal_steps_per_min=ideal, errors={FAILED: 1},
                      notes=f"{type(e).__name__}: {e}"[:300])
    if not r.wall_s:
        r.wall_s = time.monotonic() - t0
    progress.end_run(r)
    return r


def _des_progress(progress: Progress) -> Callable[[float, dict[str, Any]], None]:
    def update(sim_s: float, snapshot: dict[str, Any]) -> None:
        progress.des_update(sim_s, snapshot)
    return update


def _meta(spec: BenchSpec, command: str) -> dict[str, Any]:
    d = dataclasses.asdict(spec)
    d["out"] = str(spec.out)
    return {
        "name": spec.results_name, "command": command, "spec": d, "warmup_s": spec.warmup_s,
        "thunder_sgl": __version__, "host": platform.node(), "cpus": os.cpu_count(),
        "python": platform.python_version(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
