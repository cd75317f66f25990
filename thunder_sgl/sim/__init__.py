"""thunder_sgl.sim — a simulated SGLang 0.5.23 worker: same HTTP surface, physical KV and timing model.

Each DP rank is an ``Engine``: a token-level radix cache with lock counts and LRU eviction,
HiCache host / storage tiers with write-through and bandwidth-limited load-back, FCFS admission
with SGLang's new-token-ratio reserve, chunked prefill mixed with decode, retraction when decode
runs out of KV, and iteration times from the roofline formulas of calibration.md. It runs on a
virtual clock and jumps from event to event. A ``SimWorker`` is dp_size engines plus the model
description, fault knobs and SGLang-shaped reports; ``server.create_app`` puts it behind HTTP.

In-process API (stable; a discrete-event benchmark builds on it)
-----------------------------------------------------------------
Times are simulated seconds; token sequences are lists of ints, ``array('I')`` or packed native
uint32 ``bytes`` (``tokenizer.pack``).

``SimWorker(cfg: SimConfig, worker_id: int = 0)`` (``Engine(cfg, dp_rank)`` has the same calls):

- ``submit(SimRequest(rid, input_ids, max_new_tokens, dp_rank=None, routing_key=None,
  ignore_eos=True, output_ids=None), now) -> int`` — queue a request arriving at ``now``;
  returns its DP rank; raises ``SimRequestError`` for requests SGLang would reject (400).
- ``next_event_time() -> float | None`` — when ``advance`` next has work; None when idle.
- ``advance(until) -> list[Completion]`` — run the engines to ``until`` and return the requests
  that left by then, in time order. ``Completion``: rid, time, dp_rank, prompt_tokens,
  completion_tokens, cached_tokens, cached_device, cached_host, cached_storage, output_ids
  (``array('I')``), finish_reason ("length" | "stop" | "abort"), arrival_time,
  first_token_time, retractions, error; properties ttft, latency.
- ``abort(rid, now) -> bool`` (its Completion, reason "abort", comes from a later advance),
  ``abort_all(now)``, ``flush_cache() -> bool`` (refused while requests are in flight).
- Reports: ``loads(include=None, dp_rank=None)`` (the /v1/loads dict), ``metrics_text()``,
  ``server_info()``, ``model_info()``.
- State for plots: ``stats() -> list[EngineStats]`` (per DP rank: device_used_tokens,
  num_used_tokens, evictable_tokens, host_used_tokens, num_running_reqs, num_waiting_reqs,
  token_usage, gen_throughput, ... and ``counters``), ``counters`` (``EngineCounters`` summed over
  ranks: prompt_tokens, cached_device/host/storage, prefill_tokens, recomputed_tokens,
  retractions, generation_tokens, ...), ``device_used_tokens``, ``host_used_tokens``,
  ``evicted_tokens``, ``num_running``, ``num_waiting``; ``output_ids(rid)`` of a request in flight.
- ``tokenizer`` / ``template``: the deterministic tokenizer and append-only chat template.

Several workers share one virtual time when a single loop drives them (``bench/sim_cost.py``
is a complete example, with a heap over workers instead of the scan below)::

    workers = [SimWorker(load_sim_config("glm46-fp8-h100x8"), i) for i in range(8)]
    while programs_left():
        t = min([w.next_event_time() or inf for w in workers] + [agents.next_time()])
        for w in workers:                      # engine events at t first, then the agents
            for c in w.advance(t):             # Completion: rid, time, usage, output_ids, ...
                agents.on_completion(c)        # e.g. next call at c.time + tool time
        for prog in agents.due(t):             # context = previous prompt + output + observation
            workers[prog.node].submit(SimRequest(prog.rid, prog.context, 250), t)

A submit during a decode span cuts the span at the end of the step in progress, so a request is
scheduled at the next iteration boundary, as in a real engine. Requests submitted at exactly the
start time of an already-planned iteration join the following one.

HTTP: ``python -m thunder_sgl.sim --config <name|path> --port 0`` (see ``__main__``), or in
process ``await server.start_workers(cfg, n)`` / ``server.serve(worker, clock)``.
"""

from __future__ import annotations

from thunder_sgl.sim.clock import ManualClock, ScaledClock, VirtualClock
from thunder_sgl.sim.config import SimConfig, load_sim_config
from thunder_sgl.sim.engine import Engine
from thunder_sgl.sim.request import (
    Completion,
    EngineCounters,
    EngineStats,
    SimRequest,
    SimRequestError,
)
from thunder_sgl.sim.tokenizer import ChatTemplate, Tokenizer, pack, unpack
from thunder_sgl.sim.worker import SimWorker

__all__ = [
    "ChatTemplate",
    "Completion",
    "Engine",
    "EngineCounters",
    "EngineStats",
    "ManualClock",
    "ScaledClock",
    "SimConfig",
    "SimRequest",
    "SimRequestError",
    "SimWorker",
    "Tokenizer",
    "VirtualClock",
    "load_sim_config",
    "pack",
    "unpack",
]
