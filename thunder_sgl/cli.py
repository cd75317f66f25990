"""``thunder-sgl``: the project's command line.

    thunder-sgl demo [--minutes 3]            thunder vs stock sglang_router on a simulated cluster
    thunder-sgl bench --cluster … --mode http  the policy comparison harness (benchmark/harness.py)
    thunder-sgl bench --report-only DIR        rebuild a results directory's tables and plots
    thunder-sgl soak --minutes 30              overload + scheduled faults: losses, leaks, RSS
    thunder-sgl engine prepare | serve         real SGLang CPU engines (a venv of their own)
    thunder-sgl sim …                          simulated SGLang workers (python -m thunder_sgl.sim)
    thunder-sgl router …                       the router (thunder-router, a drop-in for sglang_router)

A subcommand is one entry of ``COMMANDS`` (own arguments) or of ``PASSTHROUGH`` (the argv goes
unchanged to another entry point); adding one is a few lines.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thunder_sgl import __version__


@dataclass(frozen=True)
class Command:
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, list[str]], int]
    """Called with the parsed arguments and the subcommand's raw argv (for command.txt)."""
    own_signals: bool = False
    """The command handles SIGINT and SIGTERM itself (``engine serve``); the others run inside
    ``children.stop_children_on_signals``: a signal stops every process they started at once."""


def _sim_main(argv: list[str]) -> int:
    from thunder_sgl.sim.__main__ import main

    return main(argv)


def _router_main(argv: list[str]) -> int:
    from thunder_sgl.launch_router import main

    main(argv)
    return 0


PASSTHROUGH: dict[str, tuple[str, Callable[[list[str]], int]]] = {
    "sim": ("simulated SGLang workers (arguments of python -m thunder_sgl.sim)", _sim_main),
    "router": ("the router (arguments of thunder-router / python -m sglang_router.launch_router)", _router_main),
}


# ---------------------------------------------------------------- bench


def _csv(kind: Callable[[str], Any]) -> Callable[[str], tuple[Any, ...]]:
    def parse(text: str) -> tuple[Any, ...]:
        try:
            return tuple(kind(x.strip()) for x in text.split(",") if x.strip())
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return parse


def _bench_args(p: argparse.ArgumentParser) -> None:
    from thunder_sgl.benchmark.harness import MODES, REAL_ROUTERS, BenchSpec
    from thunder_sgl.benchmark.reports.results import ROUTERS

    d = BenchSpec()
    p.add_argument("--cluster", default=d.cluster, help="simulator config of each node: a name in configs/sim/ or a YAML path")
    p.add_argument("--nodes", type=int, default=d.nodes, help="simulated nodes (workers)")
    p.add_argument("--programs", type=_csv(int), default=d.programs, help="concurrencies N, comma-separated (default: 24,48,96)")
    p.add_argument("--profile", default=d.profile, help="workload profile: a name in configs/workloads/ or a YAML path")
    p.add_argument("--routers", default=None,
                   help=f"routers, comma-separated, run in this order (default: {','.join(ROUTERS)}; "
                        f"real mode: {','.join(REAL_ROUTERS)}; also: direct)")
    p.add_argument("--duration", type=float, default=None,
                   help=f"measured window per run, simulated seconds (default {d.duration_s:g}; with --trace: "
                        "the trace's span after the warm-up)")
    p.add_argument("--warmup", type=float, default=None,
                   help=f"warm-up per run, simulated seconds (not measured; default {d.warmup_s:g}, with --trace 0)")
    p.add_argument("--warm-start", action="store_true",
                   help="start each program slot's first program mid-life (a uniform step, its history in the first "
                        "request), so the loop begins near its steady state: a short --warmup then suffices")
    p.add_argument("--time-scale", type=float, default=d.time_scale, help="http mode: simulated seconds per wall second")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--mode", choices=MODES, default=d.mode,
                   help="http: real processes on simulated workers; des: discrete-event, in process; "
                        "real: real SGLang CPU engines (thunder-sgl engine prepare)")
    p.add_argument("--model", default=d.model, help="real mode: model size of the engines")
    p.add_argument("--max-total-tokens", type=int, default=d.max_total_tokens, help="real mode: KV pool of each engine")
    p.add_argument("--engine-threads", type=int, default=None, help="real mode: torch threads of each engine (default: all cores)")
    p.add_argument("--hicache-ratio", type=float, default=None,
                   help="real mode: SGLang's real HiCache on every engine, host tier R x the KV pool (R > 1)")
    p.add_argument("--hicache-write-policy", choices=("write_through", "write_back"), default="write_through",
                   help="real mode with --hicache-ratio: the write policy")
    p.add_argument("--hicache-storage", action="store_true",
                   help="real mode with --hicache-ratio: SGLang's file storage tier under the host tier, "
                        "empty at every run (the engines restart before each run)")
    p.add_argument("--name", default="", help="results directory name (default: <profile>-<cluster>-<nodes>n-<mode>)")
    p.add_argument("--out", type=Path, default=d.out, help="parent of the results directory")
    p.add_argument("--sample-every", type=float, default=d.sample_every_s, help="per-node memory sampling, simulated seconds")
    p.add_argument("--router-arg", action="append", default=[], metavar="ROUTER=ARGS",
                   help="extra arguments of one router, e.g. thunder='--thunder-lambda-max 0.9' (repeatable); des mode: "
                        "a thunder router's --thunder-* options only")
    g = p.add_argument_group("grid (benchmark/grid.py: one sweep per cell of context share x tool time x output x N)")
    g.add_argument("--grid", nargs="?", const="default", default=None, metavar="CELLS",
                   help="run the workload grid instead of --profile/--programs: all cells in des/http mode, the 12 "
                        "real cells in real mode, or 'all', 'real', or cell names separated by commas "
                        "(ctx20-tool2-out16-x6)")
    g.add_argument("--repeats", type=int, default=2, help="grid: runs of each cell (seeds seed, seed+1, ...)")
    p.add_argument("--report-only", metavar="DIR", type=Path, default=None,
                   help="rebuild results.csv/.md and the plots of DIR from its results.json, run nothing")
    t = p.add_argument_group("trace replay (DES: a Mooncake-format request trace, open loop; benchmark/des/trace.py)")
    t.add_argument("--trace", default="", metavar="FILE",
                   help="replay this JSONL trace ({timestamp ms, input_length, output_length, hash_ids}) "
                        "instead of the closed loop; --programs is ignored")
    t.add_argument("--trace-speed", type=float, default=d.trace_speed, help="divide the timestamps by this")
    t.add_argument("--trace-limit", type=int, default=None, help="replay only the first N requests")
    t.add_argument("--trace-token-scale", type=int, default=1,
                   help="divide input/output lengths and the 512-token block by this (a divisor of 512; "
                        "real mode: the trace on a small engine)")
    t.add_argument("--trace-drain", type=float, default=d.trace_drain_s,
                   help="trace seconds after the last arrival for the window's requests to finish")
    t.add_argument("--ttft-slo", type=float, default=d.ttft_slo_s, help="TTFT objective (s) of the SLO attainment")
    r = p.add_argument_group("rollout (RL: tasks x samples in groups, weight updates on a timer; benchmark/rollout/)")
    r.add_argument("--rollout", choices=("sync", "async"), default=None,
                   help="sync: batches of --tasks x --group-size released at once, the next when the whole batch "
                        "is done (--programs and --warmup are implied, --duration caps the run); async: --programs "
                        "in flight, topped up by whole groups")
    r.add_argument("--tasks", type=int, default=18, help="sync: tasks (groups) per batch")
    r.add_argument("--group-size", type=int, default=8, help="samples per task (G)")
    r.add_argument("--batches", type=int, default=3, help="sync: batches")
    r.add_argument("--update-every", type=float, default=10.0, help="a weight update every this many simulated minutes (0: none)")
    r.add_argument("--update-seconds", type=float, default=30.0, help="simulated seconds one weight update pauses the engines")
    r.add_argument("--update-pause", choices=("retract", "abort", "in_place"), default="retract",
                   help="pause mode of the engines during an update")


def _bench(args: argparse.Namespace, argv: list[str]) -> int:
    from thunder_sgl.benchmark.harness import BenchSpec, report_only, run_bench
    from thunder_sgl.benchmark.reports.sweep import FAILED

    if args.report_only is not None:
        for path in report_only(args.report_only):
            print(path)
        return 0
    from thunder_sgl.benchmark.harness import REAL_ROUTERS
    from thunder_sgl.benchmark.reports.results import ROUTERS

    default = REAL_ROUTERS if args.mode == "real" else ROUTERS
    routers = tuple(r.strip() for r in args.routers.split(",") if r.strip()) if args.routers else default
    if args.mode == "real" and args.time_scale == BenchSpec().time_scale:
        args.time_scale = 1.0
    if args.warmup is None:
        args.warmup = 0.0 if args.trace else BenchSpec().warmup_s
    try:
        rollout = None
        if args.rollout is not None:
            from thunder_sgl.benchmark.rollout.spec import RolloutSpec

            rollout = RolloutSpec(mode=args.rollout, tasks=args.tasks, group_size=args.group_size,
                                  batches=args.batches, update_every_s=60.0 * args.update_every,
                                  update_seconds=args.update_seconds, update_pause=args.update_pause)
            if rollout.mode == "sync":
                args.programs, args.warmup = (rollout.batch_programs,), 0.0
        if args.duration is None:
            args.duration = BenchSpec().duration_s
            if args.trace:
                from thunder_sgl.benchmark.workloads.trace import load_trace

                reqs = load_trace(args.trace, args.trace_speed, args.trace_limit)
                if not reqs:
                    raise ValueError(f"{args.trace}: no requests")
                args.duration = max(1.0, reqs[-1].arrival_s - args.warmup)
        if args.trace:
            args.programs = (1,)
        router_args = tuple(tuple(x.split("=", 1)) for x in args.router_arg)
        if any(len(x) != 2 for x in router_args):
            raise ValueError("--router-arg takes ROUTER=ARGS")
        spec = BenchSpec(cluster=args.cluster, nodes=args.nodes, programs=tuple(args.programs),
                         profile=args.profile, routers=routers, duration_s=args.duration,
                         warmup_s=args.warmup, time_scale=args.time_scale, seed=args.seed,
                         mode=args.mode, name=args.name, out=args.out, sample_every_s=args.sample_every,
                         router_args=router_args, model=args.model,  # type: ignore[arg-type]
                         max_total_tokens=args.max_total_tokens, engine_threads=args.engine_threads,
                         hicache_ratio=args.hicache_ratio, hicache_write_policy=args.hicache_write_policy,
                         hicache_storage=args.hicache_storage,
                         rollout=rollout, warm_start=args.warm_start, trace=args.trace,
                         trace_speed=args.trace_speed, trace_limit=args.trace_limit,
                         trace_drain_s=args.trace_drain, ttft_slo_s=args.ttft_slo,
                         trace_token_scale=args.trace_token_scale)
    except ValueError as e:
        print(f"thunder-sgl bench: {e}", file=sys.stderr)
        return 2
    command = " ".join(["thunder-sgl", "bench", *map(shlex.quote, argv)])
    if args.grid is not None:
        return _grid(args, spec, command)
    results = run_bench(spec, command=command)
    failed = [r for r in results if r.errors.get(FAILED)]
    print(f"results: {spec.results_dir}/results.md ({len(results) - len(failed)} runs ok, {len(failed)} failed)")
    return 1 if failed and len(failed) == len(results) else 0


def _grid(args: argparse.Namespace, spec: Any, command: str) -> int:
    import dataclasses

    from thunder_sgl.benchmark import grid
    from thunder_sgl.benchmark.harness import run_bench
    from thunder_sgl.sim.config import load_sim_config

    try:
        which = args.grid if args.grid != "default" else ("real" if args.mode == "real" else "all")
        cells = grid.parse_cells(which)
        if args.repeats < 1:
            raise ValueError("--repeats must be >= 1")
    except ValueError as e:
        print(f"thunder-sgl bench: {e}", file=sys.stderr)
        return 2
    if not args.routers:
        spec = dataclasses.replace(spec, routers=grid.GRID_ROUTERS)
    if not args.name:
        spec = dataclasses.replace(spec, name=f"grid-{spec.cluster_name}-{spec.nodes}n-{spec.mode}")
    pool = spec.max_total_tokens if args.mode == "real" else load_sim_config(spec.cluster).server.max_total_num_tokens
    root = grid.run_grid(spec, cells, args.repeats, pool, lambda s, c: run_bench(s, command=c), command)
    print(f"grid: {root}/grid.md")
    return 0


# ---------------------------------------------------------------- demo


def _demo_args(p: argparse.ArgumentParser) -> None:
    from thunder_sgl.benchmark.demo import add_arguments

    add_arguments(p)


def _demo(args: argparse.Namespace, argv: list[str]) -> int:
    from thunder_sgl.benchmark.demo import run_demo

    return run_demo(args)


# ---------------------------------------------------------------- soak


def _soak_args(p: argparse.ArgumentParser) -> None:
    from thunder_sgl.benchmark.soak import add_args

    add_args(p)


def _soak(args: argparse.Namespace, argv: list[str]) -> int:
    import asyncio

    from thunder_sgl.benchmark.soak import soak, verdict

    return verdict(asyncio.run(soak(args)))


# ---------------------------------------------------------------- engine


def _engine_args(p: argparse.ArgumentParser) -> None:
    from thunder_sgl.engine.cli import add_arguments

    add_arguments(p)


def _engine(args: argparse.Namespace, argv: list[str]) -> int:
    from thunder_sgl.engine.cli import run

    return run(args)


COMMANDS: dict[str, Command] = {
    "demo": Command("thunder vs stock sglang_router cache_aware on a simulated cluster (a few minutes)",
                    _demo_args, _demo),
    "bench": Command("compare routers on a simulated cluster (http or des mode); writes bench/results/<name>/",
                     _bench_args, _bench),
    "soak": Command("hours at 2x KV overload with faults on a schedule; reports losses, leaks, RSS, max held wait",
                    _soak_args, _soak),
    "engine": Command("real SGLang CPU engines: prepare (venv + model, once) and serve N on free ports",
                      _engine_args, _engine, own_signals=True),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="thunder-sgl", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"thunder-sgl {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, cmd in COMMANDS.items():
        sp = sub.add_parser(name, help=cmd.help, description=cmd.help)
        cmd.add_arguments(sp)
    for name, (text, _) in PASSTHROUGH.items():
        sub.add_parser(name, help=text, add_help=False)
    return p


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in PASSTHROUGH:
        return PASSTHROUGH[argv[0]][1](argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    from thunder_sgl import children

    cmd = COMMANDS[args.command]
    if cmd.own_signals:
        signal.signal(signal.SIGTERM, _interrupt)
        stopping: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    else:  # Ctrl-C or SIGTERM: every process started is stopped within seconds, whatever we are doing
        stopping = children.stop_children_on_signals()
    try:
        with stopping:
            return cmd.run(args, argv[1:])
    except KeyboardInterrupt:
        children.stop_all()
        print("\ninterrupted: every process started was stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
