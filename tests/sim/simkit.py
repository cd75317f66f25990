"""Shared helpers of the simulator tests (imported as ``simkit``; tests/sim is on sys.path).

``unit_config`` is a toy model chosen so every time is easy to derive by hand:

- b_kv = 2 (K, V) × 1 layer × 1 KV head × 128 × 2 bytes = 512 B per token
- decode step  τ(B, K) = t0 + (W + K·b_kv)/(η·BW) = 0.001 + (1e9 + 512·K)/1e12 = 0.002 + 5.12e-10·K
- iteration without decode: t0 = 0.001 (no all-reduce at TP1)
- prefill(n | c) = (2·P·n + 4·L·n_q·d_h·(n·c + n²/2)) / (MFU·F) = 2e-6·n + 5.12e-13·(n·c + n²/2)
- host load-back of n tokens = n·512 / 1e9 s;  storage adds n·512 / 0.5e9 s
"""

from __future__ import annotations

from array import array

from thunder_sgl.sim import Completion, SimConfig
from thunder_sgl.sim.engine import Engine

UNIT = {
    "model.num_layers": 1,
    "model.num_attention_heads": 1,
    "model.num_kv_heads": 1,
    "model.head_dim": 128,
    "model.params_active_b": 1.0,
    "model.dense_params_b": 1.0,
    "model.weight_bytes_per_param": 1.0,
    "model.kv_bytes_per_element": 2.0,
    "model.context_length": 1_000_000,
    "hardware.hbm_bandwidth_gbps": 1000.0,
    "hardware.peak_tflops": 1000.0,
    "hardware.host_to_device_gbps": 1.0,
    "hardware.storage_to_host_gbps": 0.5,
    "timing.eta": 1.0,
    "timing.t0_s": 0.001,
    "timing.allreduce_s": 0.0,
    "timing.mfu": 1.0,
    "server.tp_size": 1,
    "server.page_size": 1,
    "server.max_total_num_tokens": 10_000,
    "server.chunked_prefill_size": 8192,
    "server.max_running_requests": 64,
}


def unit_config(**overrides: object) -> SimConfig:
    """The toy config, with dotted overrides given as keyword ``server__page_size=64``."""
    dotted = dict(UNIT)
    dotted.update({k.replace("__", "."): v for k, v in overrides.items()})
    return SimConfig().with_overrides(dotted)


def tau(kv: int, batch: int = 1) -> float:
    return 0.001 + (1e9 + 512 * kv) / 1e12 if batch else 0.001


def prefill(n: int, c: int = 0) -> float:
    return 2e-6 * n + 5.12e-13 * (n * c + n * n / 2)


def tokens(n: int, start: int = 1 << 24) -> array:
    """n distinct token ids (distinct prompts use distinct ``start``)."""
    return array("I", range(start, start + n))


def drain(engine: Engine, until: float = float("inf")) -> list[Completion]:
    out: list[Completion] = []
    while (t := engine.next_event_time()) is not None and t <= until:
        out += engine.advance(t)
    if until != float("inf"):
        out += engine.advance(until)
    return out
