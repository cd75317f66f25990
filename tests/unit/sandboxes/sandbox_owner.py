"""A stand-in "router process" that owns sandboxes, for the crash-and-sweep tests.

It builds a SandboxManager exactly as the router does (provider chosen by name, a stable
instance id), creates one sandbox per program, waits until they are ready, prints one JSON
line describing them, then sleeps until it is killed. The tests SIGKILL it and check that a
new manager with the same instance id sweeps every orphan.

    python sandbox_owner.py --provider local --instance ID --programs 3 --root DIR
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from thunder_sgl.sandboxes import SandboxManager, open_provider, procs
from thunder_sgl.sandboxes.base import ENV_INSTANCE
from thunder_sgl.sandboxes.config import SandboxConfig

REPO = Path(__file__).resolve().parents[3]


def tagged_pids(instance_id: str, **match: str) -> list[int]:
    """Live processes carrying our tag."""
    return sorted(procs.tagged({ENV_INSTANCE: instance_id, **match}))


def start_owner(provider: str, instance: str, programs: int, *extra: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """Run the stand-in router process until its sandboxes are ready; return it and them."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--provider", provider, "--instance", instance, "--programs", str(programs), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    line = proc.stdout.readline() if proc.stdout else ""
    if not line:
        proc.kill()
        _, err = proc.communicate(timeout=10)
        raise AssertionError(f"owner process died: {err}")
    return proc, json.loads(line)


def kill_owner(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    for f in (proc.stdout, proc.stderr):
        if f is not None:
            f.close()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--provider", choices=["docker", "local"], required=True)
    ap.add_argument("--instance", required=True)
    ap.add_argument("--programs", type=int, default=3)
    ap.add_argument("--root", type=Path)
    ap.add_argument("--state", type=Path)
    args = ap.parse_args()
    config = SandboxConfig(provider=args.provider)
    provider = open_provider(config, args.instance, local_root=args.root)
    manager = SandboxManager(config, provider, args.instance, state_path=args.state)
    spec: dict[str, object] = {"ports": 1}
    if args.provider == "local":
        spec["command"] = ["sleep", "300"]
    infos = [await manager.create(f"prog-{i}", spec) for i in range(args.programs)]
    ready = [await manager.wait_ready(i.program_id, i.id, 60) for i in infos]
    for i in ready:
        if i.status.value != "ready":
            sys.exit(f"sandbox {i.id} is {i.status.value}: {i.error}")
        if args.provider == "local":
            # A daemon that escapes the process group: only the environment tag finds it.
            await manager.exec(i.program_id, i.id, "setsid sleep 300 >/dev/null 2>&1 &", 10)
    external = None
    if args.provider == "docker" and args.state is not None:
        # A container the agent made itself (no labels of ours), registered for reaping.
        import docker

        client = docker.from_env()
        c = client.containers.create(
            "thunder-sandbox:latest", ["sleep", "3600"], name=f"ext-{args.instance}", network_mode="none"
        )
        c.start()
        external = (await manager.register_resource("prog-1", {"kind": "container", "id": c.name}))["id"]
    boxes = [{"program_id": i.program_id, "id": i.id, "handle": i.handle, "ports": i.ports} for i in ready]
    print(json.dumps({"sandboxes": boxes, "external": external}), flush=True)
    await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main())
