"""AReaL's own rollout client, unmodified, driven as AReaL's trainer drives it (issue 24 item 3).

Runs under a Python that has ``areal`` installed (AReaL 1.0.4 from PyPI; see
``bench/real/framework_rollout.py``, which starts the engines and thunder and runs this), not in
thunder's venv: thunder never imports AReaL.

What is AReaL's here (``areal==1.0.4``): ``areal.engine.sglang_remote.RemoteSGLangEngine`` (its
``SGLangBackend`` builds every HTTP body), ``RemoteInfEngine.initialize/agenerate/submit/wait``,
the ``WorkflowExecutor`` that runs the rollouts, ``pause/pause_generation/
update_weights_from_disk/continue_generation/set_version/resume`` and ``name_resolve``.
What is ours: the rollout workflow (a user's code in AReaL: one ``agenerate`` per prompt) and
the trainer's part of a weight update, which copies the prepared checkpoint where AReaL's
trainer would save one. The update follows ``areal/trainer/rl_trainer.py`` (``rollout.pause()``,
``actor.update_weights``, ``set_version``, ``rollout.resume()``) and
``areal/engine/fsdp_engine.py`` ``_update_weights_from_disk`` (``pause_generation``,
``update_weights_from_disk`` future, save, ``name_resolve.add``, ``fut.result()``,
``continue_generation``).

Writes one JSON: every response (prompt, tokens, logprobs, AReaL's per-token versions, stop
reason, when it was answered), the trainer's events with times, and the generation body AReaL
builds.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path

import areal
import torch
from areal.api import ModelRequest, RolloutWorkflow, WeightUpdateMeta
from areal.api.cli_args import GenerationHyperparameters, InferenceEngineConfig, NameResolveConfig
from areal.engine.sglang_remote import RemoteSGLangEngine
from areal.utils import name_resolve, names

RESULTS: dict[int, dict] = {}
T0 = time.time()


def now() -> float:
    return round(time.time() - T0, 3)


class OneGeneration(RolloutWorkflow):
    """A user's workflow: one generation per prompt, kept with AReaL's own accounting."""

    def __init__(self, max_new_tokens: int) -> None:
        self.gconfig = GenerationHyperparameters(n_samples=1, max_new_tokens=max_new_tokens, greedy=True, ignore_eos=True)

    async def arun_episode(self, engine, data):  # noqa: ANN001, ANN201
        req = ModelRequest(rid=data["rid"], input_ids=list(data["input_ids"]), gconfig=self.gconfig.new(n_samples=1))
        started = now()
        resp = await engine.agenerate(req)
        RESULTS[data["idx"]] = {
            "idx": data["idx"], "rid": data["rid"], "input_ids": list(data["input_ids"]),
            "output_tokens": list(resp.output_tokens), "output_logprobs": [float(x) for x in resp.output_logprobs],
            "output_versions": list(resp.output_versions), "stop_reason": resp.stop_reason,
            "started": started, "answered": now(),
        }
        ids = torch.tensor([list(data["input_ids"]) + list(resp.output_tokens)], dtype=torch.int64)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids, dtype=torch.bool)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", required=True, help="host:port AReaL sends everything to (thunder's)")
    ap.add_argument("--checkpoints", nargs=2, required=True, help="the two new checkpoints (step 1, step 2)")
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--prompt-len", type=int, default=48)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--concurrency", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=833)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    exp, trial = "thunder-areal", uuid.uuid4().hex[:8]
    name_resolve.reconfigure(NameResolveConfig(type="nfs", nfs_record_root=str(args.workdir / "name_resolve")))
    config = InferenceEngineConfig(experiment_name=exp, trial_name=trial, max_concurrent_rollouts=args.concurrency,
                                   consumer_batch_size=args.prompts, max_head_offpolicyness=100,
                                   request_timeout=600, request_retries=3, setup_timeout=120)
    rollout = RemoteSGLangEngine(config)
    rollout.initialize(addr=[args.addr], train_data_parallel_size=1)  # one trainer rank
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(3, args.vocab) for _ in range(args.prompt_len)] for _ in range(args.prompts)]
    template = rollout._engine.backend.build_generation_request(  # the body AReaL sends, for the record
        ModelRequest(input_ids=[1, 2, 3], gconfig=OneGeneration(args.max_new_tokens).gconfig), with_lora=False, version=0).payload
    events: list[dict] = []
    wf = OneGeneration(args.max_new_tokens)
    for i, ids in enumerate(prompts):
        rollout.submit({"idx": i, "rid": f"areal-{i}", "input_ids": ids}, workflow=wf)

    per_step = args.prompts // 3
    collected = 0
    for step, ckpt in enumerate(args.checkpoints, start=1):
        collected += len(rollout.wait(per_step, timeout=600))
        events.append({"t": now(), "event": "batch_ready", "step": step, "collected": collected})
        # areal/trainer/rl_trainer.py: rollout.pause(); actor.update_weights(meta); set_version; resume
        rollout.pause()
        events.append({"t": now(), "event": "rollout.pause", "step": step})
        meta = WeightUpdateMeta(type="disk", path=str(args.workdir / f"weight_update_v{step}"),
                                clear_checkpoint_after_load=False, version=step)
        # areal/engine/fsdp_engine.py _update_weights_from_disk (rank 0)
        rollout.pause_generation()
        events.append({"t": now(), "event": "pause_generation", "step": step})
        fut = rollout.update_weights_from_disk(meta)
        shutil.copytree(ckpt, meta.path, dirs_exist_ok=True)  # the trainer's _save_model_to_hf
        name_resolve.add(names.update_weights_from_disk(exp, trial, rollout.get_version()),
                         str(datetime.now().timestamp()), keepalive_ttl=120)
        events.append({"t": now(), "event": "checkpoint_saved", "step": step, "path": meta.path})
        fut.result()
        events.append({"t": now(), "event": "update_weights_from_disk_done", "step": step})
        rollout.continue_generation()
        events.append({"t": now(), "event": "continue_generation", "step": step})
        rollout.set_version(step)
        rollout.resume()
        events.append({"t": now(), "event": "set_version+resume", "step": step, "version": step})
    collected += len(rollout.wait(args.prompts - collected, timeout=600))
    events.append({"t": now(), "event": "all_collected", "collected": collected})
    rollout.destroy()
    args.out.write_text(json.dumps({"areal_version": areal.__version__, "python": sys.version.split()[0],
                                    "generation_body": template, "events": events,
                                    "responses": [RESULTS[i] for i in sorted(RESULTS)]}, indent=1))
    return 0 if collected == args.prompts else 1


if __name__ == "__main__":
    sys.exit(main())
