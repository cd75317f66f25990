"""An RL rollout through thunder: agent programs step on while the trainer updates the weights.

What an RL framework (SkyRL, slime, verl, AReaL) does with its SGLang engines, pointed at one
thunder router instead of the engines:

- each trajectory is one *program*: every request carries ``program_id`` (OpenAI SDK:
  ``extra_body``) and an ``rid`` of its own, and the program is released when the trajectory ends;
- the ``--group-size`` samples of one task form a *group* (GRPO): their requests carry the
  task's ``group_id``, so the router counts their shared task prompt once, places them
  together and reports the group's completion (``GET /groups``);
- between training steps the trainer syncs weights through the router, alternating the two
  styles: SkyRL's (``/weight_sync/begin``, ``/pause_generation`` retract,
  ``/update_weights_from_disk``, ``/continue_generation``, ``/weight_sync/end``) and slime's
  (``/pause_generation`` abort, update, continue). The router holds new requests meanwhile;
- a request aborted by the pause comes back with finish reason ``abort`` and is sent again
  (a partial rollout resumed); a request slower than ``--request-timeout`` is aborted by its
  rid, through the router (slime had to go around its router for this), and its trajectory
  ends there.

Run it on its own (it starts simulated SGLang workers and a thunder router on free ports):

    python examples/rl_rollout.py

or against a running router (its workers must be able to load ``--model-path``):

    python examples/rl_rollout.py --router http://127.0.0.1:30000 --model default --ignore-eos

It prints one JSON summary and exits 1 if any request failed or was lost.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import time
from dataclasses import dataclass, field

import httpx
from openai import AsyncOpenAI


@dataclass
class Tally:
    answered: int = 0
    failed: list[str] = field(default_factory=list)
    resent_after_abort: int = 0
    aborted_by_timeout: int = 0
    versions: set[str] = field(default_factory=set)
    windows: int = 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--router", default=None, help="thunder router URL (default: start a simulated cluster)")
    p.add_argument("--model", default="tiny", help="model name sent in requests")
    p.add_argument("--model-path", default=None, help="what /update_weights_from_disk loads (default: the served model)")
    p.add_argument("--programs", type=int, default=8, help="trajectories rolled out at once")
    p.add_argument("--group-size", type=int, default=4, help="trajectories per task (a group, GRPO's G)")
    p.add_argument("--steps", type=int, default=6, help="LLM calls per trajectory")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--updates", type=int, default=2, help="weight updates during the rollout")
    p.add_argument("--request-timeout", type=float, default=60.0, help="abort a slower request by its rid (ends its trajectory)")
    p.add_argument("--ignore-eos", action="store_true", help="SGLang's ignore_eos (random-weight test models stop early)")
    return p.parse_args(argv)


async def trajectory(client: AsyncOpenAI, http: httpx.AsyncClient, args: argparse.Namespace, pid: str,
                     tally: Tally, rids: itertools.count, group: str) -> None:
    messages = [{"role": "system", "content": "You fix bugs in a repository. " * 20},
                {"role": "user", "content": f"Task {group}: make the failing test pass. " * 10}]
    extra = {"program_id": pid, "group_id": group, **({"ignore_eos": True} if args.ignore_eos else {})}
    step = 0
    while step < args.steps:
        rid = f"{pid}-{next(rids)}"
        call = client.chat.completions.create(model=args.model, messages=messages, max_tokens=args.max_tokens,
                                              extra_body={**extra, "rid": rid})
        task = asyncio.ensure_future(call)
        done, _ = await asyncio.wait({task}, timeout=args.request_timeout)
        timed_out = not done
        if timed_out:  # too slow: abort it on the engine that runs it, through the router
            await http.post(f"{args.router}/abort_request", json={"rid": rid})
            tally.aborted_by_timeout += 1
        try:
            r = await task
        except Exception as e:  # noqa: BLE001 - counted, the run fails at the end
            tally.failed.append(f"{pid} step {step}: {type(e).__name__}: {e}")
            return
        tally.answered += 1
        version = (getattr(r, "metadata", None) or {}).get("weight_version")  # SGLang's extra field
        if version:
            tally.versions.add(version)
        if timed_out:
            break  # the trajectory is truncated (its KV freed on the engine at once), as slime drops it
        if r.choices[0].finish_reason == "abort":
            tally.resent_after_abort += 1  # aborted by a pause: the same step again (a partial rollout resumed)
            continue
        messages += [{"role": "assistant", "content": r.choices[0].message.content or ""},
                     {"role": "user", "content": f"Observation {step}: 2 tests still fail. " * 6}]
        step += 1
        await asyncio.sleep(0.05)  # the tool runs
    r2 = await http.post(f"{args.router}/programs/{pid}/release")  # the trajectory is complete
    if r2.status_code != 200:
        tally.failed.append(f"{pid}: release answered {r2.status_code}")


async def trainer(http: httpx.AsyncClient, args: argparse.Namespace, tally: Tally, rollout: asyncio.Future) -> None:
    async def call(path: str, body: dict | None = None) -> None:
        r = await http.post(args.router + path, json=body or {})
        if r.status_code != 200:
            tally.failed.append(f"{path} answered {r.status_code}: {r.text[:300]}")

    total = args.programs * args.steps
    for step in range(1, args.updates + 1):
        # "Training" on what was rolled out so far; then new weights, while the rollout goes on.
        while tally.answered < step * total // (args.updates + 1) and not rollout.done():
            await asyncio.sleep(0.05)
        if rollout.done():
            break
        update = {"model_path": args.model_path, "weight_version": f"step-{step}"}
        if step % 2:  # SkyRL's ThunderAgent integration
            for path, body in (("/weight_sync/begin", None), ("/pause_generation", {"mode": "retract"}),
                               ("/update_weights_from_disk", update), ("/continue_generation", None),
                               ("/weight_sync/end", None)):
                await call(path, body)
        else:  # slime: abort what runs, update, continue
            for path, body in (("/pause_generation", {"mode": "abort"}), ("/update_weights_from_disk", update),
                               ("/continue_generation", None)):
                await call(path, body)
        tally.windows += 1


async def rollout(args: argparse.Namespace) -> dict:
    tally = Tally()
    client = AsyncOpenAI(base_url=args.router + "/v1", api_key="none", max_retries=0, timeout=600)
    async with httpx.AsyncClient(timeout=600) as http:
        if args.model_path is None:
            args.model_path = (await http.get(args.router + "/get_model_info")).json()["model_path"]
        rids = itertools.count()
        t0 = time.monotonic()
        g = max(1, args.group_size)
        agents = asyncio.gather(*(trajectory(client, http, args, f"task-{i // g}-s{i % g}", tally, rids, f"task-{i // g}")
                                  for i in range(args.programs)))
        await asyncio.gather(agents, trainer(http, args, tally, agents))
        left = (await http.get(args.router + "/programs")).json()["count"]
        groups = (await http.get(args.router + "/groups")).json()
        window = (await http.get(args.router + "/weight_sync")).json()
    await client.close()
    return {"trajectories": args.programs, "requests_answered": tally.answered, "failed": tally.failed,
            "resent_after_abort": tally.resent_after_abort, "aborted_by_timeout": tally.aborted_by_timeout,
            "weight_updates": tally.windows, "weight_versions_seen": sorted(tally.versions),
            "router_weight_version": window["weight_version"], "programs_left": left,
            "groups_completed": groups["completed_total"], "groups_live": len(groups["live"]),
            "group_spread_max_seconds": max((x["spread_seconds"] for x in groups["completed"]), default=0.0),
            "seconds": round(time.monotonic() - t0, 1)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    procs = []
    if args.router is None:
        from thunder_sgl.benchmark.drivers.peers import start_sim, start_thunder

        procs.append(sim := start_sim("tiny", workers=2, time_scale=10.0))
        procs.append(router := start_thunder(sim.urls, time_scale=10.0))
        args.router = router.url
    try:
        summary = asyncio.run(rollout(args))
    finally:
        for p in reversed(procs):
            p.stop()
    print(json.dumps(summary, indent=2))
    ok = not summary["failed"] and summary["programs_left"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
