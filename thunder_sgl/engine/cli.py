"""``thunder-sgl engine``: prepare the SGLang venv and models, serve real CPU engines.

    thunder-sgl engine prepare [--model small,tiny] [--seed 0] [--reinstall] [--venv DIR]
    thunder-sgl engine serve --workers 2 [--max-total-tokens 24576] [--ready-file F]
    thunder-sgl engine serve --workers N --hicache-ratio R [--hicache-write-policy write_through|write_back]
                             [--hicache-storage DIR]
    thunder-sgl engine status
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from thunder_sgl.engine.env import EngineEnv, EngineEnvError
from thunder_sgl.engine.models import DEFAULT_SIZE, MODEL_SIZES
from thunder_sgl.engine.serve import (
    CPU_HICACHE_DIR,
    DEFAULT_MAX_TOTAL_TOKENS,
    WRITE_POLICIES,
    EngineOptions,
    HiCacheOptions,
    HiCachePatchError,
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
    sv.add_argument("--hicache-ratio", type=float, default=None,
                    help="turn on SGLang's real HiCache: a host tier of R x the KV pool (R > 1), with the CPU patches")
    sv.add_argument("--hicache-write-policy", choices=WRITE_POLICIES, default="write_through",
                    help="HiCache write policy (default write_through; needs --hicache-ratio)")
    sv.add_argument("--hicache-storage", type=Path, default=None, metavar="DIR",
                    help="add HiCache's file storage tier under DIR (worker-<i>/ each; needs --hicache-ratio)")
    sub.add_parser("status", help="say whether the venv works, which models are built, whether the HiCache CPU patches apply")


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
    hicache = None
    if args.hicache_ratio is None:
        if args.hicache_storage is not None or args.hicache_write_policy != "write_through":
            print("thunder-sgl engine serve: --hicache-write-policy and --hicache-storage need --hicache-ratio",
                  file=sys.stderr)
            return 2
    else:
        try:
            hicache = HiCacheOptions(args.hicache_ratio, args.hicache_write_policy,
                                     args.hicache_storage.resolve() if args.hicache_storage else None)
        except ValueError as e:
            print(f"thunder-sgl engine serve: {e}", file=sys.stderr)
            return 2
    env.require()
    opts = EngineOptions(model=env.model(args.model, args.seed), max_total_tokens=args.max_total_tokens,
                         session_radix_cache=not args.no_session_radix_cache, dtype=args.dtype,
                         threads=args.threads, extra=tuple(args.engine_arg), hicache=hicache)
    tiers = ""
    if hicache is not None:
        tiers = (f"; HiCache host tier {hicache.ratio:g}x ({hicache.write_policy})"
                 + (f", file storage under {hicache.storage_dir}" if hicache.storage_dir else ""))
    print(f"thunder_sgl.engine: starting {args.workers} SGLang server(s), model {opts.model.name}, "
          f"KV pool {opts.max_total_tokens} tokens each{tiers} (about 20 s)", flush=True)
    t0 = time.monotonic()
    try:
        cluster = start_engines(args.workers, opts, env, args.log_dir, args.host)
    except HiCachePatchError as e:
        print(f"thunder-sgl engine serve: {e}", file=sys.stderr)
        return 1
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
        return 1
    ok, detail = hicache_patches_apply(env)
    print(f"hicache cpu patches: {detail}" + ("" if ok else " (thunder-sgl engine serve --hicache-ratio will refuse to start)"))
    return 0


def hicache_patches_apply(env: EngineEnv) -> tuple[bool, str]:
    """Run ``thunder_cpu_hicache.py --check`` in the SGLang venv: (applies, its last line)."""
    try:
        r = subprocess.run([str(env.python), str(CPU_HICACHE_DIR / "thunder_cpu_hicache.py"), "--check"],
                           capture_output=True, text=True, timeout=300, cwd=str(CPU_HICACHE_DIR),
                           env={**os.environ, "PYTHONPATH": str(CPU_HICACHE_DIR)})
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"the check did not run: {e}"
    lines = [ln.removeprefix("thunder_sgl.cpu_hicache: ") for ln in r.stderr.splitlines()
             if ln.startswith("thunder_sgl.cpu_hicache:")]
    return r.returncode == 0, (lines[-1] if lines else (r.stderr.strip().splitlines() or ["no output"])[-1])
