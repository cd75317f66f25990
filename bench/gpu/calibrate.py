"""Calibration micro-benchmarks for the simulator's estimated constants (calibration.md §5-§7).

Run on a machine with one NVIDIA GPU (we had an H200 for a few minutes; no model weights can be
downloaded, so everything uses random tensors shaped like GLM-4.6-FP8 at TP8):

    python bench/gpu/calibrate.py --out calib.json

It measures, each as the median of timed repetitions after warm-up:
  1. eta_stream: achieved fraction of peak HBM bandwidth for a large streaming read (sum).
  2. eta_weights(B): a decode step's weight reads — B tokens × GLM-4.6 TP8 attention+expert
     GEMMs (bf16 stand-in for FP8 weights: same bytes per element class is what matters is
     bytes moved; we report achieved bandwidth = bytes / time).
  3. eta_kv(B, c): decode attention over the KV cache (1 KV head, 12 query heads, d=128 per GPU,
     as GLM-4.6 at TP8) via SDPA, one layer, reported as achieved KV-read bandwidth.
  4. mfu_fp8 / mfu_bf16: dense GEMM throughput for an 8192-token prefill chunk
     (8192 × 5120 × 12288) vs the datasheet peak.
  5. mfu_attn_prefill: causal attention of an 8192-token chunk over a prefix of 0 / 32K tokens.
  6. h2d_gbps: pinned host→device copy bandwidth (HiCache load-back upper bound), 1 GiB.
  7. launch_us: per-kernel launch overhead of a tiny kernel (an input to t0).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def timed(fn, reps: int = 20, warm: int = 3) -> float:
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) / 1e3)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="calib.json")
    ap.add_argument("--peak-bw", type=float, default=4.8e12, help="datasheet HBM bandwidth, bytes/s (H200: 4.8 TB/s)")
    ap.add_argument("--peak-bf16", type=float, default=989e12)
    ap.add_argument("--peak-fp8", type=float, default=1979e12)
    args = ap.parse_args()
    dev = torch.device("cuda")
    res: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                 "peak_bw": args.peak_bw, "peak_bf16": args.peak_bf16, "peak_fp8": args.peak_fp8}
    t_start = time.time()

    # 1. streaming read
    x = torch.empty(8 * 2**30 // 2, dtype=torch.bfloat16, device=dev).normal_()
    t = timed(lambda x=x: x.sum(), reps=10)
    res["eta_stream"] = (x.numel() * 2 / t) / args.peak_bw
    res["stream_tbps"] = x.numel() * 2 / t / 1e12
    del x

    # 2. decode weight reads: GLM-4.6 per GPU at TP8 ≈ 4 GB touched at B=1 .. ≈ 45 GB at B>=64.
    #    Stand-in: a stack of [5120 x N] bf16 matrices totalling W bytes, multiplied by [B, 5120].
    hidden = 5120
    for total_gb in (4.0, 16.0, 40.0):
        n_cols = 12288
        per = hidden * n_cols * 2
        k = max(1, int(total_gb * 1e9 / per))
        ws = [torch.empty(hidden, n_cols, dtype=torch.bfloat16, device=dev).normal_() for _ in range(k)]
        for b in (1, 64):
            a = torch.empty(b, hidden, dtype=torch.bfloat16, device=dev).normal_()
            t = timed(lambda a=a, ws=ws: [a @ w for w in ws], reps=10)
            res[f"eta_weights_{int(total_gb)}GB_B{b}"] = (k * per / t) / args.peak_bw
            res[f"weights_{int(total_gb)}GB_B{b}_ms"] = t * 1e3
        del ws
        torch.cuda.empty_cache()

    # 3. decode attention over KV: GLM-4.6 TP8 per GPU: 12 q heads, 1 kv head, d = 128.
    for b, c in ((16, 8192), (64, 16384), (64, 32768)):
        q = torch.randn(b, 12, 1, 128, dtype=torch.bfloat16, device=dev)
        kv = torch.randn(b, 1, c, 128, dtype=torch.bfloat16, device=dev)
        kk = kv.expand(b, 12, c, 128)
        t = timed(lambda q=q, kk=kk: torch.nn.functional.scaled_dot_product_attention(q, kk, kk), reps=10)
        kv_bytes = 2 * b * c * 128 * 2  # K and V, bf16, one kv head
        res[f"eta_kv_B{b}_c{c}"] = (kv_bytes / t) / args.peak_bw
        res[f"kv_B{b}_c{c}_ms_per_layer"] = t * 1e3
        del q, kv, kk
    torch.cuda.empty_cache()

    # 4. prefill GEMM: 8192-token chunk × (5120 -> 12288)
    m, kdim, n = 8192, 5120, 12288
    a = torch.randn(m, kdim, dtype=torch.bfloat16, device=dev)
    w = torch.randn(kdim, n, dtype=torch.bfloat16, device=dev)
    t = timed(lambda a=a, w=w: a @ w)
    res["mfu_bf16_gemm"] = (2 * m * kdim * n / t) / args.peak_bf16
    try:
        a8 = a.to(torch.float8_e4m3fn)
        w8 = w.t().contiguous().to(torch.float8_e4m3fn).t()
        one = torch.tensor(1.0, device=dev)
        t = timed(lambda: torch._scaled_mm(a8, w8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
        res["mfu_fp8_gemm"] = (2 * m * kdim * n / t) / args.peak_fp8
    except Exception as e:  # noqa: BLE001
        res["mfu_fp8_gemm_error"] = repr(e)
    del a, w
    torch.cuda.empty_cache()

    # 5. prefill attention: 8192 new tokens (12 heads, d=128) over prefix c (1 kv head expanded)
    for prefix in (0, 32768):
        n_new = 8192
        q = torch.randn(1, 12, n_new, 128, dtype=torch.bfloat16, device=dev)
        kv = torch.randn(1, 1, prefix + n_new, 128, dtype=torch.bfloat16, device=dev).expand(1, 12, prefix + n_new, 128)
        if prefix == 0:
            fn = lambda q=q, kv=kv: torch.nn.functional.scaled_dot_product_attention(q, kv, kv, is_causal=True)  # noqa: E731
            flops = 4 * 12 * 128 * (n_new * n_new / 2)
        else:
            fn = lambda q=q, kv=kv: torch.nn.functional.scaled_dot_product_attention(q, kv, kv)  # noqa: E731
            flops = 4 * 12 * 128 * (n_new * (prefix + n_new))
        t = timed(fn, reps=10)
        res[f"mfu_attn_prefill_prefix{prefix}"] = (flops / t) / args.peak_bf16
        res[f"attn_prefill_prefix{prefix}_ms_per_layer"] = t * 1e3
        del q, kv
    torch.cuda.empty_cache()

    # 6. host -> device, pinned, 1 GiB
    h = torch.empty(2**30, dtype=torch.uint8).pin_memory()
    d = torch.empty(2**30, dtype=torch.uint8, device=dev)
    t = timed(lambda d=d, h=h: d.copy_(h, non_blocking=True), reps=10)
    res["h2d_gbps"] = 2**30 / t / 1e9
    t = timed(lambda d=d, h=h: h.copy_(d, non_blocking=True), reps=10)
    res["d2h_gbps"] = 2**30 / t / 1e9
    del h, d

    # 7. launch overhead
    z = torch.zeros(1, device=dev)
    t = timed(lambda: [z.add_(1) for _ in range(1000)], reps=5)
    res["launch_us"] = t / 1000 * 1e6
    res["seconds"] = time.time() - t_start
    print(json.dumps(res, indent=1))
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
