"""The real-mode cluster of the benchmark (``benchmark.drivers.real_mode``): engines reused from
run to run, except with a file storage tier, which ``/flush_cache`` does not clear: then every
run gets fresh engines on an empty storage directory. The engines are stand-ins here (the real
ones are exercised by ``tests/sglang``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from thunder_sgl.benchmark.drivers import real_mode
from thunder_sgl.benchmark.harness import BenchSpec
from thunder_sgl.engine.serve import HiCacheOptions


@dataclass
class FakeEngines:
    opts: object
    stopped: bool = False
    urls: list[str] = field(default_factory=lambda: ["http://127.0.0.1:1"])

    def alive(self) -> bool:
        return not self.stopped

    def stop(self) -> None:
        self.stopped = True


class FakeEnv:
    def model(self, size: str, seed: int) -> Path:
        return Path("/nonexistent/model")


@pytest.fixture
def started(monkeypatch):
    out: list[FakeEngines] = []

    def start(nodes, opts, env, log_dir):
        out.append(FakeEngines(opts))
        return out[-1]

    monkeypatch.setattr(real_mode, "start_engines", start)
    monkeypatch.setattr(real_mode.EngineEnv, "locate", classmethod(lambda cls: FakeEnv()))
    return out


def test_engines_without_storage_are_reused_until_one_dies(tmp_path, started):
    c = real_mode.RealCluster(1, "small", 4096, tmp_path, hicache=HiCacheOptions(2.0))
    first = c.ensure()
    assert c.ensure() is first and len(started) == 1
    first.stopped = True  # died
    assert c.ensure() is not first and len(started) == 2


def test_with_a_storage_tier_every_run_gets_fresh_engines_on_an_empty_directory(tmp_path, started):
    storage = tmp_path / "storage"
    c = real_mode.RealCluster(1, "small", 4096, tmp_path, hicache=HiCacheOptions(2.0, storage_dir=storage))
    first = c.ensure()
    assert first.opts.hicache.storage_dir == storage and storage.is_dir()
    (storage / "worker-0").mkdir()
    (storage / "worker-0" / "kv-page").write_bytes(b"the previous router's KV")
    second = c.ensure()
    assert first.stopped and not second.stopped and len(started) == 2
    assert storage.is_dir() and not any(storage.iterdir())


def test_the_storage_tier_needs_the_host_tier():
    with pytest.raises(ValueError, match="--hicache-storage needs --hicache-ratio"):
        BenchSpec(mode="real", time_scale=1.0, hicache_storage=True)
    assert BenchSpec(mode="real", time_scale=1.0, hicache_ratio=2.0, hicache_storage=True).hicache_storage
