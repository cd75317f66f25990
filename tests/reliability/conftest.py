"""Reliability tests run real processes: simulated workers and the thunder router."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from thunder_sgl.benchmark.drivers.peers import start_sim, start_thunder
from thunder_sgl.children import Proc


@pytest.fixture
def spawn(tmp_path) -> Iterator:
    procs: list[Proc] = []

    def _spawn(kind: str, *args, **kw) -> Proc:
        fn = {"sim": start_sim, "thunder": start_thunder}[kind]
        kw.setdefault("log_dir", tmp_path / "logs")
        p = fn(*args, **kw)
        procs.append(p)
        return p

    yield _spawn
    for p in reversed(procs):
        p.stop()
