"""Real processes for integration tests: simulated workers and routers on free ports."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from thunder_sgl.benchmark.drivers.peers import start_sim, start_thunder
from thunder_sgl.children import Proc


@pytest.fixture
def log_dir(tmp_path):
    d = tmp_path / "logs"
    d.mkdir()
    return d


@pytest.fixture
def spawn(log_dir) -> Iterator:
    """Start processes through this; all are stopped at teardown, whatever happens."""
    procs: list[Proc] = []

    def _spawn(kind: str, *args, **kw) -> Proc:
        fn = {"sim": start_sim, "thunder": start_thunder}[kind] if isinstance(kind, str) else kind
        p = fn(*args, log_dir=log_dir, **kw)
        procs.append(p)
        return p

    yield _spawn
    for p in reversed(procs):
        p.stop()
