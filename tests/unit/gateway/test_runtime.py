"""The gateway runtime in process, against a simulated worker served on a free port."""

from __future__ import annotations

import asyncio
import time

from thunder_sgl.config import RouterConfig
from thunder_sgl.control.tickets import Ticket
from thunder_sgl.gateway.runtime import Gateway
from thunder_sgl.sim import ScaledClock, SimWorker
from thunder_sgl.sim.config import load_sim_config
from thunder_sgl.sim.server import serve


async def test_a_request_held_while_its_worker_was_down_goes_out_when_the_worker_is_back() -> None:
    """Polls every 0.2 s, ticks every 5 s: the request must leave with the first good poll,
    not with the next periodic tick."""
    rw = await serve(SimWorker(load_sim_config("tiny")), ScaledClock(10.0))
    cfg = RouterConfig().with_overrides({"monitor.poll_interval_seconds": 0.2, "scheduler.tick_seconds": 5.0,
                                         "gateway.worker_urls": [rw.url]})
    gw = Gateway(cfg)
    await gw.start()
    try:
        for _ in range(200):
            if any(b.healthy for b in gw.controller.backend_list()):
                break
            await asyncio.sleep(0.02)
        (b,) = gw.controller.backend_list()
        gw.suspect(b, "connection refused")  # what the request path does when it cannot connect
        assert not b.healthy
        t = Ticket("agent-1", prompt_chars=400)
        t0 = time.monotonic()
        got = await asyncio.wait_for(gw.acquire(t), timeout=10)
        waited = time.monotonic() - t0
        assert got is b and b.healthy
        assert waited < 2.0, f"held {waited:.1f}s for a worker that was back after one poll"
        gw.finish(t, None)
    finally:
        await gw.stop()
        await rw.runner.cleanup()
