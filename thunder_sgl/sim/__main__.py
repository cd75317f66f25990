"""``python -m thunder_sgl.sim``: serve simulated SGLang workers over HTTP.

    python -m thunder_sgl.sim --config glm46-fp8-h100x8 --port 30000
    python -m thunder_sgl.sim --config glm46-fp8-h100x8 --workers 4 --base-port 31000 --time-scale 20
    python -m thunder_sgl.sim --config tiny --port 0 --ready-file /tmp/sim.json

Once every worker listens, prints one line per worker, ``thunder_sgl.sim: worker I ready at
http://HOST:PORT``, and writes ``{"urls": [...]}`` to ``--ready-file`` if given. All workers of
one process share one virtual clock. SIGINT / SIGTERM shut down cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from thunder_sgl.errors import ConfigError
from thunder_sgl.sim.clock import ScaledClock
from thunder_sgl.sim.config import load_sim_config
from thunder_sgl.sim.server import start_workers, stop_workers


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m thunder_sgl.sim", description="Simulated SGLang workers.")
    p.add_argument("--config", default="tiny", help="config name in configs/sim/ or a YAML path")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=None, help="port of a single worker (0: pick a free one)")
    p.add_argument("--workers", type=int, default=1, help="number of workers in this process")
    p.add_argument("--base-port", type=int, default=None, help="worker i listens on base-port + i (0: free ports)")
    p.add_argument("--time-scale", type=float, default=1.0, help="virtual seconds per real second")
    p.add_argument("--seed", type=int, default=None, help="override the config's seed")
    p.add_argument("--ready-file", type=Path, default=None, help='write {"urls": [...]} here once listening')
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    return p


async def run(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    overrides = {"seed": args.seed} if args.seed is not None else None
    cfg = load_sim_config(args.config, overrides)
    base = args.base_port if args.base_port is not None else (args.port if args.port is not None else 30000)
    workers = await start_workers(cfg, args.workers, args.host, base, ScaledClock(args.time_scale))
    urls = [w.url for w in workers]
    if args.ready_file is not None:  # before the ready lines: whoever reads them may read the file
        tmp = args.ready_file.with_suffix(args.ready_file.suffix + ".tmp")
        tmp.write_text(json.dumps({"urls": urls, "config": cfg.name, "time_scale": args.time_scale}))
        os.replace(tmp, args.ready_file)
    for i, url in enumerate(urls):
        print(f"thunder_sgl.sim: worker {i} ready at {url}", flush=True)
    try:
        await stop.wait()
    finally:
        await stop_workers(workers)
    return 0


def _run_loop(coro: Coroutine[Any, Any, int]) -> int:
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run(coro)
    return uvloop.run(coro)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.workers < 1 or args.time_scale <= 0:
        print("error: --workers must be >= 1 and --time-scale > 0", file=sys.stderr)
        return 2
    try:
        return _run_loop(run(args))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
