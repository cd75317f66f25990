"""An RL framework's own rollout client, unmodified, through thunder in front of two real SGLang
CPU engines, with two weight updates from disk (issue 24 item 3).

    python bench/real/framework_rollout.py --framework-python /tmp/fwvenv/bin/python \\
        --out bench/results/rl-framework-client

The framework is AReaL 1.0.4 (``pip install --no-deps areal==1.0.4`` plus the few modules its
import needs, in a venv of its own that also sees the SGLang venv's torch; the command is in the
results' ``command.txt``). This script, in thunder's venv, never imports it:

1. makes two new checkpoints: copies of the tiny GPT-2 with seeded noise added to every weight
   (``step-1``, ``step-2``), so that the greedy tokens of each version differ and say which
   weights made them;
2. starts two real SGLang 0.5.23 CPU engines and thunder in front of them, on free ports;
3. runs ``bench/real/areal_driver.py`` under the framework's Python: AReaL's
   ``RemoteSGLangEngine`` with thunder's address as its only server, a rollout of greedy
   generations (``return_logprob``, as AReaL always asks) with two weight updates done AReaL's
   way (``/pause_generation``, ``/update_weights_from_disk`` with ``abort_all_requests``,
   ``/continue_generation``, the version bumped on the client);
4. checks, from AReaL's own responses:
   - every generation answered in full (aborted ones resent by AReaL and completed);
   - every run of tokens AReaL labelled with version v is reproduced, token for token and
     logprob for logprob, by the same body sent straight to an engine loaded with checkpoint v
     (the base model for v = 0): the logprobs through thunder are the engine's, and each token
     came from the weights of the window it fell in;
   - thunder's window counters: every update through it, nothing held expired, nothing failed.

Every process started here is stopped at the end, also on failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from thunder_sgl.benchmark.drivers.peers import start_thunder
from thunder_sgl.children import Proc
from thunder_sgl.engine import EngineEnv, EngineOptions, start_engines

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "areal_driver.py"
NOISE = r"""
import shutil, sys, torch
from pathlib import Path
from safetensors.torch import load_file, save_file
src, dst, seed = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
shutil.copytree(src, dst, dirs_exist_ok=True)
sd = load_file(str(src / "model.safetensors"))
g = torch.Generator().manual_seed(seed)
out = {k: (v + 0.02 * torch.randn(v.shape, generator=g, dtype=v.dtype)) if v.is_floating_point() else v
       for k, v in sd.items()}
save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
"""


def make_checkpoints(env: EngineEnv, base: Path, work: Path) -> list[Path]:
    out = []
    for step in (1, 2):
        dst = work / f"checkpoint-step-{step}"
        subprocess.run([str(env.python), "-c", NOISE, str(base), str(dst), str(step)], check=True, timeout=300)
        out.append(dst)
    return out


def segments(versions: list[int]) -> list[tuple[int, int, int]]:
    """(start, end, version) runs of one version in AReaL's per-token versions."""
    runs: list[tuple[int, int, int]] = []
    for i, v in enumerate(versions):
        if runs and runs[-1][2] == v:
            runs[-1] = (runs[-1][0], i + 1, v)
        else:
            runs.append((i, i + 1, v))
    return runs


def reference_check(thunder_url: str, engine_url: str, checkpoints: list[Path], body: dict, responses: list[dict]) -> dict:
    """Each run of tokens AReaL labelled version v, sent again, one request at a time, after both
    engines load checkpoint v (through thunder): straight to one engine, and through thunder.
    The tokens must be AReaL's; the logprobs through thunder must equal the engine's exactly;
    AReaL's logprobs (made in batches during the rollout) are compared with the engine's too."""
    checked, token_mismatch, rollout_diff, thunder_diff, repeat_diff = 0, [], 0.0, 0.0, 0.0
    by_version: dict[int, int] = {}
    with httpx.Client(timeout=600) as h:
        for v, ckpt in enumerate(checkpoints):
            r = h.post(thunder_url + "/update_weights_from_disk", json={"model_path": str(ckpt)})
            assert r.status_code == 200 and r.json()["success"] and r.json()["workers_updated"] == 2, r.text
            for resp in responses:
                for a, b, ver in segments(resp["output_versions"]):
                    if ver != v:
                        continue
                    req = json.loads(json.dumps(body))
                    req["input_ids"] = resp["input_ids"] + resp["output_tokens"][:a]
                    req["sampling_params"]["max_new_tokens"] = b - a
                    direct = h.post(engine_url + "/generate", json=req).json()["meta_info"]["output_token_logprobs"]
                    via = h.post(thunder_url + "/generate", json=req).json()["meta_info"]["output_token_logprobs"]
                    again = h.post(engine_url + "/generate", json=req).json()["meta_info"]["output_token_logprobs"]
                    checked += 1
                    by_version[v] = by_version.get(v, 0) + (b - a)
                    if [t[1] for t in direct] != resp["output_tokens"][a:b] or [t[1] for t in via] != [t[1] for t in direct]:
                        token_mismatch.append({"idx": resp["idx"], "version": v, "span": [a, b]})
                        continue
                    for x, y, z, w in zip(direct, via, resp["output_logprobs"][a:b], again, strict=True):
                        repeat_diff = max(repeat_diff, abs(x[0] - w[0]) if x[1] == w[1] else 0.0)
                        thunder_diff = max(thunder_diff, abs(x[0] - y[0]))
                        rollout_diff = max(rollout_diff, abs(x[0] - z))
    return {"runs_checked": checked, "tokens_checked_per_version": by_version, "token_mismatches": token_mismatch,
            "max_abs_logprob_diff_thunder_vs_engine": thunder_diff,
            "max_abs_logprob_diff_engine_vs_itself": repeat_diff,
            "max_abs_logprob_diff_rollout_vs_engine": rollout_diff}


def batch_noise(engine_url: str, body: dict, prompts: list[list[int]]) -> float:
    """How much the engine's own logprobs move with the batch: the same bodies sent straight to one
    engine one at a time, then all at once (the rollout ran batches of about concurrency / 2)."""
    async def go() -> float:
        async with httpx.AsyncClient(timeout=600) as h:
            reqs = [{**json.loads(json.dumps(body)), "input_ids": p} for p in prompts]
            alone = [(await h.post(engine_url + "/generate", json=r)).json() for r in reqs]
            together = await asyncio.gather(*(h.post(engine_url + "/generate", json=r) for r in reqs))
            diff = 0.0
            for a, t in zip(alone, together, strict=True):
                for x, y in zip(a["meta_info"]["output_token_logprobs"], t.json()["meta_info"]["output_token_logprobs"], strict=True):
                    if x[1] == y[1]:
                        diff = max(diff, abs(x[0] - y[0]))
            return diff

    return asyncio.run(go())


def versions_differ(engine_url: str, checkpoints: list[Path], body: dict, prompt: list[int]) -> list[list[int]]:
    """The greedy tokens of one prompt under each checkpoint (they must differ for the check to mean anything)."""
    outs = []
    with httpx.Client(timeout=600) as h:
        for ckpt in checkpoints:
            assert h.post(engine_url + "/update_weights_from_disk", json={"model_path": str(ckpt)}).json()["success"]
            req = {**json.loads(json.dumps(body)), "input_ids": prompt}
            req["sampling_params"]["max_new_tokens"] = 16
            outs.append([t[1] for t in h.post(engine_url + "/generate", json=req).json()["meta_info"]["output_token_logprobs"]])
    return outs


def window_check(events: list[dict], responses: list[dict]) -> list[str]:
    """AReaL's version labels against the windows: a token labelled v was answered after update v's
    resume and before update v+1's pause (a run aborted by a pause keeps the old version)."""
    bad = []
    resume = {e["step"]: e["t"] for e in events if e["event"] == "set_version+resume"}
    pause = {e["step"]: e["t"] for e in events if e["event"] == "pause_generation"}
    for r in responses:
        last = max(r["output_versions"]) if r["output_versions"] else 0
        if last > 0 and r["answered"] < resume[last]:
            bad.append(f"response {r['idx']} has version {last} but was answered before its resume")
        if last + 1 in pause and r["answered"] > pause[last + 1] + 5 and r["output_versions"][-1] == last \
                and len(r["output_tokens"]) == len(r["output_versions"]) and r["started"] > pause[last + 1]:
            bad.append(f"response {r['idx']} started after update {last + 1} yet labelled {last}")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--framework-python", required=True, help="a Python with areal==1.0.4 installed")
    ap.add_argument("--out", type=Path, default=None, help="write result.json and results.md here")
    ap.add_argument("--prompts", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--concurrency", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per engine")
    args = ap.parse_args(argv)

    env = EngineEnv.locate()
    why = env.check()
    if why:
        print(why, file=sys.stderr)
        return 2
    base = env.model("tiny")
    work = Path(tempfile.mkdtemp(prefix="thunder-areal-"))
    t0 = time.monotonic()
    checkpoints = make_checkpoints(env, base, work)
    cluster = None
    thunder: Proc | None = None
    try:
        cluster = start_engines(2, EngineOptions(model=base, max_total_tokens=16384, threads=args.threads), env, work / "engines")
        thunder = start_thunder(cluster.urls, log_dir=work / "logs")
        addr = thunder.url.removeprefix("http://")
        driver_out = work / "areal.json"
        cmd = [args.framework_python, str(DRIVER), "--addr", addr, "--checkpoints", *map(str, checkpoints),
               "--workdir", str(work / "areal"), "--out", str(driver_out), "--prompts", str(args.prompts),
               "--max-new-tokens", str(args.max_new_tokens), "--concurrency", str(args.concurrency)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())})
        (work / "areal-driver.log").write_text(r.stdout + r.stderr)
        if r.returncode != 0 or not driver_out.exists():
            print(r.stdout[-4000:], r.stderr[-8000:], file=sys.stderr)
            return 1
        d = json.loads(driver_out.read_text())
        rollout_s = time.monotonic() - t0
        u = thunder.url
        with httpx.Client(timeout=30) as h:
            ws = h.get(u + "/weight_sync").json()
            metrics = {ln.split()[0]: float(ln.split()[1]) for ln in h.get(u + "/metrics").text.splitlines()
                       if ln.startswith(("thunder_window", "thunder_held_expired", "thunder_kv_resets",
                                         "thunder_weight_changes_seen", "thunder_engine_pauses_seen"))
                       and len(ln.split()) == 2}
            engine_versions = [h.get(x + "/model_info").json().get("weight_version") for x in cluster.urls]
        responses = d["responses"]
        body = d["generation_body"]
        answered = [x for x in responses if x["stop_reason"] == "length" and len(x["output_tokens"]) == args.max_new_tokens]
        resent = [x["idx"] for x in responses if len(segments(x["output_versions"])) > 1]
        ref = reference_check(u, cluster.urls[0], [base, *checkpoints], body, responses)
        noise = batch_noise(cluster.urls[0], body, [x["input_ids"] for x in responses[: args.concurrency // 2]])
        differ = versions_differ(cluster.urls[1], [base, *checkpoints], body, responses[0]["input_ids"])
        result = {
            "framework": "areal", "framework_version": d["areal_version"], "client": "areal.engine.sglang_remote.RemoteSGLangEngine",
            "engines": 2, "sglang": "0.5.23 (CPU)", "model": "tiny GPT-2 (random weights)",
            "prompts": args.prompts, "max_new_tokens": args.max_new_tokens, "concurrency": args.concurrency,
            "answered_in_full": len(answered), "resent_after_abort": resent,
            "versions_per_response": {str(x["idx"]): x["output_versions"][0:1] + x["output_versions"][-1:] for x in responses},
            "reference": ref, "engine_batch_noise_max_abs_logprob": noise, "greedy_first_16_tokens_per_version": differ,
            "window_check_problems": window_check(d["events"], responses),
            "events": d["events"], "thunder_weight_sync": ws, "thunder_metrics": metrics,
            "engine_weight_versions_after": engine_versions, "generation_body": body,
            "rollout_seconds": round(rollout_s, 1),
        }
        ok = (len(answered) == args.prompts and not ref["token_mismatches"]
              and ref["max_abs_logprob_diff_thunder_vs_engine"] <= max(noise, ref["max_abs_logprob_diff_engine_vs_itself"], 1e-5)
              and ref["max_abs_logprob_diff_rollout_vs_engine"] <= max(noise, 1e-5) * 2
              and not result["window_check_problems"] and len({tuple(x) for x in differ}) == 3
              and metrics.get("thunder_held_expired_total", 0) == 0)
        result["ok"] = ok
        print(json.dumps({k: v for k, v in result.items() if k not in ("versions_per_response", "events")}, indent=1))
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "result.json").write_text(json.dumps(result, indent=1) + "\n")
            (args.out / "command.txt").write_text(" ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]) + "\n")
        return 0 if ok else 1
    finally:
        if thunder is not None:
            thunder.stop()
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
