"""Local-process sandboxes: a working directory and subprocesses, for machines without docker.

Layout: ``<root>/<instance>/<sandbox id>/`` holds ``meta.json`` (owner), ``work/`` (the
sandbox's file system root: a spec or exec ``workdir`` of ``/a/b`` maps to ``work/a/b``),
``tmp/`` and ``command.log`` (output of the long-running command, if the spec has one).
Every process runs in its own session with a scrubbed environment (the router's own
variables, API keys included, are not passed on) tagged with the owner ids, so that remove,
release and the start-up sweep find all of them through ``/proc`` (see ``procs``).

Isolation is NOT what docker gives; this provider is for trusted agents on a dev machine.
Enforced: the working directory, the environment, the exec timeout (SIGKILL to the process
group), ``memory_mb`` as ``RLIMIT_DATA`` (heap and private writable mappings of each
process, not the sandbox's total), no core dumps. Not enforced: ``cpus`` (RLIMIT_CPU caps
CPU-seconds, not a rate), ``pids`` (RLIMIT_NPROC counts every process of the user),
``network`` (processes share the host network), ``read_only``, and ``image`` (ignored).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

from thunder_sgl.errors import BadRequest, SandboxError
from thunder_sgl.sandboxes import procs
from thunder_sgl.sandboxes.base import (
    ENV_INSTANCE,
    ENV_PORTS,
    ENV_PROGRAM,
    ENV_SANDBOX,
    TIMEOUT_EXIT_CODE,
    ExecResult,
    RunState,
)
from thunder_sgl.sandboxes.spec import SandboxSpec

KILL_PASSES = 5
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def default_root() -> Path:
    return Path(tempfile.gettempdir()) / "thunder_sgl-sandboxes"


@dataclass
class _Local:
    program_id: str
    sandbox_id: str
    dir: Path
    spec: SandboxSpec
    env: dict[str, str]
    main: asyncio.subprocess.Process | None = None
    stopped: bool = False
    groups: set[int] = field(default_factory=set)
    """Process groups started here (fallback when /proc cannot be scanned)."""

    @property
    def work(self) -> Path:
        return self.dir / "work"


class LocalProvider:
    name = "local"

    def __init__(self, instance_id: str, root: Path | None = None, *, max_output_bytes: int = 1 << 20) -> None:
        self.instance_id = instance_id
        self.root = (root or default_root()) / _SAFE.sub("_", instance_id)
        self.max_output_bytes = max_output_bytes
        self._boxes: dict[str, _Local] = {}

    # ---- lifecycle ---------------------------------------------------------------------
    async def create(self, program_id: str, sandbox_id: str, spec: SandboxSpec, ports: list[int]) -> str:
        d = self.root / _SAFE.sub("_", sandbox_id)
        for sub in ("work", "tmp", ".exec"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        meta = {"program_id": program_id, "sandbox_id": sandbox_id, "created_at": time.time()}
        (d / "meta.json").write_text(json.dumps(meta))
        env = {
            "PATH": os.environ.get("PATH", DEFAULT_PATH),
            "HOME": str(d / "work"),
            "TMPDIR": str(d / "tmp"),
            "LANG": "C.UTF-8",
            **spec.env_dict,
            ENV_INSTANCE: self.instance_id,
            ENV_PROGRAM: program_id,
            ENV_SANDBOX: sandbox_id,
            ENV_PORTS: ",".join(map(str, ports)),
        }
        box = _Local(program_id, sandbox_id, d, spec, env)
        self._boxes[str(d)] = box
        try:
            if spec.workdir:
                self._path(box, spec.workdir).mkdir(parents=True, exist_ok=True)
            if spec.command:
                await self._spawn_main(box)
        except BaseException:
            await self.remove(str(d))
            raise
        return str(d)

    async def _spawn_main(self, box: _Local) -> None:
        assert box.spec.command
        with open(box.dir / "command.log", "ab") as log:
            try:
                box.main = await asyncio.create_subprocess_exec(
                    *box.spec.command,
                    stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
                    cwd=self._path(box, box.spec.workdir), env=box.env,
                    start_new_session=True, preexec_fn=_limits(box.spec),
                )
            except OSError as e:
                raise SandboxError(f"cannot start command {list(box.spec.command)}: {e}") from e
        box.groups.add(box.main.pid)

    async def exec(
        self, handle: str, command: list[str], timeout: float, env: dict[str, str], workdir: str | None
    ) -> ExecResult:
        box = self._box(handle)
        cwd = self._path(box, workdir or box.spec.workdir)
        if not cwd.is_dir():  # as docker answers: the command could not start
            return ExecResult(126, "", f"workdir {workdir!r} does not exist in the sandbox\n", 0.0)
        # Output goes to files, not pipes: a background child that keeps a pipe open would
        # otherwise hold the exec until its timeout.
        fd, out_name = tempfile.mkstemp(dir=box.dir / ".exec", suffix=".out")
        err_fd, err_name = tempfile.mkstemp(dir=box.dir / ".exec", suffix=".err")
        t0 = time.perf_counter()
        timed_out = False
        try:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *command, stdin=asyncio.subprocess.DEVNULL, stdout=fd, stderr=err_fd,
                    cwd=cwd, env={**box.env, **env}, start_new_session=True,
                    preexec_fn=_limits(box.spec),
                )
            except (FileNotFoundError, PermissionError) as e:
                code = 127 if isinstance(e, FileNotFoundError) else 126
                return ExecResult(code, "", f"{command[0]}: {e.strerror}\n", time.perf_counter() - t0)
            finally:
                os.close(fd)
                os.close(err_fd)
            box.groups.add(proc.pid)
            try:
                code = await asyncio.wait_for(proc.wait(), timeout)
            except TimeoutError:
                timed_out = True
                procs.signal_group(proc.pid)
                await proc.wait()
                code = TIMEOUT_EXIT_CODE
            finally:
                box.groups.discard(proc.pid)
            duration = time.perf_counter() - t0
            stdout, t1 = _read_capped(out_name, self.max_output_bytes)
            stderr, t2 = _read_capped(err_name, self.max_output_bytes)
            return ExecResult(code, stdout, stderr, duration, timed_out, t1 or t2)
        finally:
            for name in (out_name, err_name):
                with contextlib.suppress(OSError):
                    os.unlink(name)

    async def start(self, handle: str) -> None:
        box = self._box(handle)
        if box.stopped:
            self._signal(box, signal.SIGCONT)
            box.stopped = False
        if box.spec.command and (box.main is None or box.main.returncode is not None):
            await self._spawn_main(box)

    async def stop(self, handle: str) -> None:
        box = self._box(handle)
        self._signal(box, signal.SIGSTOP)
        box.stopped = True

    async def state(self, handle: str) -> RunState:
        box = self._boxes.get(handle)
        if box is None or not box.dir.is_dir():
            return RunState.MISSING
        if box.stopped or (box.main is not None and box.main.returncode is not None):
            return RunState.STOPPED
        return RunState.RUNNING

    async def remove(self, handle: str) -> None:
        box = self._boxes.pop(handle, None)
        sid = box.sandbox_id if box else _read_meta(Path(handle)).get("sandbox_id")
        if sid:
            await self._kill_tagged({ENV_SANDBOX: sid})
        if box is not None:
            for g in list(box.groups):
                procs.signal_group(g, signal.SIGKILL)
            if box.main is not None:
                await box.main.wait()
        await asyncio.to_thread(shutil.rmtree, handle, True)

    async def reap_program(self, program_id: str) -> int:
        n = 0
        for d, meta in self._on_disk():
            if meta.get("program_id") == program_id:
                await self.remove(str(d))
                n += 1
        await self._kill_tagged({ENV_PROGRAM: program_id})
        return n

    async def sweep(self, live_program_ids: Collection[str]) -> int:
        live = set(live_program_ids)
        n = 0
        for d, meta in self._on_disk():
            if meta.get("program_id") not in live:
                await self.remove(str(d))
                n += 1
        stray = procs.tagged({ENV_INSTANCE: self.instance_id}, key=ENV_PROGRAM)
        procs.signal_all(p for p, prog in stray.items() if prog not in live)
        return n

    async def adopt_container(self, ref: str, program_id: str) -> str:
        raise BadRequest("container resources need the docker sandbox provider (sandboxes.provider)", param="kind")

    async def remove_container(self, ref: str) -> bool:
        return False

    async def close(self) -> None:
        """Forget in-memory state; what still runs stays (release or the next sweep reaps it)."""
        self._boxes.clear()

    # ---- helpers -----------------------------------------------------------------------
    def _box(self, handle: str) -> _Local:
        box = self._boxes.get(handle)
        if box is None:
            raise SandboxError(f"local sandbox {handle} is gone")
        return box

    def _path(self, box: _Local, workdir: str | None) -> Path:
        return box.work / workdir.lstrip("/") if workdir else box.work

    def _signal(self, box: _Local, sig: int) -> None:
        for g in box.groups:
            procs.signal_group(g, sig)
        procs.signal_all(procs.tagged({ENV_INSTANCE: self.instance_id, ENV_SANDBOX: box.sandbox_id}), sig)

    async def _kill_tagged(self, match: dict[str, str]) -> None:
        # A process caught in the middle of execve shows an empty environ: scan again until a
        # pass finds nothing (bounded), so a child that was exec'ing during one pass dies too.
        for _ in range(KILL_PASSES):
            if not procs.signal_all(procs.tagged({ENV_INSTANCE: self.instance_id, **match})):
                return
            await asyncio.sleep(0.02)

    def _on_disk(self) -> list[tuple[Path, dict[str, str]]]:
        try:
            dirs = [d for d in self.root.iterdir() if d.is_dir()]
        except FileNotFoundError:
            return []
        return [(d, _read_meta(d)) for d in dirs]


def _read_meta(d: Path) -> dict[str, str]:
    try:
        data = json.loads((d / "meta.json").read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _read_capped(name: str, cap: int) -> tuple[str, bool]:
    with open(name, "rb") as f:
        data = f.read(cap + 1)
    return data[:cap].decode(errors="replace"), len(data) > cap


def _limits(spec: SandboxSpec) -> Callable[[], None]:
    data_bytes = spec.memory_mb * 1024 * 1024

    def apply() -> None:  # runs in the child between fork and exec
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        if hard == resource.RLIM_INFINITY or hard > data_bytes:
            resource.setrlimit(resource.RLIMIT_DATA, (data_bytes, data_bytes))

    return apply

