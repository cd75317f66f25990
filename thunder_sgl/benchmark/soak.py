"""``thunder-sgl soak``: hours of agents at 2× KV overload, with faults on a schedule.

    thunder-sgl soak --minutes 30 [--nodes 2] [--cluster glm46-fp8-h100x8] [--overload 2]
                     [--time-scale 10] [--fault-every 45] [--sandboxes auto|docker|local|none]
                     [--exec-every 10]

Starts one simulated worker process per node (so that a crash takes one node down) and the
thunder router in front of them, then drives closed-loop agent programs — ``overload`` × the
cluster's KV capacity in programs (Σ HBM tokens / the profile's time-averaged context) — each
with a sandbox whose ``exec`` is every ``exec-every``-th tool call (the clock runs
``time-scale``× fast, so agents call tools that much more often than real ones). Every ``fault-every`` seconds one fault is
injected, in turn: a worker killed (SIGKILL) and restarted 10 s later on its port; a worker
that stops answering for 15 s; +300 ms latency for 20 s; 20% of requests failing for 20 s;
a stream dropped mid-way. At the end it prints and writes (JSON, under ``--out``):
requests served, errors by kind, programs lost (abandoned by their agent after retries:
must be 0), leaked programs / sandboxes / ports on the router after every program was
released and releases still unfinished (must be 0), sandboxes of the router's instance left in
docker or as local processes after the router stopped (must be 0; removed after counting),
router RSS at start and end, and the longest held-request wait.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from thunder_sgl.benchmark.drivers.closed_loop import DriverOptions, run_workload
from thunder_sgl.benchmark.drivers.peers import start_sim, start_thunder
from thunder_sgl.benchmark.workloads.profile import StepSpec, load_profile, mean_context_tokens
from thunder_sgl.children import Proc
from thunder_sgl.sim import load_sim_config

FAULTS = ("crash", "silence", "slow", "flaky", "drop")


@dataclass
class SandboxTools:
    """Agents' tool calls as sandbox execs through the router (one sandbox per program)."""

    url: str
    session: aiohttp.ClientSession
    exec_every: int = 1
    """Every n-th tool call of a program runs as an exec; the others wait out the tool time.
    A docker exec costs the host tens of ms of CPU (dockerd, containerd, runc), and a
    time-scaled soak makes tool calls n× more often than real agents do."""
    sandboxes: dict[str, str] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)
    execs: int = 0
    calls: Counter[str] = field(default_factory=Counter)

    async def start(self, program_id: str) -> None:
        try:
            async with self.session.post(f"{self.url}/programs/{program_id}/sandboxes", json={}) as r:
                body = await r.json(content_type=None)
                if r.status == 202:
                    self.sandboxes[program_id] = body["id"]
                else:
                    self.errors[f"sandbox_create_{r.status}"] += 1
        except (TimeoutError, aiohttp.ClientError) as e:
            self.errors[f"sandbox_create_{type(e).__name__}"] += 1

    async def run(self, program_id: str, step: StepSpec, real_seconds: float) -> None:
        sid = self.sandboxes.get(program_id)
        self.calls[program_id] += 1
        if sid is None or (self.calls[program_id] - 1) % self.exec_every:
            await asyncio.sleep(real_seconds)
            return
        cmd = f"sleep {real_seconds:.3f}"
        try:
            async with self.session.post(f"{self.url}/programs/{program_id}/sandboxes/{sid}/exec",
                                         json={"command": cmd, "timeout": real_seconds + 30}) as r:
                await r.read()
                if r.status == 200:
                    self.execs += 1
                elif r.status == 409:  # still preparing: the agent waits for its tool instead
                    await asyncio.sleep(real_seconds)
                else:
                    self.errors[f"exec_{r.status}"] += 1
        except (TimeoutError, aiohttp.ClientError) as e:
            self.errors[f"exec_{type(e).__name__}"] += 1


def rss_mb(proc: Proc) -> float:
    try:
        return psutil.Process(proc.popen.pid).memory_info().rss / 2**20
    except psutil.Error:
        return float("nan")


def left_after_stop(instance: str) -> int:
    """Sandboxes of this router instance still present after the router stopped: docker
    containers (any state) with its label and local-sandbox processes with its tag. Counted,
    then removed, so a soak never leaves anything behind."""
    from thunder_sgl.sandboxes import procs
    from thunder_sgl.sandboxes.base import ENV_INSTANCE, LABEL_INSTANCE

    local = procs.tagged({ENV_INSTANCE: instance})
    procs.signal_all(local)
    found: list[Any] = []
    with contextlib.suppress(Exception):  # no daemon: no containers
        import docker

        client = docker.from_env(timeout=30)
        found = client.containers.list(all=True, filters={"label": f"{LABEL_INSTANCE}={instance}"})
    for c in found:
        with contextlib.suppress(Exception):
            c.remove(force=True)
    return len(local) + len(found)


async def get_json(session: aiohttp.ClientSession, url: str, *, tries: int = 1, timeout: float = 10.0) -> Any:
    """GET url as JSON; with ``tries`` > 1 a timeout or connection error is retried."""
    for k in range(tries):
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                return await r.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError):
            if k == tries - 1:
                raise
            await asyncio.sleep(1)


async def metric(session: aiohttp.ClientSession, url: str, name: str) -> float:
    async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=10)) as r:
        for line in (await r.text()).splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


async def set_fault(session: aiohttp.ClientSession, url: str, **kw: Any) -> None:
    with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
        async with session.post(url + "/sim/faults", json=kw, timeout=aiohttp.ClientTimeout(total=5)) as r:
            await r.read()


async def inject(args: argparse.Namespace, nodes: list[Proc], session: aiohttp.ClientSession,
                 log: list[dict[str, Any]], t0: float) -> None:
    """Faults in turn, one every ``fault_every`` seconds, each on the next node."""
    i = 0
    while True:
        await asyncio.sleep(args.fault_every)
        kind = FAULTS[i % len(FAULTS)]
        k = i % len(nodes)
        node = nodes[k]
        log.append({"t": round(time.monotonic() - t0, 1), "fault": kind, "node": node.url})
        print(f"[soak] t={time.monotonic() - t0:6.0f}s fault: {kind} on {node.url}", flush=True)
        if kind == "crash":
            port = int(node.url.rsplit(":", 1)[1])
            node.kill()
            await asyncio.sleep(10)
            nodes[k] = await asyncio.to_thread(start_sim, args.cluster, 1, args.time_scale, 0, None,
                                               Path(args.out) / "logs", 60.0, port, f"sim-{k}-r{i}")
        elif kind == "silence":
            await set_fault(session, node.url, stop_answering=True)
            await asyncio.sleep(15)
            await set_fault(session, node.url, stop_answering=False)
        elif kind == "slow":
            await set_fault(session, node.url, added_latency_ms=300)
            await asyncio.sleep(20)
            await set_fault(session, node.url, added_latency_ms=0)
        elif kind == "flaky":
            await set_fault(session, node.url, failure_rate=0.2)
            await asyncio.sleep(20)
            await set_fault(session, node.url, failure_rate=0.0)
        elif kind == "drop":
            await set_fault(session, node.url, die_mid_stream_after_tokens=5, die_mid_stream_mode="drop")
        i += 1


async def soak(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = load_sim_config(args.cluster)
    c_bar = mean_context_tokens(load_profile(args.profile), 12345, 400)
    capacity = args.nodes * cfg.server.max_total_num_tokens / c_bar
    programs = max(2, round(args.overload * capacity))
    print(f"[soak] {args.nodes} × {args.cluster}: KV capacity ≈ {capacity:.0f} programs of c̄ ≈ {c_bar:.0f} tokens; "
          f"driving {programs} programs ({args.overload}×) for {args.minutes} min at time scale {args.time_scale}",
          flush=True)
    nodes = [start_sim(args.cluster, 1, args.time_scale, log_dir=out / "logs", name=f"sim-{k}") for k in range(args.nodes)]
    instance = f"soak-{int(time.time())}"
    extra = ["--thunder-instance-id", instance, "--thunder-sandbox-provider", args.sandboxes]
    router = start_thunder([n.url for n in nodes], time_scale=args.time_scale, log_dir=out / "logs", extra=extra)
    faults: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
            rss_start = rss_mb(router)
            tools = SandboxTools(router.url, s, exec_every=args.exec_every) if args.sandboxes != "none" else None
            opts = DriverOptions(duration_s=args.minutes * 60, time_scale=args.time_scale, seed=args.seed,
                                 max_retries=6, retry_backoff_s=1.0, request_timeout_s=600, tools=tools)
            t0 = time.monotonic()
            injector = asyncio.create_task(inject(args, nodes, s, faults, t0))
            rss_peak = rss_start

            async def sample() -> None:
                nonlocal rss_peak
                while True:
                    await asyncio.sleep(30)
                    rss_peak = max(rss_peak, rss_mb(router))
                    with contextlib.suppress(Exception):
                        info = await get_json(s, router.url + "/get_server_info")
                        print(f"[soak] t={time.monotonic() - t0:6.0f}s programs={info['programs']} "
                              f"waiting={info['waiting_programs']} held={info['held_requests']} "
                              f"rss={rss_mb(router):.0f} MB", flush=True)

            sampler = asyncio.create_task(sample())
            try:
                res = await run_workload(router.url, args.profile, programs, opts)
            finally:
                for t in (injector, sampler):
                    t.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await t
            for n in nodes:  # clear faults left armed
                await set_fault(s, n.url, stop_answering=False, added_latency_ms=0, failure_rate=0.0,
                                die_mid_stream_after_tokens=None)
            await asyncio.sleep(3)  # releases propagate; sandbox teardown finishes
            # the end-of-run accounting must not fail on a router busy tearing sandboxes down
            info = await get_json(s, router.url + "/get_server_info", tries=5, timeout=30)
            sb = info.get("sandboxes", {})
            for _ in range(120):  # releases finish tearing sandboxes down
                if not sb.get("live") and not sb.get("ports_in_use") and not sb.get("releasing"):
                    break
                await asyncio.sleep(1)
                info = await get_json(s, router.url + "/get_server_info", tries=5, timeout=30)
                sb = info.get("sandboxes", {})
            held_max = await metric(s, router.url, "thunder_held_wait_max_seconds")
            outcomes = Counter(p.outcome for p in res.programs)
            summary = {
                "command": "thunder-sgl soak " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                                                     if k != "command"),
                "minutes": args.minutes, "nodes": args.nodes, "cluster": args.cluster, "programs": programs,
                "requests_served": sum(1 for x in res.steps if x.ok),
                "errors_by_kind": dict(res.errors) | {f"tool_{k}": v for k, v in (tools.errors if tools else {}).items()},
                "programs_started": len(res.programs), "programs_completed": outcomes.get("completed", 0),
                "programs_lost": outcomes.get("failed", 0),
                "programs_cancelled_at_end": outcomes.get("cancelled", 0),
                "leaked_programs": info["programs"], "leaked_sandboxes": sb.get("live", 0),
                "leaked_ports": sb.get("ports_in_use", 0), "releases_unfinished": sb.get("releasing", 0),
                "sandbox_execs": tools.execs if tools else 0,
                "router_rss_mb_start": round(rss_start, 1), "router_rss_mb_end": round(rss_mb(router), 1),
                "router_rss_mb_peak": round(rss_peak, 1),
                "max_held_wait_s": round(held_max, 3), "max_held_wait_simulated_s": round(held_max * args.time_scale, 1),
                "steps_per_min": round(res.steps_per_min, 1), "kv_hit_rate": round(res.kv_hit_rate, 4),
                "faults": faults,
            }
    finally:
        router.stop(timeout=90.0)  # a graceful stop reaps what is still owned
        for n in nodes:
            n.stop()
    if summary:
        # what the router's own accounting cannot see: containers of this instance left in docker
        summary["leaked_sandboxes_after_stop"] = left_after_stop(instance)
    (out / "soak.json").write_text(json.dumps(summary, indent=1))
    width = max(len(k) for k in summary)
    for k, v in summary.items():
        if k != "faults":
            print(f"  {k:<{width}}  {v}")
    print(f"  faults injected: {len(faults)} ({Counter(f['fault'] for f in faults)})")
    print(f"[soak] written {out / 'soak.json'}")
    return summary


def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--minutes", type=float, default=30.0, help="wall minutes to run")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--cluster", default="glm46-fp8-h100x8", help="simulator config of each node")
    ap.add_argument("--profile", default="mini-swe-agent")
    ap.add_argument("--overload", type=float, default=2.0, help="programs as a multiple of the KV capacity")
    ap.add_argument("--time-scale", type=float, default=10.0)
    ap.add_argument("--fault-every", type=float, default=45.0, help="wall seconds between faults")
    ap.add_argument("--sandboxes", default="auto", choices=["auto", "docker", "local", "none"])
    ap.add_argument("--exec-every", type=int, default=10,
                    help="every n-th tool call of a program is a sandbox exec (1: all); the rest wait")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default="bench/results/soak")


def verdict(summary: dict[str, Any]) -> int:
    """Exit status: 0 when nothing was lost or leaked."""
    keys = ("programs_lost", "leaked_programs", "leaked_sandboxes", "leaked_ports", "releases_unfinished",
            "leaked_sandboxes_after_stop")
    return 0 if all(summary.get(k, 1) == 0 for k in keys) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="thunder-sgl soak", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_args(ap)
    return verdict(asyncio.run(soak(ap.parse_args(argv))))


if __name__ == "__main__":
    raise SystemExit(main())
