"""Start and stop the real processes of a run: simulated workers and the routers under test.

Used by the benchmark harness, the overhead benchmark, the demo, the soak and the tests, so
that every one of them launches the peers the same way: on free ports (port 0), with their
logs in a file, in their own process group so that stopping one also stops its children.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    url: str
    log_path: Path
    urls: list[str] = field(default_factory=list)
    """For a simulated cluster: one URL per worker."""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left."""
        if self.popen.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.popen.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def kill(self) -> None:
        """SIGKILL, no grace (a crash)."""
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.popen.wait(10)


def _spawn(name: str, argv: list[str], log_dir: Path | None, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], Path]:
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="thunder-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    fh = open(log_path, "ab")  # noqa: SIM115 - owned by the child
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    p = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, env=full_env)
    fh.close()
    return p, log_path


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_until(pred, timeout: float, what: str, proc: Proc | None = None, interval: float = 0.1) -> None:  # noqa: ANN001
    """Poll ``pred`` until true. On timeout or interruption (Ctrl-C) ``proc`` is stopped: a
    process whose start was never confirmed has no owner to stop it later."""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if pred():
                return
            if proc is not None and not proc.alive():
                raise RuntimeError(f"{proc.name} exited (code {proc.popen.returncode}) before {what}:\n{proc.log_tail()}")
            time.sleep(interval)
    except BaseException:
        if proc is not None:
            proc.stop()
        raise
    tail = f":\n{proc.log_tail()}" if proc is not None else ""
    if proc is not None:
        proc.stop()
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{tail}")


def start_sim(config: str, workers: int = 1, time_scale: float = 1.0, seed: int = 0,
              extra: list[str] | None = None, log_dir: Path | None = None, timeout: float = 60.0,
              port: int = 0, name: str = "sim") -> Proc:
    """``python -m thunder_sgl.sim`` with N workers on free ports (or from ``port`` on, e.g. to
    restart a crashed worker where its router expects it); waits until all listen."""
    ready = Path(tempfile.mkdtemp(prefix="thunder-sim-")) / "ready.json"
    argv = [sys.executable, "-m", "thunder_sgl.sim", "--config", config, "--workers", str(workers),
            "--base-port", str(port), "--host", "127.0.0.1", "--time-scale", str(time_scale), "--seed", str(seed),
            "--ready-file", str(ready), *(extra or [])]
    p, log = _spawn(name, argv, log_dir)
    proc = Proc(name, p, "", log)
    wait_until(ready.exists, timeout, "the simulated workers", proc)
    time.sleep(0.05)
    proc.urls = list(json.loads(ready.read_text())["urls"])
    proc.url = proc.urls[0]
    return proc


def start_thunder(worker_urls: list[str], time_scale: float = 1.0, variant: str = "tier-aware",
                  extra: list[str] | None = None, log_dir: Path | None = None, timeout: float = 60.0,
                  port: int | None = None, wait_workers: bool = True, name: str = "thunder") -> Proc:
    port = port or free_port()
    argv = [sys.executable, "-m", "thunder_sgl.launch_router", "--policy", "thunder", "--host", "127.0.0.1",
            "--port", str(port), "--log-level", "warn", "--thunder-variant", variant,
            "--thunder-time-scale", str(time_scale), *(["--worker-urls", *worker_urls] if worker_urls else []),
            *(extra or [])]
    p, log = _spawn(name, argv, log_dir)
    proc = Proc(name, p, f"http://127.0.0.1:{port}", log)
    wait_until(lambda: http_ok(proc.url + "/health"), timeout, f"{name} /health", proc)
    if wait_workers and worker_urls:
        wait_until(lambda: _ready_workers(proc.url) >= len(worker_urls), timeout, f"{name} to register workers", proc)
    return proc


def _ready_workers(url: str) -> int:
    try:
        with urllib.request.urlopen(url + "/readiness", timeout=2) as r:
            return int(json.loads(r.read()).get("healthy_workers", 0))
    except (urllib.error.URLError, OSError, ValueError):
        return 0


def start_stock(worker_urls: list[str], policy: str = "cache_aware", flavor: str = "sglang_router",
                extra: list[str] | None = None, log_dir: Path | None = None, timeout: float = 90.0) -> Proc:
    """The stock Rust router: ``sglang_router`` 0.3.2 or its successor ``smg`` 1.13.0."""
    port, prom = free_port(), free_port()
    module = {"sglang_router": "sglang_router.launch_router", "smg": "smg.launch_router"}[flavor]
    argv = [sys.executable, "-m", module, "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
            "--worker-urls", *worker_urls, "--log-level", "warn", "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(prom)]
    if flavor == "smg":
        argv += ["--shutdown-grace-period-secs", "1", "--disable-tokenizer-autoload"]
    argv += extra or []
    name = f"{flavor}-{policy}"
    p, log = _spawn(name, argv, log_dir, env={"HF_HUB_OFFLINE": "1"})
    proc = Proc(name, p, f"http://127.0.0.1:{port}", log)
    wait_until(lambda: _ready_workers(proc.url) >= len(worker_urls), timeout, f"{name} to register workers", proc, 0.25)
    return proc
