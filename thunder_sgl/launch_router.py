"""``python -m thunder_sgl.launch_router`` / ``thunder-router``: a drop-in for sglang_router.

Arguments are parsed by sglang_router's own ``RouterArgs.add_cli_args`` (so they cannot
drift), with ``thunder`` added to ``--policy`` and a ``--thunder-*`` group. With any policy
but ``thunder`` the stock router is started with the same arguments (the ``--thunder-*``
ones removed). With ``thunder`` this process serves the thunder gateway.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import socket
import sys
from collections.abc import Sequence
from typing import Any

from sglang_router.router_args import RouterArgs

from thunder_sgl import __version__
from thunder_sgl.config import RouterConfig, load_config, resolve_config_path
from thunder_sgl.errors import ConfigError

THUNDER = "thunder"
SECRET_OPTIONS = ("--api-key", "--thunder-admin-api-key", "--control-plane-api-keys", "--oracle-password")


VARIANTS = {"tier-aware": "thunder", "occupancy": "thunder-occupancy", "fixed": "thunder-fixed", "paper": "thunder-paper"}
"""``--thunder-variant`` → program policy (``scheduler.policies.POLICIES``)."""


def add_thunder_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("Thunder (program-aware policy)", "Used with --policy thunder")
    g.add_argument("--thunder-config", default=None, help="YAML config of the thunder policy (default: the packaged configs/thunder.yaml)")
    g.add_argument("--thunder-variant", default="tier-aware", choices=list(VARIANTS),
                   help="tier-aware (default): HBM + HiCache tiers as one pool, HBM gate for reasoning KV, admission "
                        "from predicted and measured goodput, KV references; occupancy: the same with the previous admission "
                        "rule (a controller on engine occupancy); fixed: the same with the admission fixed at the "
                        "watermarks and no KV references (the earlier default); paper: the ThunderAgent paper's method (HBM only)")
    g.add_argument("--thunder-time-scale", type=float, default=1.0,
                   help="divide every time constant of the policy by this (use the workers' --time-scale with simulated workers)")
    g.add_argument("--thunder-tick-seconds", type=float, default=None, help="override scheduler.tick_seconds (Δt)")
    g.add_argument("--thunder-decay-base", type=float, default=None, help="override scheduler.decay_base (x in f(k)=x^-k)")
    g.add_argument("--thunder-decay", default=None, choices=["paper", "returns"],
                   help="override scheduler.decay: paper (default: x^-k), returns (the larger of x^-k and the chance, "
                        "from the measured tool times, that a silent program asks again within one request time)")
    g.add_argument("--thunder-lambda-max", type=float, default=None, help="override scheduler.lambda_max")
    g.add_argument("--thunder-admission", default=None, choices=["goodput", "occupancy", "fixed"],
                   help="override scheduler.admission.mode: goodput (default: the level with the best predicted and "
                        "measured steps/s), occupancy (the previous rule), fixed (the watermarks only)")
    g.add_argument("--thunder-lambda-min", type=float, default=None, help="override scheduler.lambda_min")
    g.add_argument("--thunder-idle-timeout-secs", type=float, default=None, help="override programs.idle_timeout_seconds")
    g.add_argument("--thunder-infer-program-ids", default=None, choices=["on", "off"],
                   help="override programs.infer_ids: a chat request without a program id joins the program whose "
                        "conversation it continues (default on; docs/deploy.md, 'Program ids')")
    g.add_argument("--thunder-group-id-pattern", default=None,
                   help="override programs.group_id_pattern: derive a group from the program id (regex, first capture group)")
    g.add_argument("--thunder-storage-tokens", type=int, default=None,
                   help="override monitor.storage_tokens: HiCache storage-tier capacity per worker rank in tokens, counted "
                        "in the pool (SGLang reports none; default 0: storage not counted)")
    g.add_argument("--thunder-admin-api-key", default=None, help="key for admin routes (workers, flush, listing/releasing all programs)")
    g.add_argument("--thunder-sandbox-provider", default=None, choices=["docker", "local", "none", "auto"],
                   help="override sandboxes.provider")
    g.add_argument("--thunder-instance-id", default=None,
                   help="stable id of this router (labels its sandboxes; a restart with the same id sweeps orphans); default: host-port")
    g.add_argument("--thunder-state-dir", default=None, help="directory for router state (sandbox working dirs)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="thunder-router",
        description="thunder_sgl router: sglang_router's arguments, plus --policy thunder (program-aware scheduling).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    for action in parser._actions:
        if action.dest == "policy" and action.choices is not None:
            action.choices = [*action.choices, THUNDER]
            action.help = (action.help or "") + ". 'thunder': program-aware pause/restore/migration (thunder_sgl)"
    parser.add_argument("--version", action="version", version=f"thunder_sgl {__version__}")
    add_thunder_args(parser)
    return parser


def split_thunder_args(argv: Sequence[str]) -> list[str]:
    """argv without the --thunder-* options (for the stock router)."""
    only = argparse.ArgumentParser(add_help=False)
    add_thunder_args(only)
    _, rest = only.parse_known_args(list(argv))
    return rest


def redact(argv: Sequence[str]) -> list[str]:
    out, hide = [], False
    for a in argv:
        if hide:
            out.append("***")
            hide = False
        elif a in SECRET_OPTIONS:
            out.append(a)
            hide = True
        elif any(a.startswith(s + "=") for s in SECRET_OPTIONS):
            out.append(a.split("=", 1)[0] + "=***")
        else:
            out.append(a)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.policy != THUNDER:
        stock = split_thunder_args(argv)
        print(f"thunder-router: policy {args.policy!r}: starting the stock sglang_router", file=sys.stderr, flush=True)
        os.execvp(sys.executable, [sys.executable, "-m", "sglang_router.launch_router", *stock])
    try:
        serve(args, argv)
    except ConfigError as e:
        print(f"thunder-router: configuration error: {e.message}", file=sys.stderr)
        raise SystemExit(2) from None


def _explicit(argv: Sequence[str], option: str) -> bool:
    return any(a == option or a.startswith(option + "=") for a in argv)


def thunder_overrides(args: argparse.Namespace, argv: Sequence[str]) -> dict[str, Any]:
    """The dotted config overrides of the ``--thunder-*`` options in ``args`` (None: not given)."""
    return {
        "scheduler.tick_seconds": args.thunder_tick_seconds,
        "scheduler.decay_base": args.thunder_decay_base,
        "scheduler.decay": args.thunder_decay,
        "scheduler.lambda_max": args.thunder_lambda_max,
        "scheduler.lambda_min": args.thunder_lambda_min,
        "scheduler.admission.mode": args.thunder_admission,
        "programs.idle_timeout_seconds": args.thunder_idle_timeout_secs,
        "programs.infer_ids": None if args.thunder_infer_program_ids is None else args.thunder_infer_program_ids == "on",
        "programs.group_id_pattern": args.thunder_group_id_pattern,
        "monitor.storage_tokens": args.thunder_storage_tokens,
        "sandboxes.provider": args.thunder_sandbox_provider,
        "gateway.policy": VARIANTS[args.thunder_variant] if _explicit(argv, "--thunder-variant") else None,
        "gateway.admin_api_key": args.thunder_admin_api_key or None,
        "gateway.instance_id": args.thunder_instance_id or None,
        "gateway.state_dir": args.thunder_state_dir,
    }


def thunder_config(argv: Sequence[str]) -> RouterConfig:
    """The RouterConfig that ``launch_router --policy thunder`` builds from these ``--thunder-*``
    options, and only those: the DES bench's ``--router-arg thunder=...``, where no process is
    started and the router's name already chose its policy. ValueError for anything else."""
    only = argparse.ArgumentParser(prog="--router-arg", add_help=False, exit_on_error=False)
    add_thunder_args(only)
    try:
        args, rest = only.parse_known_args(list(argv))
    except argparse.ArgumentError as e:
        raise ValueError(f"router arguments {' '.join(argv)!r}: {e}") from None
    if rest:
        raise ValueError(f"router arguments: only --thunder-* options apply in DES mode, not {' '.join(rest)!r}")
    if _explicit(argv, "--thunder-variant"):
        raise ValueError("router arguments: --thunder-variant does not apply in DES mode; name the router "
                         f"instead ({', '.join(sorted(set(VARIANTS.values())))})")
    if _explicit(argv, "--thunder-time-scale"):
        raise ValueError("router arguments: --thunder-time-scale does not apply in DES mode (the router runs "
                         "on the simulation's own clock)")
    try:
        cfg = load_config(args.thunder_config or resolve_config_path("thunder"))
        overrides = {k: v for k, v in thunder_overrides(args, argv).items() if v is not None}
        return cfg.with_overrides(overrides)
    except ConfigError as e:
        raise ValueError(f"router arguments: {e.message}") from None


def serve(args: argparse.Namespace, argv: Sequence[str]) -> None:
    import uvicorn

    from thunder_sgl.gateway.app import create_app

    level = {"warn": "WARNING"}.get(args.log_level, (args.log_level or "info").upper())
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg_path = args.thunder_config or resolve_config_path("thunder")
    cfg = load_config(cfg_path)
    overrides = {  # a flag given wins over the YAML
        **thunder_overrides(args, argv),
        "gateway.worker_urls": list(args.worker_urls) if args.worker_urls else None,
        "gateway.api_key": args.api_key,
        "gateway.max_body_bytes": (args.max_payload_size or None) if _explicit(argv, "--max-payload-size") else None,
        "gateway.request_id_headers": list(args.request_id_headers) if args.request_id_headers else None,
    }
    cfg = cfg.with_overrides({k: v for k, v in overrides.items() if v is not None}).scaled(args.thunder_time_scale)

    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    port = sock.getsockname()[1]
    if cfg.gateway.instance_id is None:
        cfg = cfg.with_overrides({"gateway.instance_id": f"thunder-{socket.gethostname()}-{port}"})
    app = create_app(cfg)
    logging.getLogger("thunder_sgl").info("args: %s", " ".join(redact(argv)))
    print(f"thunder-router {__version__}: policy {cfg.gateway.policy}, {len(cfg.gateway.worker_urls)} worker(s), "
          f"listening on http://{args.host}:{port}", flush=True)
    from thunder_sgl.gateway.serving import CoalescingHttpToolsProtocol

    config = uvicorn.Config(app, loop="uvloop", http=CoalescingHttpToolsProtocol, log_level=level.lower(),
                            access_log=False, lifespan="on", timeout_graceful_shutdown=5,
                            # no X-Forwarded-* rewriting (nothing reads the client address) and no
                            # Server header: a middleware layer and a header less per request
                            proxy_headers=False, server_header=False,
                            # longer than clients keep idle pooled connections (aiohttp 15 s, httpx 5 s),
                            # so a reused connection is not closed under a request in flight
                            timeout_keep_alive=75)
    # What is built by now (modules, app, routes, config) lives as long as the process. Left to
    # the collector, every full collection walked it all: ~45 ms pauses of the event loop, the
    # data plane's p99 under load (issue 15); frozen out of the collector, ~7 ms.
    gc.collect()
    gc.freeze()
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
