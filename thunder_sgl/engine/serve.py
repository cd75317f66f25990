"""Start real SGLang CPU servers on free ports with the flags that matter, and stop them.

    thunder-sgl engine serve --workers 2 --max-total-tokens 24576 [--ready-file F]

Each server is ``python -m sglang.launch_server`` from the SGLang venv (``env.EngineEnv``), in
its own process group, its log in a file. Flags (docs/real-engine.md says why each one):

- ``--device cpu --attention-backend torch_native --disable-cuda-graph``: the CPU path that works;
- ``--sleep-on-idle``: without it an idle scheduler spins a core at 100% for as long as it lives;
- ``--enable-metrics --enable-cache-report``: Prometheus ``/metrics`` and ``cached_tokens`` in
  OpenAI usage, which the router reads;
- ``--enable-session-radix-cache`` (default on): requests with a ``session_id`` reference their
  KV, eviction takes unreferenced KV first; thunder uses it to keep the programs it runs.

With ``HiCacheOptions`` (``engine serve --hicache-ratio R``) each server runs SGLang's real HiCache:
a host tier of ``R`` × the device pool (``--hicache-io-backend direct --hicache-mem-layout
layer_first``, the only transfer path that runs on a CPU), optionally a file storage tier. Two
CUDA-only spots are patched at import time by ``cpu_hicache/`` (put on the server's
``PYTHONPATH`` with ``THUNDER_SGL_CPU_HICACHE=1``; never written into the venv, never active
with a GPU). Each patched server says so in its log, and a server that comes up without both
patch lines is stopped with an error (``HiCachePatchError``).

A server is ready when ``GET /health`` answers 200 (SGLang runs its warm-up generation first).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from thunder_sgl.children import Proc, free_port, http_ok, spawn, wait_until
from thunder_sgl.engine.env import EngineEnv

DEFAULT_MAX_TOTAL_TOKENS = 24576
CPU_HICACHE_DIR = Path(__file__).with_name("cpu_hicache")
"""Put on a HiCache server's PYTHONPATH: ``sitecustomize.py`` + ``thunder_cpu_hicache.py``."""
CPU_HICACHE_SWITCH = "THUNDER_SGL_CPU_HICACHE"
PATCH_LINE = "thunder_sgl.cpu_hicache: patched "
PATCHED_MODULES = ("sglang.srt.mem_cache.pool_host.base", "sglang.srt.mem_cache.pool_host.mha")
WRITE_POLICIES = ("write_through", "write_back", "write_through_selective")
START_TIMEOUT_S = 240.0
"""A server starts in ~20 s on an idle 2-core machine (16 s of it tokenizer start-up); several
starting at once, beside other work, take longer."""
PORT_TRIES = 3
"""How many ports a server is tried on when the one picked was taken before it bound it."""


class PortTaken(RuntimeError):
    """The server could not bind the port picked for it."""


def port_taken(p: Proc) -> bool:
    """Whether ``p``'s log says its HTTP port was already in use (errno 98, EADDRINUSE)."""
    return "address already in use" in p.log_tail(20).lower()


class HiCachePatchError(RuntimeError):
    """A HiCache server came up without the CPU patches applied (or they failed)."""


@dataclass(frozen=True)
class HiCacheOptions:
    """SGLang's HiCache on each server (host tier, optional file storage tier)."""

    ratio: float = 2.0
    """``--hicache-ratio``: host tier = ratio × the device pool (SGLang needs > 1)."""
    write_policy: str = "write_through"
    storage_dir: Path | None = None
    """A directory for the file storage tier (``--hicache-storage-backend file``); None: no
    storage tier. Each server gets its own subdirectory ``worker-<i>``."""

    def __post_init__(self) -> None:
        if not self.ratio > 1.0:
            raise ValueError(f"hicache ratio must be > 1 (host pool larger than the device pool), not {self.ratio}")
        if self.write_policy not in WRITE_POLICIES:
            raise ValueError(f"hicache write policy must be one of {', '.join(WRITE_POLICIES)}, not {self.write_policy!r}")

    def argv(self, worker: int) -> list[str]:
        out = ["--enable-hierarchical-cache", "--hicache-io-backend", "direct", "--hicache-mem-layout", "layer_first",
               "--hicache-ratio", f"{self.ratio:g}", "--hicache-write-policy", self.write_policy]
        if self.storage_dir is not None:
            out += ["--hicache-storage-backend", "file", "--file-storage-path", str(self.storage_dir / f"worker-{worker}")]
        return out


@dataclass(frozen=True)
class EngineOptions:
    """How each server is launched (the same for every worker of a cluster)."""

    model: Path
    max_total_tokens: int = DEFAULT_MAX_TOTAL_TOKENS
    session_radix_cache: bool = True
    dtype: str | None = None
    """``--dtype`` (e.g. bfloat16); None: the model's."""
    threads: int | None = None
    """CPU threads of each server's torch (OMP_NUM_THREADS); None: torch's default (all cores)."""
    extra: tuple[str, ...] = ()
    """More ``sglang.launch_server`` arguments, as given."""
    hicache: HiCacheOptions | None = None
    """SGLang's real HiCache tiers with the CPU patches; None: off."""


def engine_argv(env: EngineEnv, opts: EngineOptions, port: int, host: str = "127.0.0.1", worker: int = 0) -> list[str]:
    argv = [str(env.python), "-m", "sglang.launch_server", "--model-path", str(opts.model),
            "--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph",
            "--max-total-tokens", str(opts.max_total_tokens), "--host", host, "--port", str(port),
            "--enable-metrics", "--enable-cache-report", "--sleep-on-idle", "--log-level", "warning"]
    if opts.session_radix_cache:
        argv.append("--enable-session-radix-cache")
    if opts.dtype:
        argv += ["--dtype", opts.dtype]
    if opts.hicache is not None:
        argv += opts.hicache.argv(worker)
    return argv + list(opts.extra)


def engine_env_vars(opts: EngineOptions) -> dict[str, str]:
    """The environment a server adds to the router's: offline, and with HiCache the patches."""
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if opts.threads:
        env["OMP_NUM_THREADS"] = str(opts.threads)
    if opts.hicache is not None:
        rest = os.environ.get("PYTHONPATH")
        env["PYTHONPATH"] = str(CPU_HICACHE_DIR) + (os.pathsep + rest if rest else "")
        env[CPU_HICACHE_SWITCH] = "1"
    return env


def patches_applied(log_text: str) -> list[str]:
    """The modules a server's log says were patched (``thunder_cpu_hicache`` prints a line each)."""
    return [m for m in PATCHED_MODULES if f"{PATCH_LINE}{m}:" in log_text]


def check_patched(proc: Proc) -> None:
    """Raise ``HiCachePatchError`` unless the server's log shows both patches applied."""
    try:
        text = proc.log_path.read_text(errors="replace")
    except OSError as e:
        raise HiCachePatchError(f"{proc.name}: cannot read its log {proc.log_path}: {e}") from e
    done = patches_applied(text)
    if len(done) != len(PATCHED_MODULES):
        missing = [m for m in PATCHED_MODULES if m not in done]
        raise HiCachePatchError(f"{proc.name} started with HiCache but without the CPU patch of "
                                f"{', '.join(missing)} (log {proc.log_path}); run: thunder-sgl engine status")


@dataclass
class EngineCluster:
    """N real SGLang servers started together; each can be killed and restarted on its port."""

    env: EngineEnv
    opts: EngineOptions
    log_dir: Path
    host: str = "127.0.0.1"
    procs: list[Proc] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)

    @property
    def urls(self) -> list[str]:
        return [f"http://{self.host}:{p}" for p in self.ports]

    def _argv(self, i: int) -> list[str]:
        return engine_argv(self.env, self.opts, self.ports[i], self.host, worker=i)

    def _launch(self, i: int) -> Proc:
        name = f"sglang-{i}"
        log = self.log_dir / f"{name}.log"
        start = log.stat().st_size if log.exists() else 0  # a server started again appends
        p, log = spawn(name, self._argv(i), self.log_dir, env=engine_env_vars(self.opts))
        return Proc(name, p, self.urls[i], log, log_from=start)

    def _ready(self, p: Proc, timeout: float) -> None:
        def up() -> bool:
            # The log first: what answers on a taken port is not this server.
            if port_taken(p):
                raise PortTaken(f"{p.name}: {p.url} was taken before the server bound it")
            return http_ok(p.url + "/health", timeout=10)

        wait_until(up, timeout, f"{p.name} /health", p, 0.5)
        if self.opts.hicache is not None:
            check_patched(p)

    def start(self, n: int, timeout: float = START_TIMEOUT_S) -> EngineCluster:
        """A port is free when it is picked and may be taken before the server binds it: by
        another process, or by an earlier server of this cluster, whose scheduler picks its own
        ports near its HTTP port. SGLang's HTTP server then logs ``address already in use`` and
        stays up without serving; such a server is stopped and started again on a new port, up
        to ``PORT_TRIES`` times."""
        self.ports = [free_port(self.host) for _ in range(n)]
        self.procs = [self._launch(i) for i in range(n)]
        try:
            for i in range(n):
                for attempt in range(PORT_TRIES):
                    try:
                        self._ready(self.procs[i], timeout)
                        break
                    except PortTaken:
                        if attempt == PORT_TRIES - 1:
                            raise
                        self.ports[i] = free_port(self.host)
                        self.procs[i] = self._launch(i)
        except BaseException:
            self.stop()
            raise
        return self

    def kill(self, i: int) -> None:
        """SIGKILL server ``i`` (a crash)."""
        self.procs[i].kill()

    def restart(self, i: int, timeout: float = START_TIMEOUT_S) -> None:
        self.procs[i].stop()
        self.procs[i] = self._launch(i)
        self._ready(self.procs[i], timeout)

    def alive(self) -> bool:
        return all(p.alive() for p in self.procs)

    def pids(self) -> list[int]:
        return [p.popen.pid for p in self.procs]

    def stop(self) -> None:
        for p in self.procs:
            p.stop(timeout=15)

    def __enter__(self) -> EngineCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_engines(n: int, opts: EngineOptions, env: EngineEnv | None = None, log_dir: Path | None = None,
                  host: str = "127.0.0.1", timeout: float = START_TIMEOUT_S) -> EngineCluster:
    """Start ``n`` servers on free ports and wait until each answers ``/health``."""
    env = env or EngineEnv.locate()
    env.require()
    log = Path(log_dir) if log_dir else Path(os.environ.get("TMPDIR", "/tmp")) / f"thunder-engines-{os.getpid()}-{time.time_ns()}"
    return EngineCluster(env, opts, log, host).start(n, timeout)


def write_ready_file(path: Path, urls: list[str], extra: dict[str, object]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps({"urls": urls, **extra}))
    os.replace(tmp, path)
