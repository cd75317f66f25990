"""Measure a real SGLang CPU engine's costs and write a simulator config calibrated to them.

    python bench/real/calibrate.py --model small [--max-total-tokens 24576] [--reps 2]

Starts one server of the model (``thunder-sgl engine prepare`` first) and, with nothing else
running on it, measures with SGLang's own accounting (``/v1/loads``: ``total_prefill_busy_us``,
``total_prefill_uncached_tokens``, ``decode_moments``), so HTTP and client time never count:

- **prefill**: n new tokens after a cached prefix of c tokens, one request at a time, for a grid
  of (n, c); the prefix is sent first so that it is cached. Fit (non-negative least squares over
  the fastest of the repetitions, seconds):
  ``t = p0 + p_tok·n + p_attn·(n·c + n²/2) + p_seq·(c + n)²/2`` — linear layers, attention of
  the new tokens (calibration.md §6), and attention over the *whole* sequence: SGLang's
  ``torch_native`` backend runs the extend step as one causal attention over prefix + new tokens
  (``_run_sdpa_forward_extend`` builds a "redundant" query of the full length), so on the CPU a
  cached prefix saves the linear layers but not its attention.
- **decode**: B requests of context c each generating together, for a grid of (B, c). Fit, per
  iteration: ``t = d0 + d_req·B + d_kv·K`` with K the tokens held by the batch — on the CPU
  with ``torch_native`` attention the K term dominates (decode is KV-bound).

Requests are ``/generate`` with ``input_ids`` (exact token counts, random ids: no two requests
share a prefix) and ``ignore_eos``. Writes ``bench/results/calibration-cpu-<model>/``
(``measurements.json``, ``fit.md``, ``command.txt``) and
``thunder_sgl/configs/sim/sglang-cpu-gpt2-<model>.yaml`` (timing from the fit, server and
model from the engine's ``/server_info``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from thunder_sgl.engine import EngineOptions, start_engines
from thunder_sgl.engine.env import EngineEnv
from thunder_sgl.engine.models import MODEL_SIZES

ROOT = Path(__file__).resolve().parents[2]
PREFILL_GRID = [(n, c) for c in (0, 1024, 4096, 8192) for n in (64, 256, 1024, 2048, 4096)]
DECODE_GRID = [(b, c) for b in (1, 2, 4, 8, 16) for c in (256, 1024, 2048, 4096)]
DECODE_TOKENS = 32
SETTLE_S = 0.5
"""Pause before reading the counters: SGLang books a batch's time when it processes its result."""


class Engine:
    def __init__(self, url: str, http: aiohttp.ClientSession, vocab: int, rng: random.Random) -> None:
        self.url, self.http, self.vocab, self.rng = url, http, vocab, rng

    def ids(self, n: int) -> list[int]:
        return [self.rng.randrange(3, self.vocab) for _ in range(n)]

    async def loads(self) -> dict[str, Any]:
        async with self.http.get(self.url + "/v1/loads") as r:
            return (await r.json())["loads"][0]

    async def generate(self, ids: list[int], new_tokens: int) -> dict[str, Any]:
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": new_tokens, "ignore_eos": True, "temperature": 0}}
        async with self.http.post(self.url + "/generate", json=body) as r:
            out = await r.json()
        if "meta_info" not in out:
            raise RuntimeError(f"generate failed: {str(out)[:300]}")
        return out["meta_info"]

    async def idle(self) -> None:
        for _ in range(600):
            x = await self.loads()
            if x["num_running_reqs"] == 0 and x["num_waiting_reqs"] == 0:
                return
            await asyncio.sleep(0.1)
        raise TimeoutError("engine never became idle")

    async def flush(self) -> None:
        await self.idle()
        async with self.http.post(self.url + "/flush_cache") as r:
            await r.read()


def _moments(x: dict[str, Any]) -> np.ndarray:
    return np.array(x.get("decode_moments") or [0.0] * 6, dtype=float)


async def measure_prefill(e: Engine, n: int, c: int) -> dict[str, float]:
    await e.flush()
    prefix = e.ids(c)
    if c:
        await e.generate(prefix, 1)
    await e.idle()
    await asyncio.sleep(SETTLE_S)
    before = await e.loads()
    meta = await e.generate(prefix + e.ids(n), 1)
    await asyncio.sleep(SETTLE_S)  # the scheduler books a batch's time after sending its result
    after = await e.loads()
    busy = (after["total_prefill_busy_us"] - before["total_prefill_busy_us"]) / 1e6
    tokens = after["total_prefill_uncached_tokens"] - before["total_prefill_uncached_tokens"]
    return {"new": n, "prefix": c, "seconds": busy, "uncached_tokens": tokens, "cached": meta.get("cached_tokens", 0)}


async def measure_decode(e: Engine, b: int, c: int) -> dict[str, float]:
    await e.flush()
    await asyncio.sleep(SETTLE_S)
    before = await e.loads()
    t0 = time.monotonic()
    await asyncio.gather(*(e.generate(e.ids(c), DECODE_TOKENS) for _ in range(b)))
    wall = time.monotonic() - t0
    await asyncio.sleep(SETTLE_S)
    after = await e.loads()
    d = _moments(after) - _moments(before)
    n, sum_b, sum_t = d[0], d[1], d[2] / 1e6
    mean_b = sum_b / n if n else 0.0
    return {"batch": b, "context": c, "iterations": n, "mean_batch": mean_b, "seconds_per_iteration": sum_t / n if n else 0.0,
            "kv_tokens": mean_b * (c + DECODE_TOKENS / 2), "sum_bt": d[4] / 1e6, "sum_b2": d[3],
            "wall_s": wall, "prefill_s": (after["total_prefill_busy_us"] - before["total_prefill_busy_us"]) / 1e6}


def fastest(rows: list[dict[str, float]], key: tuple[str, str], value: str) -> list[dict[str, float]]:
    """One row per grid point: the fastest repetition (the engine's own cost, least disturbed
    by whatever else the machine did meanwhile)."""
    best: dict[tuple[float, float], dict[str, float]] = {}
    for r in rows:
        k = (r[key[0]], r[key[1]])
        if k not in best or r[value] < best[k][value]:
            best[k] = r
    return list(best.values())


def nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with coefficients ≥ 0 (drop the most negative feature and refit)."""
    keep = list(range(a.shape[1]))
    while True:
        coef, *_ = np.linalg.lstsq(a[:, keep], y, rcond=None)
        if (coef >= 0).all() or len(keep) == 1:
            out = np.zeros(a.shape[1])
            out[keep] = np.maximum(coef, 0.0)
            return out
        del keep[int(np.argmin(coef))]


def prefill_features(n: float, c: float) -> list[float]:
    return [1.0, n, n * c + n * n / 2, (c + n) ** 2 / 2]


def fit_prefill(rows: list[dict[str, float]]) -> dict[str, float]:
    rows = fastest(rows, ("new", "prefix"), "seconds")
    y = np.array([r["seconds"] for r in rows])
    if np.any(y <= 0):
        raise RuntimeError("a prefill measured 0 s: the engine's counters were read before they were booked")
    a = np.array([prefill_features(r["new"], r["prefix"]) for r in rows])
    coef = nnls(a / y[:, None], np.ones_like(y))  # relative error: short and long prefills count alike
    pred = a @ coef
    return {"p0_s": float(coef[0]), "per_token_s": float(coef[1]), "per_attention_s": float(coef[2]),
            "per_sequence_attention_s": float(coef[3]), "max_rel_error": float(np.max(np.abs(pred - y) / y)),
            "median_rel_error": float(np.median(np.abs(pred - y) / y))}


def fit_decode(rows: list[dict[str, float]]) -> dict[str, float]:
    rows = fastest(rows, ("batch", "context"), "seconds_per_iteration")
    a = np.array([[1.0, r["mean_batch"], r["kv_tokens"]] for r in rows])
    y = np.array([r["seconds_per_iteration"] for r in rows])
    coef = nnls(a / y[:, None], np.ones_like(y))
    pred = a @ coef
    return {"d0_s": float(coef[0]), "per_request_s": float(coef[1]), "per_kv_token_s": float(coef[2]),
            "max_rel_error": float(np.max(np.abs(pred - y) / y)), "median_rel_error": float(np.median(np.abs(pred - y) / y))}


def sim_config(model: str, info: dict[str, Any], pre: dict[str, float], dec: dict[str, float], out: Path,
               name: str = "") -> str:
    size = MODEL_SIZES[model]
    return f"""# A real SGLang 0.5.23 CPU server (2 cores) serving the random-weight GPT-2 model "{model}"
# ({size.width} wide x {size.layers} layers), calibrated by bench/real/calibrate.py — every timing
# constant below is a least-squares fit to the engine's own accounting; the measurements and the
# fit quality are in {out.relative_to(ROOT)}/. Server numbers are the engine's /server_info.
name: sglang-cpu-gpt2-{name or model}
model:
  model_path: {info.get("model_path") or f"gpt2-{model}-s0"}
  architectures: [GPT2LMHeadModel]
  model_type: gpt2
  num_layers: {size.layers}
  num_attention_heads: {size.heads}
  num_kv_heads: {size.heads}
  head_dim: {size.width // size.heads}
  hidden_size: {size.width}
  context_length: {info.get("context_length") or 16384}
  # How this tokenizer and random-weight model size an agent's requests (not measured here:
  # python bench/real/retokenize_check.py over real benchmark runs, 2026-12-03, small model)
  text_tokens_per_nominal: 1.027
  reply_tokens_per_output: 1.31
hardware:
  gpu_name: cpu-2-cores      # reported only
timing:
  kind: fitted               # measured, not the roofline: calibration.md's GPU formulas do not apply
  decode_fixed_s: {dec["d0_s"]:.6g}        # per decode iteration
  decode_per_request_s: {dec["per_request_s"]:.6g}   # per running request per iteration
  decode_per_kv_token_s: {dec["per_kv_token_s"]:.6g}  # per token of KV the batch holds, per iteration
  prefill_fixed_s: {pre["p0_s"]:.6g}       # per prefill iteration
  prefill_per_token_s: {pre["per_token_s"]:.6g}     # per new token (linear layers)
  prefill_per_attention_s: {pre["per_attention_s"]:.6g} # per unit of n·c + n²/2 (attention of the new tokens)
  prefill_per_sequence_attention_s: {pre["per_sequence_attention_s"]:.6g}  # per unit of (c + n)²/2 (torch_native: attention over the whole sequence)
server:
  enable_session_radix_cache: true  # thunder-sgl engine serve starts SGLang with it
  max_total_num_tokens: {info["max_total_num_tokens"]}
  chunked_prefill_size: {info["chunked_prefill_size"]}
  max_prefill_tokens: {info["max_prefill_tokens"]}
  page_size: {info["page_size"]}
  max_running_requests: {info.get("max_running_requests") or 2048}
  tp_size: 1
  dp_size: 1
"""


async def run(args: argparse.Namespace) -> None:
    out = ROOT / "bench" / "results" / f"calibration-cpu-{args.name or args.model}"
    if args.refit:
        saved = json.loads((out / "measurements.json").read_text())
        write(args, out, saved["server_info"], saved["prefill"], saved["decode"])
        return
    env = EngineEnv.locate()
    model_dir = env.model(args.model)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "command.txt").write_text("python bench/real/calibrate.py " + " ".join(map(shlex.quote, sys.argv[1:])) + "\n")
    with start_engines(1, EngineOptions(model=model_dir, max_total_tokens=args.max_total_tokens,
                                        threads=args.threads)) as cluster:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as http:
            e = Engine(cluster.urls[0], http, vocab, random.Random(args.seed))
            async with http.get(e.url + "/server_info") as r:
                info = await r.json()
            await e.generate(e.ids(512), 8)  # warm-up
            prefill, decode = [], []
            t0 = time.monotonic()
            for rep in range(args.reps):
                for n, c in PREFILL_GRID:
                    if n + c <= args.max_total_tokens // 2:
                        prefill.append(await measure_prefill(e, n, c))
                        print(f"[{time.monotonic() - t0:5.0f} s] prefill rep {rep} n={n} c={c}: {prefill[-1]['seconds']:.3f} s", flush=True)
                for b, c in DECODE_GRID:
                    if b * (c + DECODE_TOKENS) <= args.max_total_tokens * 0.9:
                        decode.append(await measure_decode(e, b, c))
                        d = decode[-1]
                        print(f"[{time.monotonic() - t0:5.0f} s] decode rep {rep} B={b} c={c}: "
                              f"{1000 * d['seconds_per_iteration']:.1f} ms/iteration over {d['iterations']:.0f}", flush=True)
    keep = ("version", "max_total_num_tokens", "chunked_prefill_size", "max_prefill_tokens", "page_size",
            "context_length", "dtype", "kv_cache_dtype", "attention_backend", "schedule_policy", "model_path",
            "max_running_requests")
    write(args, out, {k: info.get(k) for k in keep}, prefill, decode)


def write(args: argparse.Namespace, out: Path, info: dict[str, Any], prefill: list[dict[str, float]],
          decode: list[dict[str, float]]) -> None:
    pre, dec = fit_prefill(prefill), fit_decode(decode)
    (out / "measurements.json").write_text(json.dumps(
        {"model": args.model, "max_total_tokens": args.max_total_tokens, "prefill": prefill, "decode": decode,
         "fit": {"prefill": pre, "decode": dec}, "server_info": info}, indent=1) + "\n")
    lines = [f"# Calibration of the SGLang CPU engine, model {args.model}", "",
             f"Command: `{(out / 'command.txt').read_text().strip()}`", "",
             "Each grid point's fastest repetition; fits are non-negative least squares on relative error.", "",
             "## Prefill: t = p0 + p_tok·n + p_attn·(n·c + n²/2) + p_seq·(c + n)²/2", "",
             f"p0 = {pre['p0_s'] * 1e3:.2f} ms, p_tok = {pre['per_token_s'] * 1e6:.1f} µs/token, "
             f"p_attn = {pre['per_attention_s'] * 1e9:.3f} ns, p_seq = {pre['per_sequence_attention_s'] * 1e9:.3f} ns; "
             f"relative error median {pre['median_rel_error']:.0%}, largest {pre['max_rel_error']:.0%}", "",
             "| new n | prefix c | measured s (fastest) | fitted s |", "|---:|---:|---:|---:|"]
    pc = np.array([pre["p0_s"], pre["per_token_s"], pre["per_attention_s"], pre["per_sequence_attention_s"]])
    for r in sorted(fastest(prefill, ("new", "prefix"), "seconds"), key=lambda r: (r["prefix"], r["new"])):
        fitted = float(np.dot(prefill_features(r["new"], r["prefix"]), pc))
        lines.append(f"| {r['new']} | {r['prefix']} | {r['seconds']:.3f} | {fitted:.3f} |")
    lines += ["", "## Decode iteration: t = d0 + d_req·B + d_kv·K", "",
              f"d0 = {dec['d0_s'] * 1e3:.2f} ms, d_req = {dec['per_request_s'] * 1e3:.3f} ms, "
              f"d_kv = {dec['per_kv_token_s'] * 1e6:.3f} µs/token; relative error median {dec['median_rel_error']:.0%}, "
              f"largest {dec['max_rel_error']:.0%}", "",
              "| B | context c | K | measured ms (fastest) | fitted ms |", "|---:|---:|---:|---:|---:|"]
    for r in sorted(fastest(decode, ("batch", "context"), "seconds_per_iteration"), key=lambda r: (r["batch"], r["context"])):
        fitted = dec["d0_s"] + dec["per_request_s"] * r["mean_batch"] + dec["per_kv_token_s"] * r["kv_tokens"]
        lines.append(f"| {r['batch']} | {r['context']} | {r['kv_tokens']:.0f} | {1e3 * r['seconds_per_iteration']:.1f} | {1e3 * fitted:.1f} |")
    (out / "fit.md").write_text("\n".join(lines) + "\n")
    cfg = ROOT / "thunder_sgl" / "configs" / "sim" / f"sglang-cpu-gpt2-{args.name or args.model}.yaml"
    cfg.write_text(sim_config(args.model, info, pre, dec, out, args.name))
    print(f"wrote {out}/fit.md and {cfg}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="small", choices=sorted(MODEL_SIZES))
    ap.add_argument("--max-total-tokens", type=int, default=24576)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--refit", action="store_true", help="fit again from the saved measurements.json (no engine)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads of the server (default: all cores)")
    ap.add_argument("--name", default="", help="results directory suffix (default: the model)")
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
