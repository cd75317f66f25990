"""Requests in, completions out, and the numbers an engine exposes.

``SimRequest`` is what a client submits, ``Completion`` what the engine reports when a request
leaves it (finished or aborted). ``EngineCounters`` are cumulative and monotonic;
``EngineStats`` is a snapshot of one DP rank for /v1/loads, /metrics and plots.
"""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

from thunder_sgl.sim.config import SimConfig
from thunder_sgl.sim.radix import Node
from thunder_sgl.sim.tokenizer import generate_output, pack, prompt_digest, sample_length, unpack

WAITING, PREFILL, RUNNING, DONE = 0, 1, 2, 3
"""States of an engine-side request."""


class SimRequestError(ValueError):
    """A request the engine refuses (SGLang answers these with 400)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True)
class SimRequest:
    """One generation request.

    ``input_ids``: token ids as a sequence of ints, an ``array('I')`` or packed native uint32
    ``bytes``. ``max_new_tokens`` bounds the answer (and is what admission reserves for);
    the answer is exactly that long unless ``ignore_eos`` is false and the config's
    ``output.length_mode`` is lognormal, or ``output_ids`` forces the answer tokens.
    """

    rid: str
    input_ids: Sequence[int] | array | bytes
    max_new_tokens: int
    dp_rank: int | None = None
    routing_key: str | None = None
    ignore_eos: bool = True
    output_ids: Sequence[int] | array | None = None
    session_id: str | None = None
    """SGLang's top-level ``session_id``: with the session radix cache on, the request's KV
    stays referenced by the session after it finishes (``sessions``)."""
    sampled: bool = False
    """The request asked for a temperature > 0: its answer is drawn from its rid as well as its
    prompt, so identical prompts get different answers (without it, identical prompts get
    identical answers, like greedy decoding)."""


@dataclass(frozen=True, slots=True)
class Completion:
    """A request left the engine at ``time`` (simulated seconds)."""

    rid: str
    time: float
    dp_rank: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    """Prompt tokens not computed for this request (device + host + storage hits)."""
    cached_device: int
    cached_host: int
    cached_storage: int
    output_ids: array
    finish_reason: str
    """"length" (max_new_tokens reached), "stop" (an EOS draw in lognormal mode) or "abort"."""
    arrival_time: float
    first_token_time: float | None
    retractions: int
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def latency(self) -> float:
        return self.time - self.arrival_time


class Req:
    """Engine-side state of one request (internal)."""

    __slots__ = (
        "rid", "prompt", "prompt_len", "out_ids", "out_bytes", "target", "max_new", "n_out",
        "fill_len", "kv_len", "tree_len", "private", "last_node", "dp_rank", "routing_key",
        "arrival", "first_token_time", "cached", "retractions", "aborted", "in_plan",
        "recompute_upto", "state", "session_id", "session_gen",
    )

    def __init__(self, rid: str, prompt: bytes, out_ids: array, max_new: int, arrival: float, root: Node) -> None:
        self.rid = rid
        self.prompt = prompt
        self.prompt_len = len(prompt) >> 2
        self.out_ids = out_ids
        self.out_bytes = out_ids.tobytes()
        self.target = len(out_ids)
        self.max_new = max_new
        self.n_out = 0
        self.fill_len = self.prompt_len
        """Tokens to prefill: the prompt, plus the output so far after a retraction."""
        self.kv_len = 0
        """Tokens of the sequence whose KV exists."""
        self.tree_len = 0
        """Leading tokens covered by the locked radix path (shared); kv_len - tree_len are private."""
        self.private = 0
        self.last_node = root
        self.dp_rank = 0
        self.routing_key: str | None = None
        self.arrival = arrival
        self.first_token_time: float | None = None
        self.cached: tuple[int, int, int] | None = None
        self.retractions = 0
        self.aborted = False
        self.in_plan = False
        self.recompute_upto = 0
        self.state = WAITING
        self.session_id: str | None = None
        self.session_gen = 0

    def seq(self, length: int) -> bytes:
        """The first ``length`` tokens of prompt + output, packed."""
        if length <= self.prompt_len:
            return self.prompt[: 4 * length]
        return self.prompt + self.out_bytes[: 4 * (length - self.prompt_len)]


@dataclass(slots=True)
class EngineCounters:
    """Cumulative counts of one DP rank (monotonic)."""

    requests_submitted: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0
    prompt_tokens: int = 0
    """Σ prompt tokens of requests that left the engine (SGLang counts at finish)."""
    generation_tokens: int = 0
    cached_device: int = 0
    cached_host: int = 0
    cached_storage: int = 0
    prefill_tokens: int = 0
    """Tokens actually computed by prefill (new + recomputed)."""
    recomputed_tokens: int = 0
    """Prefill tokens this engine had computed before for the same request (after a retraction)."""
    retractions: int = 0
    retracted_input_tokens: int = 0
    retracted_output_tokens: int = 0
    iterations: int = 0
    """Plans executed: prefill iterations and decode spans (a span covers many decode steps)."""
    decode_steps: int = 0
    busy_seconds: float = 0.0
    prefill_busy_seconds: float = 0.0
    """Seconds of iterations that prefilled (SGLang's ``total_prefill_busy_us`` / 1e6)."""
    decode_moments: list[float] = field(default_factory=lambda: [0.0] * 6)
    """Over decode steps: [n, Σb, Σt µs, Σb², Σb·t µs, Σgenerated] (SGLang's ``decode_moments``)."""
    load_back_seconds: float = 0.0
    load_back_ops: int = 0
    ttft_sum: float = 0.0
    e2e_sum: float = 0.0

    @property
    def cached_tokens(self) -> int:
        return self.cached_device + self.cached_host + self.cached_storage


@dataclass(slots=True)
class EngineStats:
    """A snapshot of one DP rank at simulated time ``time``."""

    time: float
    dp_rank: int
    num_running_reqs: int
    num_waiting_reqs: int
    num_retracted_waiting: int
    num_waiting_uncached_tokens: int
    max_running_requests: int
    max_total_num_tokens: int
    device_used_tokens: int
    """KV tokens allocated in HBM, cached prefixes included."""
    num_used_tokens: int
    """SGLang's definition: capacity − free − evictable (locked prefixes + requests' own KV)."""
    evictable_tokens: int
    free_tokens: int
    num_active_tokens: int
    """Σ context tokens of running requests."""
    host_used_tokens: int
    host_total_tokens: int
    storage_used_tokens: int
    storage_total_tokens: int
    token_usage: float
    cache_hit_rate: float
    gen_throughput: float
    utilization: float
    new_token_ratio: float
    num_unique_routing_keys: int
    counters: EngineCounters = field(default_factory=EngineCounters)
    evicted_device_tokens: int = 0
    host_evicted_tokens: int = 0
    storage_evicted_tokens: int = 0
    host_backup_tokens: int = 0
    storage_backup_tokens: int = 0
    loaded_from_host_tokens: int = 0
    loaded_from_storage_tokens: int = 0


def make_req(cfg: SimConfig, q: SimRequest, now: float, root: Node) -> Req:
    """Validate a submitted request and build its engine-side state, answer tokens included
    (raises SimRequestError for what SGLang would refuse)."""
    prompt = pack(q.input_ids)
    n = len(prompt) >> 2
    if n == 0:
        raise SimRequestError("the input is empty")
    if q.max_new_tokens < 1:
        raise SimRequestError("max_new_tokens must be >= 1")
    ctx = cfg.model.context_length
    if n + q.max_new_tokens > ctx:
        raise SimRequestError(
            f"Requested token count exceeds the model's maximum context length of {ctx} tokens. "
            f"You requested a total of {n + q.max_new_tokens} tokens: {n} tokens from the input "
            f"messages and {q.max_new_tokens} tokens for the completion."
        )
    if n >= cfg.server.max_total_num_tokens:
        raise SimRequestError(f"The input ({n} tokens) is longer than the KV cache ({cfg.server.max_total_num_tokens} tokens).")
    if q.output_ids is not None:
        out = unpack(pack(q.output_ids))[: q.max_new_tokens]
    else:
        o, seed, digest = cfg.output, cfg.seed, prompt_digest(prompt)
        if q.sampled:
            digest ^= zlib.crc32(q.rid.encode())
        length = q.max_new_tokens
        if o.length_mode == "lognormal" and not q.ignore_eos:
            length = sample_length(seed, digest, o.lognormal_median, o.lognormal_sigma, q.max_new_tokens)
        out = generate_output(seed, digest, length)
    if len(out) == 0:
        raise SimRequestError("output_ids must not be empty")
    r = Req(q.rid, prompt, out, q.max_new_tokens, now, root)
    r.routing_key = q.routing_key
    r.session_id = q.session_id
    return r
