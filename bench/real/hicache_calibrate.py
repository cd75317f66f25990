"""Calibrate the simulator's HiCache tiers against SGLang's real ones (issue 22, item 5).

    python bench/real/hicache_calibrate.py [--targets real,sim] [--setups wt,wb,wt-file,wb-file]
                                           [--sequences aafa,host-refs,rr-device,rr-host,rr-sessions]
                                           [--real-from raw.json] [--out DIR]
    python bench/real/hicache_calibrate.py --per-router REAL_SWEEP SIM_SWEEP [SIM_SWEEP ...]

Runs the same deterministic request sequences, one request at a time, against a real SGLang
0.5.23 CPU server with SGLang's real HiCache (``engine serve --max-total-tokens 4096
--hicache-ratio 3 [--hicache-write-policy write_back] [--hicache-storage DIR]``, model ``small``)
and against the simulator with the matching config (``sglang-cpu-gpt2-small-hicache``: same
pool, ratio, page size 1, write policy and, for SGLang's file backend, an unbounded storage
tier), and compares, per sequence and set-up:

- the per-tier hit split: device / host / storage cached tokens ÷ prompt tokens (each request's
  ``meta_info.cached_tokens_details``);
- the backup volume (``sglang:hicache_backup_tokens_total``), what was loaded back
  (``sglang:load_back_tokens_total``) and written to storage
  (``sglang:backuped_tokens_total{storage_backend="file"}``), read after every request and at
  the end;
- which request found its prefix in which tier, side by side, which shows what was loaded back
  when and the host tier's eviction order: every sequence ends with a probe that revisits each
  earlier prefix, oldest first.

Requests are ``/generate`` with ``input_ids`` (exact tokens; random ids, a separate seed per
sequence, so that no sequence hits another's tokens in the file tier, which ``/flush_cache``
leaves alone), greedy, ``ignore_eos``; some carry a ``session_id`` (the engine is started with
``--enable-session-radix-cache``, as thunder's engines are). The cache is flushed before each
sequence. One real server at a time, stopped before the next starts. Transfer timing is not
compared: on a CPU SGLang's copies run inline on the scheduler thread
(/work/shared/docs/real-hicache-cpu.md, docs/real-engine.md).

Writes ``table.md``, ``raw.json`` and ``command.txt`` to
``bench/results/real-cpu-hicache-calibration/``; ``--real-from raw.json`` re-runs only the
simulator against saved real runs. ``--per-router`` compares, per router and N, the hits by tier
of a real-mode HiCache sweep (``thunder-sgl bench --mode real --hicache-ratio``) with DES runs of
the same sweep (``per-router.md``).
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "bench" / "results" / "real-cpu-hicache-calibration"
SIM_CONFIG = "sglang-cpu-gpt2-small-hicache"
POOL = 4096
RATIO = 3.0
VOCAB = 833
"""Token ids drawn from [3, VOCAB): the vocabulary of the random-weight model ``small`` (0-2 are
its special tokens)."""
STORAGE_TOKENS = 10_000_000
"""The simulator's storage capacity for SGLang's file backend, which has no limit but the disk."""

SETUPS: dict[str, tuple[str, bool]] = {
    "wt": ("write_through", False),
    "wb": ("write_back", False),
    "wt-file": ("write_through", True),
    "wb-file": ("write_back", True),
}
METRICS = {
    "backup": "sglang:hicache_backup_tokens_total",
    "load_back": "sglang:load_back_tokens_total",
    "host_used": "sglang:hicache_host_used_tokens",
    "host_total": "sglang:hicache_host_total_tokens",
    "evicted": "sglang:evicted_tokens_total",
    "storage_backup": "sglang:backuped_tokens_total",
}


# ---- sequences --------------------------------------------------------------------------------
@dataclass
class Step:
    """One request: ``prompt(history)`` gives its token ids (a program's context may continue
    with the ids the engine answered before, so it is built when the step runs)."""

    label: str
    build: Callable[[dict[str, list[int]]], list[int]]
    max_new: int = 4
    phase: str = "run"
    program: str | None = None
    """The context this request continues; its prompt + answer become the program's history."""
    session: str | None = None
    """``session_id`` of the request (``--enable-session-radix-cache``: its KV is referenced, as
    thunder's requests are)."""


@dataclass
class Sequence:
    name: str
    about: str
    steps: list[Step] = field(default_factory=list)


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, VOCAB) for _ in range(n)]


def seq_aafa(seed: int) -> Sequence:
    """real-hicache-cpu.md's sequence: a 3,000-token prefix A, A again, four 1,500-token
    fillers (A leaves the 4,096-token device pool), A; then the probe: each filler again."""
    rng = random.Random(seed)
    a = _ids(rng, 3000)
    fillers = [_ids(rng, 1500) for _ in range(4)]
    s = Sequence("aafa", "A (3,000) · A · 4 fillers (1,500) · A · probe F1..F4")
    s.steps.append(Step("A", lambda h: a))
    s.steps.append(Step("A", lambda h: a))
    for i, f in enumerate(fillers):
        s.steps.append(Step(f"F{i + 1}", lambda h, f=f: f))
    s.steps.append(Step("A", lambda h: a))
    for i, f in enumerate(fillers):
        s.steps.append(Step(f"F{i + 1}", lambda h, f=f: f, phase="probe"))
    return s


def seq_host_refs(seed: int) -> Sequence:
    """Host eviction order under session references: R (3,000 tokens, with a ``session_id``),
    then four 3,000-token requests U1-U4 without one; R leaves the device first (the only KV to
    evict when U1 comes), so it is the oldest host leaf when the host fills; then R and U1 again.
    LRU would drop R's host copy, eviction by references drops U1's."""
    rng = random.Random(seed)
    r = _ids(rng, 3000)
    us = [_ids(rng, 3000) for _ in range(4)]
    s = Sequence("host-refs", "R (3,000, session) · U1..U4 (3,000, no session) · probe R, U1")
    s.steps.append(Step("R", lambda h: r, session="r"))
    for i, u in enumerate(us):
        s.steps.append(Step(f"U{i + 1}", lambda h, u=u: u))
    s.steps.append(Step("R", lambda h: r, phase="probe", session="r"))
    s.steps.append(Step("U1", lambda h: us[0], phase="probe"))
    return s


def seq_round_robin(name: str, seed: int, programs: int, first: int, grow: int, rounds: int, system: int,
                    about: str, sessions: int = 0) -> Sequence:
    """``programs`` agents in turn, ``rounds`` times: each request is the program's previous
    prompt + the engine's answer + ``grow`` new tokens (a tool's observation), after a shared
    ``system`` prompt; the first is the system prompt + ``first`` tokens. Then the probe: each
    program's last context + its answer + 1 token, program order (oldest first). The first
    ``sessions`` programs send their program id as ``session_id``."""
    rng = random.Random(seed)
    sys_ids = _ids(rng, system)
    task = {f"p{i}": _ids(rng, first) for i in range(programs)}
    obs = {(f"p{i}", r): _ids(rng, grow) for i in range(programs) for r in range(1, rounds + 1)}
    tail = {f"p{i}": _ids(rng, 1) for i in range(programs)}
    s = Sequence(name, about)
    for r in range(rounds):
        for i in range(programs):
            pid = f"p{i}"
            sid = pid if i < sessions else None
            if r == 0:
                s.steps.append(Step(f"{pid}.0", lambda h, pid=pid: sys_ids + task[pid], program=pid, session=sid))
            else:
                s.steps.append(Step(f"{pid}.{r}", lambda h, pid=pid, r=r: h[pid] + obs[(pid, r)], program=pid,
                                    session=sid))
    for i in range(programs):
        pid = f"p{i}"
        s.steps.append(Step(f"{pid}.probe", lambda h, pid=pid: h[pid] + tail[pid], max_new=1, phase="probe"))
    return s


def seq_short(pool: int, ratio: float) -> Sequence:
    """The test's sequence (tests/sglang/test_engine_hicache_calibration.py): 4 programs
    round-robin, 5 rounds, contexts growing to 0.9 of the ``pool``-token device pool, together
    past device + host when the host is up to 2.5 × the pool."""
    system, first, grow = pool // 20, int(pool * 0.30), int(pool * 0.135)
    return seq_round_robin("short", 4, programs=4, first=first, grow=grow, rounds=5, system=system,
                           about=f"4 programs round-robin, 5 rounds, contexts {system + first:,} → "
                                 f"{system + first + 4 * (grow + 4):,} (device {pool:,}, host ratio {ratio:g})")


def sequences() -> dict[str, Sequence]:
    dev = POOL
    host = int(POOL * RATIO)
    return {
        "aafa": seq_aafa(1),
        "host-refs": seq_host_refs(6),
        "rr-device": seq_round_robin(
            "rr-device", 2, programs=4, first=500, grow=300, rounds=6, system=200,
            about=f"4 programs round-robin, 6 rounds, contexts 0.7 K → 2.3 K: together past the device pool "
                  f"({dev:,}), within device + host ({dev + host:,})"),
        "rr-host": seq_round_robin(
            "rr-host", 3, programs=6, first=1400, grow=400, rounds=6, system=200,
            about=f"6 programs round-robin, 6 rounds, contexts 1.6 K → 3.6 K: together past device + host "
                  f"({dev + host:,})"),
        "rr-sessions": seq_round_robin(
            "rr-sessions", 5, programs=8, first=1200, grow=300, rounds=6, system=200, sessions=4,
            about=f"8 programs round-robin, 6 rounds, contexts 1.4 K → 2.9 K (past device + host, {dev + host:,}); "
                  "p0-p3 send a `session_id` (their KV referenced, as thunder's requests are), p4-p7 do not"),
    }


# ---- a target: one server (real or simulated) --------------------------------------------------
def metrics(url: str) -> dict[str, float]:
    """The counters of ``METRICS`` (summed over labels) and the per-source cached tokens."""
    text = httpx.get(url + "/metrics", timeout=30).text
    out: dict[str, float] = {}
    names = {v: k for k, v in METRICS.items()}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0]
        if name in names:
            key = names[name]
            if key == "storage_backup" and 'storage_backend="file"' not in head:
                continue
            out[key] = out.get(key, 0.0) + float(value)
        elif name == "sglang:cached_tokens_total" and "cache_source=" in head:
            src = head.split('cache_source="', 1)[1].split('"', 1)[0]
            out[f"cached_{src}"] = out.get(f"cached_{src}", 0.0) + float(value)
    return out


def generate(url: str, ids: list[int], max_new: int, session: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"input_ids": ids,
                            "sampling_params": {"max_new_tokens": max_new, "ignore_eos": True, "temperature": 0}}
    if session is not None:
        body["session_id"] = session
    r = httpx.post(url + "/generate", json=body, timeout=600)
    r.raise_for_status()
    out = r.json()
    if "meta_info" not in out:
        raise RuntimeError(f"generate failed: {str(out)[:300]}")
    return out


def flush(url: str) -> None:
    for _ in range(100):
        r = httpx.post(url + "/flush_cache", timeout=30)
        if r.status_code == 200:
            return
        time.sleep(0.1)
    raise RuntimeError(f"/flush_cache refused: {r.status_code} {r.text[:200]}")


def run_sequence(url: str, seq: Sequence) -> dict[str, Any]:
    flush(url)
    history: dict[str, list[int]] = {}
    rows = []
    before = metrics(url)
    for st in seq.steps:
        ids = st.build(history)
        out = generate(url, ids, st.max_new, st.session)
        meta = out["meta_info"]
        det = meta.get("cached_tokens_details") or {}
        if st.program is not None:
            history[st.program] = ids + list(out.get("output_ids") or [])
        m = metrics(url)
        rows.append({
            "label": st.label, "phase": st.phase, "prompt": len(ids), "cached": meta.get("cached_tokens", 0),
            "device": det.get("device", 0), "host": det.get("host", 0), "storage": det.get("storage", 0),
            **{k: m.get(k, 0.0) - before.get(k, 0.0) for k in ("backup", "load_back", "evicted", "storage_backup")},
            "host_used": m.get("host_used", 0.0),
        })
    # The engine books a write-through backup when it processes the copy's ack, at its next
    # scheduling step: after the last request the counter can lag by that request's backup. A
    # settling request (the last prompt again, all of it cached: nothing new to back up) makes
    # it catch up; it is sent to the simulator too, and left out of the split.
    generate(url, ids, 1, seq.steps[-1].session)
    m = metrics(url)
    final = {k: m.get(k, 0.0) - before.get(k, 0.0) for k in ("backup", "load_back", "evicted", "storage_backup")}
    return {"sequence": seq.name, "rows": rows, "final": final, "host_total": m.get("host_total", 0.0)}


@contextmanager
def real_server(policy: str, storage: bool, log_dir: Path, pool: int = POOL, ratio: float = RATIO,
                model: str = "small") -> Iterator[str]:
    """One real SGLang CPU server with HiCache (``engine serve --hicache-ratio``), stopped at the
    end; the file tier in a fresh directory, removed at the end."""
    from thunder_sgl.engine import EngineOptions, start_engines
    from thunder_sgl.engine.env import EngineEnv
    from thunder_sgl.engine.serve import HiCacheOptions

    env = EngineEnv.locate()
    with tempfile.TemporaryDirectory(prefix="hicache-store-") as tmp:
        store = Path(tmp) if storage else None
        opts = EngineOptions(model=env.model(model), max_total_tokens=pool, hicache=HiCacheOptions(ratio, policy, store))
        with start_engines(1, opts, env, log_dir) as cluster:
            yield cluster.urls[0]


def sim_config_path(policy: str, storage: bool, tmp: Path, pool: int = POOL, ratio: float = RATIO) -> Path:
    """The simulator's config for a set-up: the calibrated HiCache config with the pool, ratio
    and policy and, for the file tier, an unbounded storage tier."""
    from thunder_sgl.config import to_dict
    from thunder_sgl.sim.config import load_sim_config

    over: dict[str, Any] = {"hicache.write_policy": policy, "server.max_total_num_tokens": pool, "hicache.ratio": ratio}
    if storage:
        over.update({"hicache.storage_backend": "file", "hicache.storage_capacity_tokens": STORAGE_TOKENS})
    cfg = load_sim_config(SIM_CONFIG, over)
    path = tmp / f"{SIM_CONFIG}-{policy}{'-file' if storage else ''}.json"
    path.write_text(json.dumps(to_dict(cfg)))
    return path


@contextmanager
def sim_server(policy: str, storage: bool, log_dir: Path, pool: int = POOL, ratio: float = RATIO) -> Iterator[str]:
    """The simulator with the matching config (virtual clock at 1,000× real time), stopped at the end."""
    from thunder_sgl.benchmark.drivers.peers import start_sim

    with tempfile.TemporaryDirectory(prefix="hicache-sim-") as tmp:
        proc = start_sim(str(sim_config_path(policy, storage, Path(tmp), pool, ratio)), time_scale=1000.0,
                         log_dir=log_dir)
        try:
            yield proc.url
        finally:
            proc.stop()


# ---- comparison -------------------------------------------------------------------------------
def split(rows: list[dict[str, Any]], phase: str | None = None) -> dict[str, float]:
    rs = [r for r in rows if phase is None or r["phase"] == phase]
    prompt = sum(r["prompt"] for r in rs) or 1
    return {t: sum(r[t] for r in rs) / prompt for t in ("device", "host", "storage")}


def final(res: dict[str, Any] | None, key: str) -> str:
    """A counter over the whole sequence (after the settling request)."""
    if res is None:
        return "—"
    v = res["final"][key] if "final" in res else (res["rows"][-1][key] if res["rows"] else 0.0)
    return f"{v:,.0f}"


def same(x: dict[str, Any], y: dict[str, Any]) -> bool:
    return all(x[t] == y[t] for t in ("device", "host", "storage"))


def render(results: dict[str, dict[str, dict[str, Any]]], seqs: dict[str, Sequence]) -> str:
    """``results[target][f"{setup}/{sequence}"]`` → markdown."""
    real, sim = results.get("real", {}), results.get("sim", {})
    keys = [k for k in sim if k in real] or list(sim or real)
    lines = ["# Simulator HiCache vs SGLang 0.5.23's real HiCache (CPU)", "",
             f"Device pool {POOL:,} tokens, host ratio {RATIO:g}, page size 1, model `small` (GPT-2 256×2, random "
             f"weights), one request at a time; simulator config `{SIM_CONFIG}` with the set-up's write policy "
             "(and an unbounded storage tier for SGLang's file backend). Split = cached tokens from each tier ÷ "
             "prompt tokens over all requests of the sequence (probe included). Backup = "
             "`hicache_backup_tokens_total`, load-back = `load_back_tokens_total`, both over the sequence; "
             "storage backup = `backuped_tokens_total{storage_backend=\"file\"}`. **Transfer timing is not "
             "compared**: on a CPU SGLang's copies run inline on the scheduler thread and their duration says "
             "nothing about a GPU's PCIe link. The counters are read after a settling request (the last prompt "
             "again, nothing new to back up): SGLang books a write-through backup at its next scheduling step.", "",
             "Set-ups: `wt` write-through, `wb` write-back, `-file` with the file storage tier "
             "(`engine serve --hicache-write-policy ... --hicache-storage DIR`).", "", "Sequences:", ""]
    for s in seqs.values():
        lines.append(f"- `{s.name}`: {s.about}")
    lines += ["", "## Per-tier split, backup and load-back", "",
              "| set-up / sequence | prompt tok | device real / sim | host real / sim | storage real / sim | "
              "max abs diff | requests alike | backup real / sim | load-back real / sim | storage backup real / sim |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for k in keys:
        r, s = real.get(k), sim.get(k)
        rr = r["rows"] if r else []
        sr = s["rows"] if s else []
        a, b = split(rr), split(sr)
        diff = f"{max(abs(a[t] - b[t]) for t in a):.3f}" if r and s else "—"
        alike = f"{sum(same(x, y) for x, y in zip(rr, sr, strict=False))} of {len(rr)}" if r and s else "—"
        prompt = sum(x["prompt"] for x in (rr or sr))
        pairs = [f"{final(r, m)} / {final(s, m)}" for m in ("backup", "load_back", "storage_backup")]
        lines.append(f"| {k} | {prompt:,} | {a['device']:.3f} / {b['device']:.3f} | {a['host']:.3f} / {b['host']:.3f} | "
                     f"{a['storage']:.3f} / {b['storage']:.3f} | {diff} | {alike} | {' | '.join(pairs)} |")
    lines += ["", "## Request by request (cached tokens device/host/storage; backup and load-back so far)", ""]
    for k in keys:
        r, s = real.get(k), sim.get(k)
        rr = r["rows"] if r else []
        sr = s["rows"] if s else []
        lines += [f"### {k}", "", "| # | request | prompt | real d/h/s | sim d/h/s | real backup / load | sim backup / load | same |",
                  "|---:|---|---:|---|---|---|---|---|"]
        for i in range(max(len(rr), len(sr))):
            x = rr[i] if i < len(rr) else None
            y = sr[i] if i < len(sr) else None
            ref = x or y
            assert ref is not None

            def dhs(z: dict[str, Any] | None) -> str:
                return "—" if z is None else f"{z['device']}/{z['host']}/{z['storage']}"

            def bl(z: dict[str, Any] | None) -> str:
                return "—" if z is None else f"{z['backup']:,.0f} / {z['load_back']:,.0f}"

            alike = "" if x is None or y is None else ("yes" if same(x, y) else "**no**")
            tag = " (probe)" if ref["phase"] == "probe" else ""
            lines.append(f"| {i + 1} | {ref['label']}{tag} | {ref['prompt']:,} | {dhs(x)} | {dhs(y)} | {bl(x)} | {bl(y)} | {alike} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def per_router(real_dir: Path, sim_dirs: list[Path]) -> str:
    """Per router and N: the hits by tier of a real-mode sweep with HiCache against DES runs of
    the same sweep on the simulator (one per seed), from their results.json."""
    from thunder_sgl.benchmark.reports.sweep import load_meta, load_results, router_order

    def share(r: Any) -> tuple[float, float, float]:
        p = r.prompt_tokens or 1
        return r.cached_device_tokens / p, r.cached_host_tokens / p, r.cached_storage_tokens / p

    real = {(r.router, r.programs): r for r in load_results(real_dir)}
    sims = [{(r.router, r.programs): r for r in load_results(d)} for d in sim_dirs]
    order = router_order([k[0] for k in real])
    keys = sorted((k for k in real if all(k in x for x in sims)), key=lambda k: (k[1], order.index(k[0])))
    transient = [k for k in keys if (real[k].window_check or {}).get("warning")]
    secs = round(next(iter(real.values())).window_s)
    window = (f"{secs}-s windows, TRANSIENT in {len(transient)} of {len(keys)} real runs" if transient
              else f"{secs}-s windows, every real run's steady by the window check")
    lines = [f"# Hits by tier per router and N: {real_dir.name} (real) against the simulator", "",
             f"Real: `{load_meta(real_dir).get('command', '')}`  "]
    lines += [f"Simulated ({d.name}): `{load_meta(d).get('command', '')}`  " for d in sim_dirs]
    lines += ["", "Share of prompt tokens served from device / host (storage: none in these runs) over the "
              "measured window, the engines' own counters. The simulated runs are DES runs of the same sweep "
              "(`sim` = the first seed given, same as the real run's; `mean` and range over all seeds given): "
              f"one window's split varies with the workload's draws ({window}), so the real run is compared "
              "with the spread of simulated ones.", "",
              "| N | router | real | sim (same seed) | Δ | sim mean | Δ mean | sim range device; host | seed spread |",
              "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    agree = agree_mean = 0
    for k in keys:
        a = share(real[k])
        runs = [share(x[k]) for x in sims]
        b = runs[0]
        mean = tuple(sum(r[i] for r in runs) / len(runs) for i in range(3))
        lo = tuple(min(r[i] for r in runs) for i in range(3))
        hi = tuple(max(r[i] for r in runs) for i in range(3))
        d1 = max(abs(a[i] - b[i]) for i in range(3))
        dm = max(abs(a[i] - mean[i]) for i in range(3))
        spread = max(hi[i] - lo[i] for i in range(3))
        agree += d1 <= 0.05
        agree_mean += dm <= 0.05
        lines.append(f"| {k[1]} | {k[0]} | {a[0]:.2f} / {a[1]:.2f} | {b[0]:.2f} / {b[1]:.2f} | {d1:.2f} | "
                     f"{mean[0]:.2f} / {mean[1]:.2f} | {dm:.2f} | {lo[0]:.2f}–{hi[0]:.2f}; {lo[1]:.2f}–{hi[1]:.2f} | "
                     f"{spread:.2f} |")
    lines += ["", f"Within 0.05 of the simulator at the same seed: {agree} of {len(keys)} cells; of the simulator's "
              f"mean over {len(sims)} seeds: {agree_mean} of {len(keys)}."]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default="real,sim")
    ap.add_argument("--setups", default=",".join(SETUPS))
    ap.add_argument("--sequences", default=",".join(sequences()))
    ap.add_argument("--real-from", type=Path, help="raw.json of an earlier run: its real results, not re-measured")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--per-router", nargs="+", type=Path, metavar="DIR",
                    help="only write per-router.md: a real-mode HiCache sweep's results dir, then DES runs of it")
    args = ap.parse_args()
    if args.per_router:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "per-router.md").write_text(per_router(args.per_router[0], args.per_router[1:]))
        print(args.out / "per-router.md")
        return 0
    seqs_all = sequences()
    seqs = {n: seqs_all[n] for n in args.sequences.split(",")}
    setups = args.setups.split(",")
    targets = args.targets.split(",")
    results: dict[str, dict[str, Any]] = {}
    if args.real_from:
        results["real"] = json.loads(args.real_from.read_text())["real"]
    args.out.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="hicache-calibrate-logs-"))
    for target in targets:
        if target == "real" and args.real_from:
            continue
        server = real_server if target == "real" else sim_server
        for setup in setups:
            policy, storage = SETUPS[setup]
            t0 = time.monotonic()
            with server(policy, storage, logs) as url:
                for seq in seqs.values():
                    results.setdefault(target, {})[f"{setup}/{seq.name}"] = run_sequence(url, seq)
            print(f"{target} {setup}: {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    (args.out / "raw.json").write_text(json.dumps(results, indent=1))
    (args.out / "table.md").write_text(render(results, seqs))
    (args.out / "command.txt").write_text("python " + " ".join(shlex.quote(a) for a in sys.argv) + "\n")
    print(args.out / "table.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
