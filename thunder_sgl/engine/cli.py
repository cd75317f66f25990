"""``thunder-sgl engine``: prepare the SGLang venv and models, serve real CPU engines.

    thunder-sgl engine prepare [--model small,tiny] [--seed 0] [--reinstall] [--venv DIR]
    thunder-sgl engine serve --workers 2 [--max-total-tokens 24576] [--ready-file F]
    thunder-sgl engine status
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from thunder_sgl.engine.env import EngineEnv, EngineEnvError
from thunder_sgl.engine.models import DEFAULT_SIZE, MODEL_SIZES
from thunder_sgl.engine.serve import (
    DEFAULT_MAX_TOTAL_TOKENS,
    EngineOptions,
    start_engines,
    write_ready_file,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--home", type=Path, default=None,
                   help="engine home (default $THUNDER_SGL_ENGINE_HOME or ~/.cache/thunder-sgl)")
    p.add_argument("--venv", type=Path, default=None,
                   help="the SGLang venv (default <home>/sglang-venv, or $THUNDER_SGLANG_VENV)")
    sub = p.add_subparsers(dest="engine_command", metavar="ACTION")
    pr = sub.add_parser("prepare", help="create the SGLang venv (minutes, ~11 GB) and build models; idempotent")
    pr.add_argument("--model", default=DEFAULT_SIZE,
                    help=f"model sizes to build, comma-separated: {', '.join(MODEL_SIZES)} (default {DEFAULT_SIZE})")
    pr.add_argument("--seed", type=int, default=0, help="seed of the weights (the tokenizer is fixed)")
    pr.add_argument("--reinstall", action="store_true", help="remove and rebuild the venv")
    sv = sub.add_parser("serve", help="start N real SGLang CPU servers on free ports; Ctrl-C stops them")
    sv.add_argument("--workers", type=int, default=1)
    sv.add_argument("--max-total-tokens", type=int, default=DEFAULT_MAX_TOTAL_TOKENS, help="KV pool of each server, tokens")
    sv.add_argument("--model", default=DEFAULT_SIZE, help="a size built by prepare, or a model directory")
    sv.add_argument("--seed", type=int, default=0)
    sv.add_argument("--host", default="127.0.0.1")
    sv.add_argument("--ready-file", type=Path, default=None, help='write {"urls": [...]} here once all answer')
    sv.add_argument("--log-dir", type=Path, default=None, help="server logs (default: a temporary directory)")
    sv.add_argument("--no-session-radix-cache", action="store_true",
                    help="start without --enable-session-radix-cache (plain LRU eviction)")
    sv.add_argument("--dtype", default=None, help="--dtype of the servers (e.g. bfloat16)")
    sv.add_argument("--threads", type=int, default=None, help="torch threads per server (default: all cores)")
    sv.add_argument("--engine-arg", action="append", default=[], help="one more sglang.launch_server argument (repeatable)")
    sub.add_parser("status", help="say whether the venv works and which models are built")


def run(args: argparse.Namespace) -> int:
    env = EngineEnv.locate(args.home, args.venv)
    cmd = args.engine_command
    try:
        if cmd == "prepare":
            sizes = tuple(s.strip() for s in args.model.split(",") if s.strip())
            bad = [s for s in sizes if s not in MODEL_SIZES]
            if bad:
                print(f"thunder-sgl engine: unknown model size(s) {', '.join(bad)}; valid: {', '.join(MODEL_SIZES)}",
                      file=sys.stderr)
                return 2
            env.prepare(sizes, args.seed, reinstall=args.reinstall, say=lambda m: print(m, flush=True))
            return 0
        if cmd == "serve":
            return _serve(env, args)
        if cmd == "status":
            return _status(env)
    except EngineEnvError as e:
        print(f"thunder-sgl engine: {e}", file=sys.stderr)
        return 1
    print("thunder-sgl engine: give an action: prepare, serve or status", file=sys.stderr)
    return 2


def _serve(env: EngineEnv, args: argparse.Namespace) -> int:
    if args.workers < 1 or args.max_total_tokens < 256:
        print("thunder-sgl engine serve: need --workers >= 1 and --max-total-tokens >= 256", file=sys.stderr)
        return 2
    env.require()
    opts = EngineOptions(model=env.model(args.model, args.seed), max_total_tokens=args.max_total_tokens,
                         session_radix_cache=not args.no_session_radix_cache, dtype=args.dtype,
                         threads=args.threads, extra=tuple(args.engine_arg))
    print(f"thunder_sgl.engine: starting {args.workers} SGLang server(s), model {opts.model.name}, "
          f"KV pool {opts.max_total_tokens} tokens each (about 20 s)", flush=True)
    t0 = time.monotonic()
    cluster = start_engines(args.workers, opts, env, args.log_dir, args.host)
    stop = {"now": False}

    def _stop(signum: int, frame: object) -> None:
        stop["now"] = True

    old = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        if args.ready_file is not None:
            write_ready_file(args.ready_file, cluster.urls, {"model": str(opts.model),
                                                             "max_total_tokens": opts.max_total_tokens})
        for i, url in enumerate(cluster.urls):
            print(f"thunder_sgl.engine: worker {i} ready at {url}", flush=True)
        print(f"thunder_sgl.engine: {args.workers} ready in {time.monotonic() - t0:.0f} s; logs in {cluster.log_dir}; "
              "Ctrl-C stops them", flush=True)
        while not stop["now"]:
            if not cluster.alive():
                dead = [p for p in cluster.procs if not p.alive()]
                print(f"thunder_sgl.engine: {', '.join(p.name for p in dead)} exited; stopping the others\n"
                      f"{dead[0].log_tail(20)}", file=sys.stderr)
                return 1
            time.sleep(0.5)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        cluster.stop()
        print("thunder_sgl.engine: stopped", flush=True)
    return 0


def _status(env: EngineEnv) -> int:
    why = env.check()
    print(f"venv: {env.venv}: {'ok' if why is None else why}")
    built = sorted(d.name for d in env.models_root.glob("gpt2-*") if (d / "thunder-model.json").exists()) \
        if env.models_root.exists() else []
    print(f"models: {env.models_root}: {', '.join(built) or 'none built'}")
    if why is not None:
        print("run: thunder-sgl engine prepare")
    return 0 if why is None else 1
