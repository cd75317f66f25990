"""Docker sandboxes through the docker SDK, with secure defaults.

Every container gets: ``cap_drop=["ALL"]``, ``privileged=False``,
``security_opt=["no-new-privileges"]``, a memory limit with swap disabled, a CPU quota
(``nano_cpus``, clamped to the host's CPU count, which is what an over-large quota means
anyway), a pids limit, the spec's network mode (``none`` unless the spec asks for an allowed
other), an optional read-only root (with a tmpfs ``/tmp``), and the labels ``thunder_sgl.program``,
``thunder_sgl.instance`` and ``thunder_sgl.sandbox``. Images are never pulled: containers are
created with ``containers.create`` (``run`` would pull a missing image).

The SDK blocks, so every call runs in a thread: control calls (create, start, stop, remove,
list) in a small pool whose size bounds the load on the daemon (8: creating 200 containers
on 2 cores stays smooth), execs in a larger pool since each may last minutes. An exec that
outlives its timeout is killed from the host through ``/proc`` (its host pid is in
``exec_inspect``, checked against the container's cgroup); with a remote daemon that is not
possible and the command is left running in its container until the container is removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import docker
import docker.errors

from thunder_sgl.errors import Conflict, Forbidden, NotFound, SandboxError
from thunder_sgl.sandboxes import procs
from thunder_sgl.sandboxes.base import (
    ENV_INSTANCE,
    ENV_PORTS,
    ENV_PROGRAM,
    ENV_SANDBOX,
    LABEL_INSTANCE,
    LABEL_PROGRAM,
    LABEL_SANDBOX,
    TIMEOUT_EXIT_CODE,
    ExecResult,
    RunState,
)
from thunder_sgl.sandboxes.spec import KEEPALIVE_COMMAND, SandboxSpec

T = TypeVar("T")
log = logging.getLogger(__name__)
KILL_GRACE_SECONDS = 5.0


class _Capture:
    """Output of one exec, filled by the thread that reads the stream."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.out = bytearray()
        self.err = bytearray()
        self.truncated = False
        self.exec_id: str | None = None
        self.abandoned = False

    def add(self, buf: bytearray, chunk: bytes | None) -> None:
        if chunk:
            room = self.cap - len(buf)
            buf += chunk[: max(room, 0)]
            self.truncated |= len(chunk) > room


class DockerProvider:
    name = "docker"

    def __init__(
        self,
        instance_id: str,
        client: docker.DockerClient,
        *,
        control_concurrency: int = 8,
        exec_concurrency: int = 64,
        max_output_bytes: int = 1 << 20,
        stop_timeout: int = 2,
    ) -> None:
        self.instance_id = instance_id
        self.client = client
        self.max_output_bytes = max_output_bytes
        self.stop_timeout = stop_timeout
        self.host_cpus = float(client.info().get("NCPU") or os.cpu_count() or 1)
        self._control = ThreadPoolExecutor(control_concurrency, thread_name_prefix="thunder-docker")
        self._execs = ThreadPoolExecutor(exec_concurrency, thread_name_prefix="thunder-docker-exec")

    @classmethod
    def connect(cls, instance_id: str, **kw: Any) -> DockerProvider:
        """Connect through ``DOCKER_HOST`` (or the default socket). Blocking; raises
        ``SandboxError`` when no daemon answers."""
        pool = kw.get("control_concurrency", 8) + kw.get("exec_concurrency", 64)
        try:
            client = docker.from_env(max_pool_size=pool)
            client.ping()
        except Exception as e:  # the SDK raises a zoo of types for "no daemon"
            raise SandboxError(f"no docker daemon answers: {e}") from e
        return cls(instance_id, client, **kw)

    # ---- lifecycle ---------------------------------------------------------------------
    async def create(self, program_id: str, sandbox_id: str, spec: SandboxSpec, ports: list[int]) -> str:
        labels = {LABEL_PROGRAM: program_id, LABEL_INSTANCE: self.instance_id, LABEL_SANDBOX: sandbox_id}
        env = {
            **spec.env_dict,
            ENV_INSTANCE: self.instance_id,
            ENV_PROGRAM: program_id,
            ENV_SANDBOX: sandbox_id,
            ENV_PORTS: ",".join(map(str, ports)),
        }
        kwargs: dict[str, Any] = dict(
            image=spec.image,
            command=list(spec.command or KEEPALIVE_COMMAND),
            name=f"thunder-{sandbox_id}",
            labels=labels,
            environment=env,
            working_dir=spec.workdir,
            network_mode=spec.network,
            cap_drop=["ALL"],
            privileged=False,
            security_opt=["no-new-privileges"],
            mem_limit=f"{spec.memory_mb}m",
            memswap_limit=f"{spec.memory_mb}m",
            nano_cpus=int(min(spec.cpus, self.host_cpus) * 1e9),
            pids_limit=spec.pids,
            read_only=spec.read_only,
            tmpfs={"/tmp": "rw,nosuid,nodev,size=64m"} if spec.read_only else None,
        )

        def run() -> str:
            c = self.client.containers.create(**kwargs)
            try:
                c.start()
            except BaseException:
                with contextlib.suppress(docker.errors.DockerException):
                    c.remove(force=True)
                raise
            return str(c.id)

        try:
            return await self._run(run)
        except docker.errors.ImageNotFound as e:
            raise SandboxError(
                f"image {spec.image!r} is not on the docker host (images are never pulled; build or import it)"
            ) from e
        except docker.errors.APIError as e:
            raise SandboxError(f"docker refused the sandbox: {e.explanation or e}") from e

    async def exec(
        self, handle: str, command: list[str], timeout: float, env: dict[str, str], workdir: str | None
    ) -> ExecResult:
        cap = _Capture(self.max_output_bytes)
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        fut = loop.run_in_executor(self._execs, self._exec_blocking, handle, command, env, workdir, cap)
        timed_out = False
        try:
            code = await asyncio.wait_for(asyncio.shield(fut), timeout)
        except TimeoutError:
            timed_out = True
            cap.abandoned = True
            await asyncio.to_thread(self._kill_exec, handle, cap)
            try:
                await asyncio.wait_for(asyncio.shield(fut), KILL_GRACE_SECONDS)
            except TimeoutError:
                fut.add_done_callback(lambda f: f.cancelled() or f.exception())
            except docker.errors.DockerException:
                pass
            code = TIMEOUT_EXIT_CODE
        except docker.errors.NotFound as e:
            raise Conflict("the sandbox's container is gone", code="sandbox_gone") from e
        except docker.errors.APIError as e:
            raise Conflict(f"docker refused the exec: {e.explanation or e}", code="sandbox_not_running") from e
        return ExecResult(
            exit_code=code,
            stdout=cap.out.decode(errors="replace"),
            stderr=cap.err.decode(errors="replace"),
            duration_seconds=time.perf_counter() - t0,
            timed_out=timed_out,
            truncated=cap.truncated,
        )

    def _exec_blocking(self, handle: str, command: list[str], env: dict[str, str], workdir: str | None, cap: _Capture) -> int:
        api = self.client.api
        ex = api.exec_create(handle, command, stdout=True, stderr=True, environment=env or None, workdir=workdir)
        cap.exec_id = ex["Id"]
        if cap.abandoned:  # timed out before it even started
            return TIMEOUT_EXIT_CODE
        for out, err in api.exec_start(ex["Id"], stream=True, demux=True):
            cap.add(cap.out, out)
            cap.add(cap.err, err)
        code = api.exec_inspect(ex["Id"]).get("ExitCode")
        return -1 if code is None else int(code)

    def _kill_exec(self, handle: str, cap: _Capture) -> None:
        if cap.exec_id is None:
            return
        with contextlib.suppress(docker.errors.DockerException):
            pid = int(self.client.api.exec_inspect(cap.exec_id).get("Pid") or 0)
            if pid > 0 and procs.in_cgroup_of(pid, handle):
                procs.signal_all([pid, *procs.descendants(pid)])

    async def start(self, handle: str) -> None:
        await self._control_call(lambda: self.client.api.start(handle))

    async def stop(self, handle: str) -> None:
        await self._control_call(lambda: self.client.api.stop(handle, timeout=self.stop_timeout))

    async def state(self, handle: str) -> RunState:
        try:
            info = await self._run(lambda: self.client.api.inspect_container(handle))
        except docker.errors.NotFound:
            return RunState.MISSING
        return RunState.RUNNING if info["State"].get("Running") and not info["State"].get("Paused") else RunState.STOPPED

    async def remove(self, handle: str) -> None:
        await self._run(self._remove_blocking, handle)

    def _remove_blocking(self, ref: str) -> bool:
        try:
            self.client.api.remove_container(ref, force=True, v=True)
            return True
        except docker.errors.NotFound:
            return False
        except docker.errors.APIError as e:
            if e.status_code == 409:  # removal already in progress
                return False
            raise SandboxError(f"docker could not remove container {ref[:12]}: {e.explanation or e}") from e

    async def reap_program(self, program_id: str) -> int:
        return await self._remove_labelled(lambda labels: labels.get(LABEL_PROGRAM) == program_id, program_id)

    async def sweep(self, live_program_ids: Collection[str]) -> int:
        live = set(live_program_ids)
        return await self._remove_labelled(lambda labels: labels.get(LABEL_PROGRAM) not in live)

    async def _remove_labelled(self, doomed: Callable[[dict[str, str]], bool], program_id: str | None = None) -> int:
        filters = [f"{LABEL_INSTANCE}={self.instance_id}"]
        if program_id is not None:
            filters.append(f"{LABEL_PROGRAM}={program_id}")
        found = await self._run(lambda: self.client.api.containers(all=True, filters={"label": filters}))
        ids = [c["Id"] for c in found if doomed(c.get("Labels") or {})]
        removed = await asyncio.gather(*(self._run(self._remove_blocking, i) for i in ids), return_exceptions=True)
        for r in removed:
            if isinstance(r, BaseException):
                log.warning("sandbox sweep: %s", r)
        return sum(1 for r in removed if r is True)

    async def adopt_container(self, ref: str, program_id: str) -> str:
        try:
            info = await self._run(lambda: self.client.api.inspect_container(ref))
        except docker.errors.NotFound as e:
            raise NotFound(f"container {ref!r} not found on the docker host", param="id") from e
        labels = info["Config"].get("Labels") or {}
        owner = labels.get(LABEL_PROGRAM)
        instance = labels.get(LABEL_INSTANCE)
        if (owner is not None and owner != program_id) or (instance is not None and instance != self.instance_id):
            raise Forbidden(f"container {ref!r} belongs to another program or router", param="id")
        return str(info["Id"])

    async def remove_container(self, ref: str) -> bool:
        return await self._run(self._remove_blocking, ref)

    async def close(self) -> None:
        self._control.shutdown(wait=False, cancel_futures=True)
        self._execs.shutdown(wait=False, cancel_futures=True)
        await asyncio.to_thread(self.client.close)

    # ---- helpers -----------------------------------------------------------------------
    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._control, fn, *args)

    async def _control_call(self, fn: Callable[[], Any]) -> None:
        try:
            await self._run(fn)
        except docker.errors.NotFound as e:
            raise Conflict("the sandbox's container is gone", code="sandbox_gone") from e
        except docker.errors.APIError as e:
            raise SandboxError(f"docker: {e.explanation or e}") from e
