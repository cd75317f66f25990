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
START_TIMEOUT_S = 240.0
"""A server starts in ~20 s on an idle 2-core machine (16 s of it tokenizer start-up); several
starting at once, beside other work, take longer."""


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


def engine_argv(env: EngineEnv, opts: EngineOptions, port: int, host: str = "127.0.0.1") -> list[str]:
    argv = [str(env.python), "-m", "sglang.launch_server", "--model-path", str(opts.model),
            "--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph",
            "--max-total-tokens", str(opts.max_total_tokens), "--host", host, "--port", str(port),
            "--enable-metrics", "--enable-cache-report", "--sleep-on-idle", "--log-level", "warning"]
    if opts.session_radix_cache:
        argv.append("--enable-session-radix-cache")
    if opts.dtype:
        argv += ["--dtype", opts.dtype]
    return argv + list(opts.extra)


def _engine_env(opts: EngineOptions) -> dict[str, str]:
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if opts.threads:
        env["OMP_NUM_THREADS"] = str(opts.threads)
    return env


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

    def _launch(self, i: int) -> Proc:
        argv = engine_argv(self.env, self.opts, self.ports[i], self.host)
        p, log = spawn(f"sglang-{i}", argv, self.log_dir, env=_engine_env(self.opts))
        return Proc(f"sglang-{i}", p, self.urls[i], log)

    def start(self, n: int, timeout: float = START_TIMEOUT_S) -> EngineCluster:
        self.ports = [free_port(self.host) for _ in range(n)]
        self.procs = [self._launch(i) for i in range(n)]
        try:
            for p in self.procs:
                wait_until(lambda p=p: http_ok(p.url + "/health", timeout=10), timeout, f"{p.name} /health", p, 0.5)
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
        wait_until(lambda: http_ok(self.procs[i].url + "/health", timeout=10), timeout,
                   f"{self.procs[i].name} /health", self.procs[i], 0.5)

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
