"""Iteration times from the roofline formulas of calibration.md (§5 decode, §6 prefill, §7 HiCache),
or from coefficients fitted to a real engine (``timing.kind: fitted``).

Pure functions over a ``Roofline`` (constants precomputed from a SimConfig)::

    τ_dec(B, K)  = t0 + [W_touched(B) + K·b_kv] / (η·BW_HBM) + n_AR·t_AR  (+ B·per_request)
    W_touched(B) = W_dense + W_experts·(1 − (1 − k/E)^B)            (dense: W_touched = W)
    FLOPs(n | c) = 2·P_act·n + 4·L·(n_q·d_h)·(n·c + n²/2)
    t_prefill    = FLOPs / (MFU · F_peak · TP)                      (+ prefill_fixed per iteration)
    t_load       = tokens·b_kv / BW_h2d   (+ tokens·b_kv / BW_storage for L3 hits)

A fitted config gives the same shapes directly in seconds: the decode iteration
``d0 + d_req·B + d_kv·K`` and the prefill ``p0 + p_tok·n + p_attn·(n·c + n²/2)``, plus, for
SGLang's ``torch_native`` backend, ``p_seq·(c + n)²/2`` (attention over the whole sequence); the roofline is
the case ``d_req = 0``, ``d_kv = b_kv/(η·BW)``, ``p_tok = 2·P_act/(MFU·F·TP)``, ``p_attn = 4·L·n_q·d_h/(MFU·F·TP)``.

All bytes are per GPU: every GPU of the TP group reads its shard in parallel. A decode span of n
steps with a constant batch of B requests has K growing by B per step, so its duration has the
closed form ``n·τ(B, K0) + q·n(n−1)/2`` with ``q = B·b_kv/(η·BW)``: the engine jumps over it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from thunder_sgl.sim.config import SimConfig

GB = 1e9


@dataclass(frozen=True, slots=True)
class Roofline:
    t_fixed: float
    """t0 + n_AR·t_AR: the per-iteration overhead."""
    t0: float
    inv_bw: float
    """1 / (η·BW_HBM) in s/byte."""
    w_dense: float
    """Bytes per GPU read every step."""
    w_experts: float
    """Routed-expert bytes per GPU."""
    keep: float
    """1 − k/E: probability that one token leaves a given expert untouched."""
    kv_bytes: int
    """b_kv per GPU."""
    kv_cost: float
    """Seconds per token of KV the batch holds, per decode step (b_kv / (η·BW))."""
    per_request: float
    """Seconds per running request per decode step (0 in the roofline)."""
    token_cost: float
    """Seconds per new prefill token (2·P_act / (MFU·F·TP))."""
    attn_cost: float
    """Seconds per unit of n·c + n²/2 in prefill (4·L·n_q·d_h / (MFU·F·TP))."""
    prefill_fixed: float
    """Seconds added to an iteration that prefills (0 in the roofline)."""
    seq_attn_cost: float
    """Seconds per unit of (c + n)²/2: attention over the whole sequence (torch_native; 0 in
    the roofline)."""
    h2d_bw: float
    storage_bw: float
    load_overlap: float

    @classmethod
    def from_config(cls, cfg: SimConfig) -> Roofline:
        m, hw, t, s = cfg.model, cfg.hardware, cfg.timing, cfg.server
        if t.kind == "fitted":
            return cls(t_fixed=t.decode_fixed_s, t0=t.decode_fixed_s, inv_bw=0.0, w_dense=0.0, w_experts=0.0,
                       keep=0.0, kv_bytes=cfg.kv_bytes_per_token, kv_cost=t.decode_per_kv_token_s,
                       per_request=t.decode_per_request_s, token_cost=t.prefill_per_token_s,
                       attn_cost=t.prefill_per_attention_s, prefill_fixed=t.prefill_fixed_s,
                       seq_attn_cost=t.prefill_per_sequence_attention_s,
                       h2d_bw=hw.host_to_device_gbps * GB, storage_bw=hw.storage_to_host_gbps * GB,
                       load_overlap=t.load_back_overlap)
        tp = s.tp_size
        wb = m.weight_bytes_per_param
        n_ar = 2 * m.num_layers if tp > 1 else 0
        moe = m.expert_params_b > 0
        inv_bw = 1.0 / (t.eta * hw.hbm_bandwidth_gbps * GB)
        inv_flops = 1.0 / (t.mfu * hw.peak_tflops * 1e12 * tp)
        return cls(
            t_fixed=t.t0_s + n_ar * t.allreduce_s,
            t0=t.t0_s,
            inv_bw=inv_bw,
            w_dense=m.dense_params_b * 1e9 * wb / tp,
            w_experts=m.expert_params_b * 1e9 * wb / tp if moe else 0.0,
            keep=(1.0 - m.experts_per_token / m.num_experts) if moe else 0.0,
            kv_bytes=cfg.kv_bytes_per_token,
            kv_cost=cfg.kv_bytes_per_token * inv_bw,
            per_request=0.0,
            token_cost=2.0 * m.params_active_b * 1e9 * inv_flops,
            attn_cost=4.0 * m.num_layers * m.num_attention_heads * m.head_dim * inv_flops,
            prefill_fixed=0.0,
            seq_attn_cost=0.0,
            h2d_bw=hw.host_to_device_gbps * GB,
            storage_bw=hw.storage_to_host_gbps * GB,
            load_overlap=t.load_back_overlap,
        )


def weights_touched(r: Roofline, batch: int) -> float:
    """Weight bytes per GPU one decode step reads with ``batch`` requests."""
    if r.w_experts == 0.0 or batch <= 0:
        return r.w_dense
    return r.w_dense + r.w_experts * (1.0 - r.keep**batch)


def decode_step(r: Roofline, batch: int, kv_tokens: int) -> float:
    """τ_dec(B, K): one decode iteration of ``batch`` requests reading ``kv_tokens`` of context."""
    return r.t_fixed + weights_touched(r, batch) * r.inv_bw + kv_tokens * r.kv_cost + batch * r.per_request


def decode_growth(r: Roofline, batch: int) -> float:
    """q: how much each further step of a constant batch is slower (K grows by B per step)."""
    return batch * r.kv_cost


def span(a: float, q: float, steps: int) -> float:
    """Duration of ``steps`` steps whose first takes ``a`` and each next ``q`` longer."""
    return steps * a + q * steps * (steps - 1) / 2.0


def steps_within(a: float, q: float, budget: float, max_steps: int) -> int:
    """Largest n ≤ max_steps with span(a, q, n) ≤ budget (0 if even one step does not fit)."""
    if budget < a:
        return 0
    if q <= 0.0:
        n = int(budget / a)
    else:
        b = a - q / 2.0
        n = int((-b + math.sqrt(b * b + 2.0 * q * budget)) / q)
    n = min(max(n, 0), max_steps)
    while n > 0 and span(a, q, n) > budget:
        n -= 1
    while n < max_steps and span(a, q, n + 1) <= budget:
        n += 1
    return n


def prefill_seconds(r: Roofline, new_tokens: int, prefix: int) -> float:
    """Compute time of a prefill chunk: n new tokens attending to a cached prefix of c tokens
    and to each other (chunks of several requests add up)."""
    if new_tokens <= 0:
        return 0.0
    n = float(new_tokens)
    t = r.token_cost * n + r.attn_cost * (n * prefix + n * n / 2.0)
    if r.seq_attn_cost:
        s = n + prefix
        t += r.seq_attn_cost * s * s / 2.0
    return t


def h2d_seconds(r: Roofline, tokens: int) -> float:
    """Host→device copy of ``tokens`` of KV (the part SGLang overlaps with the forward pass)."""
    return tokens * r.kv_bytes / r.h2d_bw


def storage_fetch_seconds(r: Roofline, tokens: int) -> float:
    """Storage→host read of L3 hits (done before the iteration: never hidden behind compute)."""
    return tokens * r.kv_bytes / r.storage_bw


def iteration_seconds(r: Roofline, batch: int, kv_tokens: int, prefill_s: float, load_s: float,
                      fetch_s: float = 0.0) -> float:
    """One iteration: a decode step of ``batch`` requests (if any), the prefill chunks of this
    iteration, the part of the host→device load-back ``load_s`` not hidden behind compute
    (layer-wise overlap), and the storage→host reads ``fetch_s`` in full."""
    base = decode_step(r, batch, kv_tokens) if batch > 0 else r.t_fixed
    if prefill_s > 0:
        prefill_s += r.prefill_fixed
    compute = base - r.t0 + prefill_s
    hidden = min(load_s, r.load_overlap * compute)
    return base + prefill_s + load_s - hidden + fetch_s
