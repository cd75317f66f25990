"""Real mode of the harness: the same runs as HTTP mode, on real SGLang CPU servers.

The engines (``thunder_sgl.engine``) start once per sweep — ``--nodes`` servers with the
sweep's model and KV pool, session radix cache on, and with ``--hicache-ratio R`` SGLang's real
HiCache host tier (the CPU patches of ``engine/cpu_hicache``) for every router — and are made clean (idle, flushed, nothing
used) before every run, exactly as the simulated cluster in HTTP mode. With a file storage tier
(``--hicache-storage``) they restart before every run instead, on an empty storage directory:
``/flush_cache`` does not clear that tier, and it outlives a restart, so a run would find the
previous router's KV there. Time is real: the time scale is 1, warm-up and duration are wall
seconds. A server that died is restarted.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from thunder_sgl.engine import EngineCluster, EngineEnv, EngineOptions, start_engines
from thunder_sgl.engine.serve import HiCacheOptions


@dataclass
class RealCluster:
    nodes: int
    model: str
    max_total_tokens: int
    log_dir: Path
    seed: int = 0
    threads: int | None = None
    hicache: HiCacheOptions | None = None
    """SGLang's real HiCache on every engine (``engine serve --hicache-ratio``), for every router."""
    cluster: EngineCluster | None = None

    def ensure(self) -> EngineCluster:
        """The engines for the next run (see the module header)."""
        storage = self.hicache.storage_dir if self.hicache is not None else None
        if self.cluster is None or not self.cluster.alive() or storage is not None:
            if self.cluster is not None:
                self.cluster.stop()
                self.cluster = None
            if storage is not None:
                shutil.rmtree(storage, ignore_errors=True)
                storage.mkdir(parents=True)
            env = EngineEnv.locate()
            opts = EngineOptions(model=env.model(self.model, self.seed), max_total_tokens=self.max_total_tokens,
                                 threads=self.threads, hicache=self.hicache)
            self.cluster = start_engines(self.nodes, opts, env, self.log_dir / "engines")
        return self.cluster

    def log_files(self) -> list[Path]:
        return list((self.log_dir / "engines").glob("*.log"))

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None


def cluster_name(model: str, hicache_ratio: float | None = None) -> str:
    """Name of a real cluster in results, and of the simulator config calibrated against it
    (with HiCache: ``-hicache<R>`` appended)."""
    return f"sglang-cpu-gpt2-{model}" + (f"-hicache{hicache_ratio:g}" if hicache_ratio else "")
