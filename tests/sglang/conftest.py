"""Tests against real SGLang 0.5.23 servers on the CPU (marker ``sglang``).

They need the SGLang venv and the ``tiny`` model (``thunder-sgl engine prepare --model tiny``).
Without them they skip, unless ``THUNDER_REQUIRE_SGLANG=1`` (set by ``.ci/run``): then they
fail, so CI cannot go green by silently skipping them. Each module starts its own servers on
free ports (``engines`` below) and stops them at the end; each test starts its own router.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from thunder_sgl.benchmark.drivers.peers import start_stock, start_thunder
from thunder_sgl.children import Proc
from thunder_sgl.engine import EngineCluster, EngineEnv, EngineOptions, start_engines

HERE = Path(__file__).resolve().parent
MODEL = "tiny"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.sglang)


def _unavailable(why: str) -> None:
    if os.environ.get("THUNDER_REQUIRE_SGLANG") == "1":
        pytest.fail(f"THUNDER_REQUIRE_SGLANG=1 but {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session")
def engine_env() -> EngineEnv:
    """The one place that decides between run, skip and fail for every real-engine test."""
    env = EngineEnv.locate()
    why = env.check()
    if why is not None:
        _unavailable(f"{why} (run: thunder-sgl engine prepare --model {MODEL})")
    try:
        env.model(MODEL)
    except Exception as e:  # noqa: BLE001
        _unavailable(str(e))
    return env


@pytest.fixture(scope="module")
def start_cluster(engine_env: EngineEnv, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., EngineCluster]]:
    """Start real servers (stopped when the module ends)."""
    clusters: list[EngineCluster] = []

    def _start(n: int = 1, max_total_tokens: int = 16384, **kw: object) -> EngineCluster:
        opts = EngineOptions(model=engine_env.model(MODEL), max_total_tokens=max_total_tokens, **kw)  # type: ignore[arg-type]
        c = start_engines(n, opts, engine_env, tmp_path_factory.mktemp("engines"))
        clusters.append(c)
        return c

    yield _start
    for c in clusters:
        c.stop()


@pytest.fixture
def routers(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    """Start routers in front of engines; all stopped at the end of the test."""
    procs: list[Proc] = []

    def _start(kind: str, urls: list[str], **kw: object) -> Proc:
        if kind == "thunder":
            p = start_thunder(urls, log_dir=tmp_path / "logs", **kw)  # type: ignore[arg-type]
        else:
            flavor, policy = kind.split("-", 1)
            p = start_stock(urls, policy, flavor, log_dir=tmp_path / "logs")
        procs.append(p)
        return p

    yield _start
    for p in reversed(procs):
        p.stop()


def loads(url: str) -> dict:
    return httpx.get(url + "/v1/loads", timeout=10).json()["loads"][0]


def idle(urls: list[str]) -> bool:
    return all(loads(u)["num_running_reqs"] == 0 and loads(u)["num_waiting_reqs"] == 0 for u in urls)
