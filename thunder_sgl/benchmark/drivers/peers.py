"""Start the peers of a benchmark run on free ports: simulated workers and the routers under
test (thunder, stock ``sglang_router``, ``smg``), each a child process of ``thunder_sgl.children``
(own process group, log in a file, stopped on a signal or at exit).

Used by the benchmark harness, the overhead benchmark, the demo, the soak, the examples and the
tests, so that every one of them launches the peers the same way.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from thunder_sgl.children import Proc, free_port, http_ok, spawn, wait_until


def start_sim(config: str, workers: int = 1, time_scale: float = 1.0, seed: int = 0,
              extra: list[str] | None = None, log_dir: Path | None = None, timeout: float = 60.0,
              port: int = 0, name: str = "sim") -> Proc:
    """``python -m thunder_sgl.sim`` with N workers on free ports (or from ``port`` on, e.g. to
    restart a crashed worker where its router expects it); waits until all listen."""
    ready = Path(tempfile.mkdtemp(prefix="thunder-sim-")) / "ready.json"
    argv = [sys.executable, "-m", "thunder_sgl.sim", "--config", config, "--workers", str(workers),
            "--base-port", str(port), "--host", "127.0.0.1", "--time-scale", str(time_scale), "--seed", str(seed),
            "--ready-file", str(ready), *(extra or [])]
    p, log = spawn(name, argv, log_dir)
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
    p, log = spawn(name, argv, log_dir)
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
    p, log = spawn(name, argv, log_dir, env={"HF_HUB_OFFLINE": "1"})
    proc = Proc(name, p, f"http://127.0.0.1:{port}", log)
    wait_until(lambda: _ready_workers(proc.url) >= len(worker_urls), timeout, f"{name} to register workers", proc, 0.25)
    return proc
