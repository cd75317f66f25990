"""Data-plane overhead: what each router adds per request, measured side by side in one run.

    python -m thunder_sgl.benchmark.overhead [--seconds 8] [--concurrency 32] [--out bench/results/overhead]

One simulated worker (time-scale high enough that it answers in well under a millisecond of
simulated work) is reached directly and through: the thunder gateway, stock sglang_router
0.3.2 (cache_aware, log level warn) and smg 1.13.0 (cache_aware). For each target it runs

- closed loop, concurrency C, chat non-stream and chat stream (8 tokens): requests/s, p50/p99;
- open loop at a fixed rate (default 500 req/s), chat non-stream: p50/p99 and the latency
  *added* to the direct path at the same rate;
- one stream at a time on a reused connection (c = 1): per-stream latency, which exposes
  Nagle/delayed-ACK stalls (sglang_router 0.3.2 adds ~40 ms there, sglang-surface §3.8);

and the router process's CPU seconds. Each measurement is split in ``SLICES`` slices taken
with the targets in turn, so that other load on the machine falls on all of them. An error is a request that failed, answered a status
other than 200, or (streams) ended without ``data: [DONE]`` or with an SSE error event. Every
request of the thunder runs carries a program id (one program per client slot, as agents
do), so the policy's bookkeeping is in the path. The command line goes to ``command.txt``.
Client, worker and router share this machine's cores: ratios are the result, not absolutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import orjson
import psutil

from thunder_sgl.benchmark.drivers.peers import start_sim, start_stock, start_thunder
from thunder_sgl.children import Proc

BODY = {"model": "sim", "max_tokens": 8, "messages": [
    {"role": "system", "content": "You are a careful software engineer. " * 12},
    {"role": "user", "content": "Summarise the failing test and propose a one-line fix."}]}


@dataclass
class Row:
    target: str
    mode: str
    rps: float
    p50_ms: float
    p99_ms: float
    added_p50_ms: float | None = None
    added_p99_ms: float | None = None
    router_cpu_s: float | None = None
    errors: int = 0


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def one(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str], stream: bool) -> float:
    """Seconds for one request; raises (an error) on a status other than 200 and on a stream
    that is cut short or carries an SSE error event."""
    t = time.perf_counter()
    async with session.post(url, data=body, headers=headers) as r:
        if stream:
            chunks = [c async for c in r.content.iter_any()]
        else:
            await r.read()
        if r.status != 200:
            raise RuntimeError(f"status {r.status}")
    if stream:
        data = b"".join(chunks)
        if not data.endswith(b"data: [DONE]\n\n") or b'data: {"error"' in data:
            raise RuntimeError("broken stream")
    return time.perf_counter() - t


MODEL = {"id": "sim"}


def payload(stream: bool) -> bytes:
    b = dict(BODY, stream=stream, model=MODEL["id"])  # smg routes by model name: use the worker's
    return orjson.dumps(b)


async def closed_loop(url: str, conc: int, seconds: float, stream: bool, warmup: float = 1.0) -> tuple[list[float], int, float]:
    lat: list[float] = []
    errors = 0
    body = payload(stream)
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as s:
        start = time.perf_counter()
        t_measure = start + warmup
        end = t_measure + seconds

        async def worker(i: int) -> None:
            nonlocal errors
            h = {"Content-Type": "application/json", "X-Program-Id": f"ovh-{i}", "X-SMG-Routing-Key": f"ovh-{i}"}
            while time.perf_counter() < end:
                t0 = time.perf_counter()
                try:
                    d = await one(s, url, body, h, stream)
                except Exception:  # noqa: BLE001 - counted
                    errors += 1
                    await asyncio.sleep(0.01)
                    continue
                if t0 >= t_measure:
                    lat.append(d)

        await asyncio.gather(*(worker(i) for i in range(conc)))
    return lat, errors, seconds


async def open_loop(url: str, rate: float, seconds: float, warmup: float = 1.0) -> tuple[list[float], int]:
    """Requests sent at a fixed rate, whatever the latency (each request gets its own program
    id slot from a pool large enough that no program has two requests in flight)."""
    lat: list[float] = []
    errors = 0
    body = payload(False)
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as s:
        tasks = []
        start = time.perf_counter()
        n = int((warmup + seconds) * rate)
        busy: set[int] = set()

        async def fire(k: int, measure: bool) -> None:
            nonlocal errors
            slot = 0
            while slot in busy:
                slot += 1
            busy.add(slot)
            h = {"Content-Type": "application/json", "X-Program-Id": f"ol-{slot}", "X-SMG-Routing-Key": f"ol-{slot}"}
            try:
                d = await one(s, url, body, h, False)
                if measure:
                    lat.append(d)
            except Exception:  # noqa: BLE001 - counted
                errors += 1
            finally:
                busy.discard(slot)

        for k in range(n):
            due = start + k / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(fire(k, k >= warmup * rate)))
        await asyncio.gather(*tasks)
    return lat, errors


async def single_stream(url: str, n: int = 50) -> list[float]:
    lat = []
    body = payload(True)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as s:
        h = {"Content-Type": "application/json", "X-Program-Id": "solo", "X-SMG-Routing-Key": "solo"}
        for _ in range(n + 5):
            lat.append(await one(s, url, body, h, True))
    return lat[5:]


def cpu(proc: Proc | None) -> float:
    if proc is None:
        return 0.0
    try:
        p = psutil.Process(proc.popen.pid)
        procs = [p, *p.children(recursive=True)]
        return sum(x.cpu_times().user + x.cpu_times().system for x in procs)
    except psutil.Error:
        return 0.0


SLICES = 4
"""Each measurement is taken in this many slices with the targets in turn (direct, thunder,
sglang_router, smg, direct, ...), so that load from other work on this shared machine falls
on every target alike rather than on whichever was being measured."""


@dataclass
class Tally:
    lat: list[float] = field(default_factory=list)
    errors: int = 0
    seconds: float = 0.0
    cpu: float = 0.0


def interleaved(targets: dict[str, Proc | None], urls: dict[str, str],
                measure: Callable[[str], tuple[list[float], int, float]]) -> dict[str, Tally]:
    """``measure(url) -> (latencies, errors, seconds measured)``, SLICES times per target, in
    turn; the router's CPU seconds are counted over its slices."""
    out = {name: Tally() for name in targets}
    for _ in range(SLICES):
        for name, proc in targets.items():
            c0 = cpu(proc)
            lat, err, secs = measure(urls[name])
            t = out[name]
            t.lat += lat
            t.errors += err
            t.seconds += secs
            t.cpu += cpu(proc) - c0
            print(f"{name}: {len(lat)} requests in {secs:.1f}s, {err} errors", flush=True)
    return out


def run(args: argparse.Namespace) -> list[Row]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sim = start_sim(args.config, workers=1, time_scale=args.time_scale, log_dir=out / "logs")
    with urllib.request.urlopen(sim.urls[0] + "/v1/models", timeout=5) as r:
        MODEL["id"] = json.loads(r.read())["data"][0]["id"]
    targets: dict[str, Proc | None] = {"direct": None}
    rows: list[Row] = []
    try:
        targets["thunder"] = start_thunder(sim.urls, time_scale=args.router_time_scale, log_dir=out / "logs")
        if not args.no_stock:
            targets["sglang_router"] = start_stock(sim.urls, "cache_aware", "sglang_router", log_dir=out / "logs")
            targets["smg"] = start_stock(sim.urls, "cache_aware", "smg", log_dir=out / "logs")
        urls = {name: (sim.urls[0] if proc is None else proc.url) + "/v1/chat/completions" for name, proc in targets.items()}
        conc, secs = args.concurrency, args.seconds / SLICES

        def closed_of(stream: bool) -> Callable[[str], tuple[list[float], int, float]]:
            return lambda u: asyncio.run(closed_loop(u, conc, secs, stream))

        closed = {stream: interleaved(targets, urls, closed_of(stream)) for stream in (False, True)}
        opened = interleaved(targets, urls, lambda u: (*asyncio.run(open_loop(u, args.rate, secs)), secs))
        solo = interleaved(targets, urls, lambda u: (asyncio.run(single_stream(u, 50 // SLICES)), 0, 0.0))
        direct_open = opened["direct"].lat
        for name, proc in targets.items():
            for mode, stream in (("chat", False), ("chat-stream-8", True)):
                t = closed[stream][name]
                rows.append(Row(name, f"{mode} c={conc}", len(t.lat) / t.seconds, pct(t.lat, .5) * 1e3,
                                pct(t.lat, .99) * 1e3, router_cpu_s=t.cpu if proc else None, errors=t.errors))
            t = opened[name]
            row = Row(name, f"chat @{args.rate:.0f} req/s", len(t.lat) / t.seconds, pct(t.lat, .5) * 1e3,
                      pct(t.lat, .99) * 1e3, errors=t.errors)
            if proc is not None and direct_open:
                row.added_p50_ms = row.p50_ms - pct(direct_open, .5) * 1e3
                row.added_p99_ms = row.p99_ms - pct(direct_open, .99) * 1e3
            rows.append(row)
            t = solo[name]
            rows.append(Row(name, "stream c=1 reused conn", len(t.lat) / sum(t.lat), pct(t.lat, .5) * 1e3, pct(t.lat, .99) * 1e3))
    finally:
        for p in targets.values():
            if p is not None:
                p.stop()
        sim.stop()
    write(rows, out, args)
    return rows


def write(rows: list[Row], out: Path, args: argparse.Namespace) -> None:
    (out / "overhead.json").write_text(json.dumps([asdict(r) for r in rows], indent=1))
    lines = [f"Command: `python -m thunder_sgl.benchmark.overhead --seconds {args.seconds} --concurrency {args.concurrency} "
             f"--rate {args.rate} --config {args.config} --time-scale {args.time_scale} --router-time-scale {args.router_time_scale}`", "",
             "| target | mode | req/s | p50 ms | p99 ms | added p50 ms | added p99 ms | router CPU s | errors |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]

    def f(x: float | None) -> str:
        return "" if x is None else f"{x:.1f}"

    for r in rows:
        lines.append(f"| {r.target} | {r.mode} | {r.rps:.0f} | {r.p50_ms:.1f} | {r.p99_ms:.1f} | {f(r.added_p50_ms)} | "
                     f"{f(r.added_p99_ms)} | {f(r.router_cpu_s)} | {r.errors} |")
    by = {(r.target, r.mode): r for r in rows}
    mode, smode = f"chat c={args.concurrency}", f"chat-stream-8 c={args.concurrency}"
    if ("thunder", mode) in by and ("smg", mode) in by:
        lines += ["", f"thunder / smg requests/s (chat, closed loop): {by[('thunder', mode)].rps / by[('smg', mode)].rps:.2f}"]
    if ("thunder", smode) in by and ("smg", smode) in by:
        th, sm = by[("thunder", smode)], by[("smg", smode)]
        lines += [f"thunder / smg (chat-stream-8, closed loop): requests/s {th.rps / sm.rps:.2f}, p99 {th.p99_ms / sm.p99_ms:.2f}"]
    (out / "overhead.md").write_text("\n".join(lines) + "\n")
    (out / "command.txt").write_text(lines[0].removeprefix("Command: `").removesuffix("`") + "\n")
    print("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--rate", type=float, default=500.0)
    ap.add_argument("--config", default="tiny")
    ap.add_argument("--time-scale", type=float, default=1000.0, help="the simulated worker's clock")
    ap.add_argument("--router-time-scale", type=float, default=1.0,
                    help="thunder's --thunder-time-scale (1: real-time ticks and timeouts, as in production)")
    ap.add_argument("--out", default="bench/results/overhead")
    ap.add_argument("--no-stock", action="store_true", help="skip sglang_router and smg")
    run(ap.parse_args())


if __name__ == "__main__":
    main()
