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


@pytest.fixture
def thunder_on_sim(spawn) -> Proc:
    """Two simulated workers at 10× real time and a thunder router (the default policy) in front."""
    sim = spawn("sim", "tiny", workers=2, time_scale=10.0)
    return spawn("thunder", sim.urls, time_scale=10.0)
