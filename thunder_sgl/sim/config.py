"""Typed, frozen configuration of one simulated SGLang worker (``configs/sim/*.yaml``).

Sections mirror where a number comes from: ``model`` (the checkpoint's architecture),
``hardware`` (datasheet and link bandwidths), ``timing`` (the fitted roofline estimates of
calibration.md §5-§6), ``server`` (SGLang server arguments and scheduler constants, §3-§4),
``hicache`` (the host and storage tiers, §2 of sglang-surface.md and §7 of calibration.md),
``output`` (how long generated answers are), ``faults`` (failure injection) and ``http``.
Every constant is a configuration value: nothing in the engine depends on which routing
policy sits in front of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from thunder_sgl.config import _check, from_dict, load_yaml, resolve_config_path, to_dict
from thunder_sgl.errors import ConfigError


@dataclass(frozen=True)
class ModelSpec:
    """The served model: architecture numbers that set KV bytes, weight bytes and FLOPs."""

    model_path: str = "sim/tiny-model"
    """HF-style model id reported as ``model_path`` (and the default served model name)."""

    served_model_name: str | None = None
    """Name in ``/v1/models`` and responses; defaults to ``model_path``."""

    architectures: tuple[str, ...] = ("LlamaForCausalLM",)
    """Reported in ``/model_info``."""

    model_type: str = "llama"
    """Reported in ``/model_info``."""

    num_layers: int = 32
    """L: transformer layers."""

    num_attention_heads: int = 32
    """n_q: query heads (sets the attention FLOPs of prefill)."""

    num_kv_heads: int = 8
    """KV heads of the whole model; a TP rank holds max(1, num_kv_heads / tp) of them."""

    head_dim: int = 128
    """d_h."""

    hidden_size: int = 4096
    """Reported only."""

    params_active_b: float = 8.0
    """P_act in billions: parameters touched per token (prefill linear FLOPs = 2·P_act·n)."""

    dense_params_b: float = 8.0
    """Billions of parameters read by every decode step (attention, embeddings, shared experts;
    the whole model for a dense model)."""

    expert_params_b: float = 0.0
    """Billions of routed-expert parameters (0 for a dense model)."""

    num_experts: int = 0
    """E: routed experts per layer (0 for a dense model)."""

    experts_per_token: int = 0
    """k: experts used per token."""

    weight_bytes_per_param: float = 2.0
    """1 for FP8 checkpoints, 2 for BF16."""

    kv_bytes_per_element: float = 2.0
    """1 for an FP8 KV cache, 2 for BF16 (SGLang's default ``auto`` = model dtype)."""

    context_length: int = 32768
    """Longest prompt + output accepted (``max_model_len``)."""

    text_tokens_per_nominal: float = 1.0
    """Tokens the model's tokenizer makes of the benchmark's text per nominal token
    (``textgen``: 4 characters a token). Scales the system prompt, tasks and observations of DES
    programs. The CPU engine's tokenizer: 1.027 (``bench/real/retokenize_check.py``)."""

    reply_tokens_per_output: float = 1.0
    """Tokens an answer takes in the next request per output token. Agents send the answer back
    as text and the chat template tokenizes it again: a trained model's output re-encodes to the
    same tokens (1.0), and the next request hits the cache through the answer. The CPU engine's
    random-weight model emits token sequences no tokenizer makes; their text re-encodes to 1.31
    times as many other tokens, and the next request's cache hit ends where the answer starts
    (measured over 31,000 pairs of consecutive calls of the real grids,
    ``bench/real/retokenize_check.py``). In the DES an answer then comes back as that many
    fresh ids; 1.0: the output ids themselves."""

    def __post_init__(self) -> None:
        _check(self.num_layers >= 1 and self.num_attention_heads >= 1, "model layers/heads must be >= 1")
        _check(self.num_kv_heads >= 1 and self.head_dim >= 1, "model kv heads/head_dim must be >= 1")
        _check(self.params_active_b > 0 and self.dense_params_b > 0, "model params must be > 0")
        _check(self.expert_params_b >= 0, "model.expert_params_b must be >= 0")
        moe = self.expert_params_b > 0
        _check(not moe or 0 < self.experts_per_token <= self.num_experts, "MoE needs 0 < experts_per_token <= num_experts")
        _check(self.weight_bytes_per_param > 0 and self.kv_bytes_per_element > 0, "byte sizes must be > 0")
        _check(self.context_length >= 16, "model.context_length must be >= 16")
        _check(self.text_tokens_per_nominal > 0 and self.reply_tokens_per_output > 0,
               "model.text_tokens_per_nominal and reply_tokens_per_output must be > 0")

    @property
    def name(self) -> str:
        return self.served_model_name or self.model_path

    def kv_bytes_per_token(self, tp: int) -> int:
        """b_kv per GPU: 2 (K, V) × L × KV heads held by one GPU × d_h × bytes (calibration §2)."""
        heads_per_gpu = max(1, -(-self.num_kv_heads // tp))
        return int(2 * self.num_layers * heads_per_gpu * self.head_dim * self.kv_bytes_per_element)


@dataclass(frozen=True)
class HardwareSpec:
    """One GPU of the TP group, and the links the KV cache moves over."""

    gpu_name: str = "H100-SXM-80GB"
    """Reported only."""

    gpu_memory_gb: float = 80.0
    """Reported only (``memory`` group of /v1/loads)."""

    hbm_bandwidth_gbps: float = 3350.0
    """BW_HBM per GPU in GB/s (datasheet)."""

    peak_tflops: float = 1979.0
    """F_peak per GPU in TFLOPS for the prefill's linear layers (FP8 or BF16 dense)."""

    host_to_device_gbps: float = 25.0
    """Effective HiCache load-back bandwidth per GPU, GB/s (all GPUs load in parallel)."""

    storage_to_host_gbps: float = 2.0
    """Effective L3 storage read bandwidth per GPU, GB/s."""

    def __post_init__(self) -> None:
        _check(self.hbm_bandwidth_gbps > 0 and self.peak_tflops > 0, "hardware bandwidth and flops must be > 0")
        _check(self.host_to_device_gbps > 0 and self.storage_to_host_gbps > 0, "hardware link bandwidths must be > 0")


@dataclass(frozen=True)
class TimingSpec:
    """How long iterations take. ``kind: roofline`` (default): the formulas of calibration §5-§6
    over ``model`` and ``hardware`` with the estimates below (fit them to a GPU run before
    trusting absolute times). ``kind: fitted``: coefficients measured on a real engine
    (``bench/real/calibrate.py``), for engines the GPU roofline does not describe (the CPU)::

        decode iteration = decode_fixed_s + decode_per_request_s·B + decode_per_kv_token_s·K
        prefill          = prefill_fixed_s + prefill_per_token_s·n + prefill_per_attention_s·(n·c + n²/2)
                           + prefill_per_sequence_attention_s·(c + n)²/2

    The last term is SGLang's ``torch_native`` attention backend (the CPU path): it runs a
    prefill chunk as one causal attention over the whole sequence, cached prefix included, so a
    prefix hit saves the linear layers but not the attention.
    """

    kind: str = "roofline"
    """``roofline`` or ``fitted``."""

    eta: float = 0.6
    """η: achieved fraction of peak HBM bandwidth in decode."""

    t0_s: float = 0.002
    """Per-iteration scheduler, sampling and launch overhead with CUDA graphs."""

    allreduce_s: float = 15e-6
    """t_AR: one small all-reduce over NVLink; a step has 2·L of them when tp > 1."""

    mfu: float = 0.3
    """Achieved fraction of F_peak in prefill."""

    load_back_overlap: float = 1.0
    """Fraction of an iteration's compute that hides HiCache load-back. SGLang copies a host
    hit into HBM layer by layer, overlapped with the forward pass (sglang-surface §2.4,
    calibration §7), so by default (1) an iteration takes max(compute, load); 0 adds the
    load-back in full (a pessimistic bound, for sensitivity runs)."""

    decode_fixed_s: float = 0.0
    """fitted: seconds of a decode iteration independent of the batch."""

    decode_per_request_s: float = 0.0
    """fitted: seconds per running request per decode iteration."""

    decode_per_kv_token_s: float = 0.0
    """fitted: seconds per token of KV the batch holds, per decode iteration."""

    prefill_fixed_s: float = 0.0
    """fitted: seconds of a prefill iteration independent of its tokens."""

    prefill_per_token_s: float = 0.0
    """fitted: seconds per new prompt token (the linear layers)."""

    prefill_per_attention_s: float = 0.0
    """fitted: seconds per unit of n·c + n²/2 (attention to the prefix and within the chunk)."""

    prefill_per_sequence_attention_s: float = 0.0
    """fitted: seconds per unit of (c + n)²/2 (attention over the whole sequence, torch_native)."""

    def __post_init__(self) -> None:
        _check(self.kind in ("roofline", "fitted"), "timing.kind must be roofline or fitted")
        fitted = (self.decode_fixed_s, self.decode_per_request_s, self.decode_per_kv_token_s,
                  self.prefill_fixed_s, self.prefill_per_token_s, self.prefill_per_attention_s,
                  self.prefill_per_sequence_attention_s)
        _check(all(x >= 0 for x in fitted), "fitted timing coefficients must be >= 0")
        _check(self.kind != "fitted" or (self.decode_fixed_s + self.decode_per_request_s > 0
                                         and self.prefill_per_token_s + self.prefill_per_sequence_attention_s > 0),
               "timing.kind fitted needs a decode cost and prefill_per_token_s")
        _check(0 < self.eta <= 1 and 0 < self.mfu <= 1, "timing.eta and timing.mfu must be in (0, 1]")
        _check(self.t0_s >= 0 and self.allreduce_s >= 0, "timing overheads must be >= 0")
        _check(0 <= self.load_back_overlap <= 1, "timing.load_back_overlap must be in [0, 1]")


@dataclass(frozen=True)
class ServerSpec:
    """SGLang server arguments and scheduler constants (calibration §3-§4)."""

    tp_size: int = 1
    """GPUs per TP group (one DP rank)."""

    dp_size: int = 1
    """DP ranks in the worker, each an independent engine with its own KV pool."""

    page_size: int = 1
    """Radix granularity: prefixes match and are cached in whole pages."""

    max_total_num_tokens: int = 100_000
    """Device KV capacity of one DP rank, in tokens."""

    max_running_requests: int = 256
    """Requests one DP rank runs at once (prefilling or decoding)."""

    chunked_prefill_size: int = 8192
    """New prompt tokens per iteration, all requests together."""

    max_prefill_tokens: int = 16384
    """Budget of new tokens of one prefill batch (binds only above chunked_prefill_size)."""

    init_new_token_ratio: float = 0.7
    """Fraction of running requests' remaining output reserved at admission, right after an idle
    period or a retraction."""

    min_new_token_ratio_factor: float = 0.14
    """The ratio decays to init × this factor."""

    new_token_ratio_decay_steps: int = 600
    """Decode steps over which the ratio decays from init to its minimum."""

    clip_max_new_tokens: int = 4096
    """Output tokens of one request counted at most in admission estimates."""

    retract_decode_steps: int = 20
    """After a retraction, free KV must cover this many decode steps of the remaining batch."""

    mem_fraction_static: float = 0.8
    """Reported only (the capacity is max_total_num_tokens)."""

    kv_cache_dtype: str = "auto"
    """Reported only."""

    cuda_graph_max_bs: int = 256
    """Reported only."""

    dp_load_balance: str = "round_robin"
    """How a request without an explicit DP rank picks one: round_robin or shortest_queue."""

    enable_cache_report: bool = True
    """Report ``usage.prompt_tokens_details.cached_tokens`` on OpenAI routes (SGLang flag)."""

    enable_mixed_chunk: bool = False
    """SGLang ``--enable-mixed-chunk``: a prefill iteration also runs one decode step of every
    running request. Off by default, as in SGLang: a prefill batch runs alone (the scheduler
    prefers a new prefill batch to a decode step), so running requests wait while it runs."""

    enable_session_radix_cache: bool = False
    """SGLang ``--enable-session-radix-cache``: a request with a ``session_id`` references the
    KV it leaves in the radix cache; eviction takes unreferenced KV first (then by fewest
    references, then LRU); ``/close_session`` drops the session's references."""

    version: str = "0.5.23"
    """SGLang version reported by /server_info and /v1/loads."""

    def __post_init__(self) -> None:
        _check(self.tp_size >= 1 and self.dp_size >= 1, "server tp_size and dp_size must be >= 1")
        _check(self.page_size >= 1, "server.page_size must be >= 1")
        _check(self.max_total_num_tokens >= 2 * self.page_size, "server.max_total_num_tokens too small")
        _check(self.max_running_requests >= 1, "server.max_running_requests must be >= 1")
        _check(self.chunked_prefill_size >= self.page_size, "server.chunked_prefill_size must be >= page_size")
        _check(self.max_prefill_tokens >= 1, "server.max_prefill_tokens must be >= 1")
        _check(0 < self.init_new_token_ratio <= 1, "server.init_new_token_ratio must be in (0, 1]")
        _check(0 < self.min_new_token_ratio_factor <= 1, "server.min_new_token_ratio_factor must be in (0, 1]")
        _check(self.new_token_ratio_decay_steps >= 1, "server.new_token_ratio_decay_steps must be >= 1")
        _check(self.clip_max_new_tokens >= 1 and self.retract_decode_steps >= 1, "server clip/retract steps must be >= 1")
        _check(self.dp_load_balance in ("round_robin", "shortest_queue"), "server.dp_load_balance must be round_robin or shortest_queue")

    @property
    def min_new_token_ratio(self) -> float:
        return min(self.init_new_token_ratio * self.min_new_token_ratio_factor, 1.0)

    @property
    def new_token_ratio_decay(self) -> float:
        return (self.init_new_token_ratio - self.min_new_token_ratio) / self.new_token_ratio_decay_steps


@dataclass(frozen=True)
class HiCacheSpec:
    """SGLang HiCache: host memory (L2) and optional storage (L3) tiers below HBM."""

    enabled: bool = False
    """``--enable-hierarchical-cache``."""

    ratio: float = 2.0
    """``--hicache-ratio``: host tokens = ratio × device tokens (unless host_tokens is set)."""

    host_tokens: int = 0
    """Explicit host capacity per DP rank in tokens (the effect of ``--hicache-size``); 0: use ratio."""

    write_policy: str = "write_through"
    """write_through: every block cached in HBM is copied to host at once (host is inclusive);
    write_back: a block is copied to host when HBM evicts it."""

    io_backend: str = "kernel"
    """Reported only."""

    mem_layout: str = "page_first"
    """Reported only."""

    load_back_threshold: int = 10
    """A host continuation shorter than this is recomputed instead of loaded."""

    storage_backend: str | None = None
    """``--hicache-storage-backend``; None: no L3 tier."""

    storage_capacity_tokens: int = 0
    """L3 capacity per DP rank in tokens (SGLang does not expose it; the simulator needs one)."""

    storage_prefetch_threshold: int = 256
    """An L3 continuation shorter than this is recomputed instead of prefetched."""

    storage_prefetch_policy: str = "timeout"
    """Reported only (the simulator always waits for the prefetch)."""

    def __post_init__(self) -> None:
        _check(self.ratio > 0 and self.host_tokens >= 0, "hicache.ratio must be > 0 and host_tokens >= 0")
        _check(self.write_policy in ("write_through", "write_back"), "hicache.write_policy must be write_through or write_back")
        _check(self.load_back_threshold >= 0 and self.storage_prefetch_threshold >= 0, "hicache thresholds must be >= 0")
        _check(self.storage_backend is None or self.storage_capacity_tokens > 0, "hicache.storage_backend needs storage_capacity_tokens > 0")


@dataclass(frozen=True)
class OutputSpec:
    """Length of generated answers."""

    default_max_tokens_chat: int = 256
    """Chat requests without max_tokens / max_completion_tokens."""

    default_max_tokens_completions: int = 16
    """``/v1/completions`` without max_tokens (OpenAI default)."""

    default_max_new_tokens_generate: int = 128
    """``/generate`` without sampling_params.max_new_tokens."""

    length_mode: str = "max_tokens"
    """max_tokens: every answer is exactly max_tokens long (as with ignore_eos). lognormal: a
    request without ignore_eos stops at min(max_tokens, a lognormal draw) with reason "stop"."""

    lognormal_median: float = 250.0
    """Median answer length in lognormal mode."""

    lognormal_sigma: float = 0.6
    """Sigma of log(length) in lognormal mode."""

    def __post_init__(self) -> None:
        _check(min(self.default_max_tokens_chat, self.default_max_tokens_completions, self.default_max_new_tokens_generate) >= 1, "output default lengths must be >= 1")
        _check(self.length_mode in ("max_tokens", "lognormal"), "output.length_mode must be max_tokens or lognormal")
        _check(self.lognormal_median >= 1 and self.lognormal_sigma >= 0, "output lognormal parameters out of range")


@dataclass(frozen=True)
class FaultSpec:
    """Failure injection at start-up; change at runtime with ``POST /sim/faults``."""

    failure_rate: float = 0.0
    """Fraction of inference requests answered 500 with an SGLang-like error body."""

    added_latency_ms: float = 0.0
    """Real milliseconds added before every inference response."""

    stop_answering: bool = False
    """Accept connections but never answer (health included); ``/sim/faults`` still answers."""

    die_mid_stream_after_tokens: int | None = None
    """Break the next streamed response after this many content chunks."""

    die_mid_stream_mode: str = "exit"
    """exit: the process dies with os._exit(1) (a real crash); drop: only that connection is cut."""

    startup_delay_s: float = 0.0
    """Real seconds during which every route but /sim/faults answers 503 (starting up)."""

    break_streams_rate: float = 0.0
    """Fraction of streamed responses whose connection is cut (as mode drop) after a number of
    content chunks drawn uniformly from 0 to the answer's length − 1: a worker that breaks
    streams under load, before and after their first event."""

    def __post_init__(self) -> None:
        _check(0 <= self.failure_rate <= 1, "faults.failure_rate must be in [0, 1]")
        _check(0 <= self.break_streams_rate <= 1, "faults.break_streams_rate must be in [0, 1]")
        _check(self.added_latency_ms >= 0 and self.startup_delay_s >= 0, "fault delays must be >= 0")
        _check(self.die_mid_stream_after_tokens is None or self.die_mid_stream_after_tokens >= 0, "faults.die_mid_stream_after_tokens must be >= 0")
        _check(self.die_mid_stream_mode in ("exit", "drop"), "faults.die_mid_stream_mode must be exit or drop")


@dataclass(frozen=True)
class HttpSpec:
    """The HTTP front end."""

    stream_poll_ms: float = 5.0
    """Real milliseconds between pushes of new tokens to open streams."""

    health_generates: bool = False
    """/health runs a one-token generation like SGLang's default (``/health_generate`` always does)."""

    def __post_init__(self) -> None:
        _check(self.stream_poll_ms > 0, "http.stream_poll_ms must be > 0")


@dataclass(frozen=True)
class ControlSpec:
    """Engine control for RL (``/update_weights_from_disk`` and friends, ``sim.control``)."""

    weight_update_seconds: float = 2.0
    """Virtual seconds one /update_weights_from_disk takes (reading the weights from disk)."""

    def __post_init__(self) -> None:
        _check(self.weight_update_seconds >= 0, "control.weight_update_seconds must be >= 0")


@dataclass(frozen=True)
class SimConfig:
    """One simulated worker: dp_size engines of one model on one kind of hardware."""

    name: str = "sim"
    """Config name (the YAML file stem by default)."""

    model: ModelSpec = field(default_factory=ModelSpec)
    hardware: HardwareSpec = field(default_factory=HardwareSpec)
    timing: TimingSpec = field(default_factory=TimingSpec)
    server: ServerSpec = field(default_factory=ServerSpec)
    hicache: HiCacheSpec = field(default_factory=HiCacheSpec)
    output: OutputSpec = field(default_factory=OutputSpec)
    faults: FaultSpec = field(default_factory=FaultSpec)
    http: HttpSpec = field(default_factory=HttpSpec)
    control: ControlSpec = field(default_factory=ControlSpec)

    seed: int = 0
    """Seed of generated text and of fault draws."""

    def __post_init__(self) -> None:
        _check(self.server.max_total_num_tokens >= 2, "capacity must be >= 2 tokens")
        if self.hicache.storage_backend is not None:
            _check(self.hicache.enabled, "an L3 storage tier needs hicache.enabled")

    @property
    def kv_bytes_per_token(self) -> int:
        """b_kv: KV bytes per token per GPU."""
        return self.model.kv_bytes_per_token(self.server.tp_size)

    @property
    def host_tokens(self) -> int:
        """HiCache host capacity per DP rank in tokens (0 without HiCache), rounded to pages."""
        if not self.hicache.enabled:
            return 0
        raw = self.hicache.host_tokens or int(self.server.max_total_num_tokens * self.hicache.ratio)
        return raw - raw % self.server.page_size

    @property
    def storage_tokens(self) -> int:
        if not self.hicache.enabled or self.hicache.storage_backend is None:
            return 0
        return self.hicache.storage_capacity_tokens

    def with_overrides(self, dotted: dict[str, Any] | None = None, **kw: Any) -> SimConfig:
        """A copy with ``{"server.page_size": 64, "seed": 3}`` overrides applied and validated."""
        tree = to_dict(self)
        for key, value in {**(dotted or {}), **kw}.items():
            section, _, name = key.partition(".")
            if not name:
                tree[section] = value
                continue
            if not isinstance(tree.get(section), dict):
                raise ConfigError(f"unknown sim config section {section!r} in override {key!r}")
            tree[section][name] = value
        return from_dict(SimConfig, tree)


def load_sim_config(name_or_path: str | Path, overrides: dict[str, Any] | None = None) -> SimConfig:
    """Load ``configs/sim/<name>.yaml`` (or a path); the name defaults to the file stem."""
    path = resolve_config_path(name_or_path, "sim")
    data = load_yaml(path, "sim")
    data.setdefault("name", path.stem)
    cfg = from_dict(SimConfig, data)
    return cfg.with_overrides(overrides) if overrides else cfg
