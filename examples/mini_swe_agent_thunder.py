"""mini-swe-agent through thunder, its shell commands in the program's sandbox.

``ThunderSandboxEnvironment`` is a mini-swe-agent ``Environment`` (``execute``,
``get_template_vars``, ``serialize``): each agent is one thunder program, whose sandbox the
router creates (``POST /programs/{id}/sandboxes``), runs every command in
(``.../exec``: the router sees the program ACTING while it runs) and removes when the program
is released. ``run_agent`` runs one unmodified ``DefaultAgent`` with ``LitellmModel`` pointed at
the router, its program id in the model's own ``model_kwargs.extra_body``, and releases the
program when the agent stops, whatever the way (sandbox reclaimed).

Against a running router with a sandbox provider (``--thunder-sandbox-provider docker``):

    python examples/mini_swe_agent_thunder.py --router http://127.0.0.1:30000 --model default \\
        --agents 4 --steps 10 --task "Count the files in /etc"

It prints one JSON line per agent (exit status, model calls, commands run).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")

SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
"""What mini-swe-agent's own environments read as the agent submitting (first output line)."""


class ThunderSandboxEnvironment:
    """A mini-swe-agent environment whose commands run in a thunder program's sandbox."""

    def __init__(self, *, router_url: str, program_id: str, image: str | None = None, timeout: float = 30.0,
                 api_key: str | None = None, ready_timeout: float = 120.0, env: dict[str, str] | None = None) -> None:
        self.router = router_url.rstrip("/")
        self.program_id = program_id
        self.timeout = timeout
        self.env = dict(env or {})
        self.http = httpx.Client(timeout=timeout + 30, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
        self.commands = 0
        spec: dict[str, Any] = {"image": image} if image else {}
        r = self.http.post(f"{self.router}/programs/{program_id}/sandboxes", json=spec)
        r.raise_for_status()
        self.sandbox_id = r.json()["id"]
        deadline = time.monotonic() + ready_timeout
        while True:  # the router waits up to 60 s per call (``?wait=``) for the set-up
            wait = max(0.0, min(60.0, deadline - time.monotonic()))
            r = self.http.get(self._base, params={"wait": wait}, timeout=wait + 10)
            r.raise_for_status()
            info = r.json()
            if info.get("status") == "ready":
                break
            if info.get("status") not in ("preparing", "stopped") or time.monotonic() >= deadline:
                raise RuntimeError(f"sandbox {self.sandbox_id} of {program_id} is not ready: {info}")
        uname = self._exec("uname -srvm", 10.0).get("stdout", "").split()
        self.system = dict(zip(("system", "release", "version", "machine"),
                               [*uname[:2], " ".join(uname[2:-1]), uname[-1]] if len(uname) >= 4 else ["", "", "", ""],
                               strict=True))

    @property
    def _base(self) -> str:
        return f"{self.router}/programs/{self.program_id}/sandboxes/{self.sandbox_id}"

    def _exec(self, command: str, timeout: float, cwd: str = "") -> dict[str, Any]:
        body: dict[str, Any] = {"command": command, "timeout": timeout}
        if cwd:
            body["workdir"] = cwd
        if self.env:
            body["env"] = self.env
        r = self.http.post(f"{self._base}/exec", json=body, timeout=timeout + 30)
        r.raise_for_status()
        return r.json()

    # ---- mini-swe-agent's Environment protocol ----------------------------------------
    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Run the action's command in the sandbox; the output mini-swe-agent's local
        environment gives (stdout then stderr, return code), and its submission rule."""
        from minisweagent.exceptions import Submitted

        self.commands += 1
        try:
            res = self._exec(action.get("command", ""), float(timeout or self.timeout), cwd)
            output = {"output": res["stdout"] + res["stderr"], "returncode": res["exit_code"],
                      "exception_info": "the command timed out" if res.get("timed_out") else ""}
        except httpx.HTTPError as e:
            output = {"output": "", "returncode": -1, "exception_info": f"the sandbox call failed: {e}"}
        lines = output["output"].lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted({"role": "exit", "content": submission,
                             "extra": {"exit_status": "Submitted", "submission": submission}})
        return output

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return {**self.system, "program_id": self.program_id, "sandbox_id": self.sandbox_id, **kwargs}

    def serialize(self) -> dict[str, Any]:
        return {"info": {"config": {"environment": {"router": self.router, "program_id": self.program_id,
                                                    "sandbox_id": self.sandbox_id},
                                    "environment_type": f"{__name__}.{type(self).__name__}"}}}

    def release(self) -> None:
        """Release the program: the router removes its sandbox."""
        try:
            self.http.post(f"{self.router}/programs/{self.program_id}/release").raise_for_status()
        finally:
            self.http.close()


def mini_config() -> dict[str, Any]:
    """mini-swe-agent's own ``mini.yaml`` (its tool-call agent), not interactive."""
    import yaml
    from minisweagent import package_dir

    cfg = yaml.safe_load(Path(package_dir / "config" / "mini.yaml").read_text())
    cfg["agent"].pop("mode", None)
    return cfg


def run_agent(router_url: str, model: str, task: str, steps: int, program_id: str | None = None,
              image: str | None = None, max_tokens: int = 256, api_key: str | None = None) -> dict[str, Any]:
    """One unmodified mini-swe-agent: ``DefaultAgent`` + ``LitellmModel`` at the router, its
    commands in its program's sandbox, the program released at the end."""
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.models.litellm_model import LitellmModel

    pid = program_id or f"msa-{uuid.uuid4().hex[:12]}"
    cfg = mini_config()
    env = ThunderSandboxEnvironment(router_url=router_url, program_id=pid, image=image, api_key=api_key)
    t0 = time.monotonic()
    try:
        kwargs = {**cfg["model"].get("model_kwargs", {}), "api_base": router_url.rstrip("/") + "/v1",
                  "api_key": api_key or "none", "max_tokens": max_tokens, "extra_body": {"program_id": pid}}
        model_cfg = {k: v for k, v in cfg["model"].items() if k != "model_kwargs"}
        agent = DefaultAgent(LitellmModel(model_name=f"openai/{model}", model_kwargs=kwargs, **model_cfg), env,
                             **{**cfg["agent"], "step_limit": steps, "cost_limit": 0, "max_consecutive_format_errors": 0})
        info = agent.run(task)
        return {"program_id": pid, "exit": info.get("exit_status"), "calls": agent.n_calls,
                "commands": env.commands, "seconds": round(time.monotonic() - t0, 2)}
    finally:
        env.release()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--router", required=True, help="the thunder router's URL")
    ap.add_argument("--model", default="default", help="model name the engines serve")
    ap.add_argument("--agents", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10, help="model calls per agent (step_limit)")
    ap.add_argument("--task", default="List the files in the current directory, then submit.")
    ap.add_argument("--image", default=None, help="sandbox image (default: the router's sandboxes.default_image)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--api-key", default=None)
    a = ap.parse_args(argv)
    with ThreadPoolExecutor(max_workers=a.agents) as pool:
        futs = [pool.submit(run_agent, a.router, a.model, a.task, a.steps, None, a.image, a.max_tokens, a.api_key)
                for _ in range(a.agents)]
        failed = 0
        for f in futs:
            try:
                print(json.dumps(f.result()), flush=True)
            except Exception as e:  # noqa: BLE001 - one agent's failure is reported, the others go on
                failed += 1
                print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
