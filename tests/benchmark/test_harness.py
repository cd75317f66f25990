"""The HTTP-mode harness end to end: a tiny simulated worker, thunder and stock sglang_router
cache_aware, two concurrencies, a few wall seconds each; and Ctrl-C stopping every process."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from thunder_sgl.benchmark.grid import admission_of
from thunder_sgl.benchmark.harness import BenchSpec, run_bench
from thunder_sgl.benchmark.reports.progress import QuietProgress
from thunder_sgl.benchmark.reports.sweep import FAILED, load_results
from thunder_sgl.children import http_ok

ROOT = Path(__file__).resolve().parents[2]


def test_http_sweep_writes_every_file_with_plausible_numbers(tmp_path):
    spec = BenchSpec(cluster="tiny", nodes=1, programs=(3, 6), routers=("thunder", "sglang-cache_aware"),
                     duration_s=200, warmup_s=40, time_scale=40, seed=3, mode="http", name="tiny",
                     out=tmp_path)
    results = run_bench(spec, command="thunder-sgl bench --test", progress=QuietProgress())
    d = tmp_path / "tiny"
    for name in ("results.csv", "results.json", "results.md", "command.txt", "steps_per_min.png",
                 "hit_rate.png", "memory_thunder.png", "memory_sglang-cache_aware.png"):
        assert (d / name).stat().st_size > 0, name
    assert (d / "command.txt").read_text().strip() == "thunder-sgl bench --test"
    assert [(r.router, r.programs) for r in results] == [
        ("thunder", 3), ("thunder", 6), ("sglang-cache_aware", 3), ("sglang-cache_aware", 6)]
    for r in results:
        assert not r.errors.get(FAILED), r.notes
        assert r.mode == "http" and r.cluster == "tiny" and r.time_scale == 40
        assert r.steps_completed > 0 and r.steps_per_min > 0
        assert 0.0 <= r.kv_hit_rate <= 1.0
        assert r.window_s == pytest.approx(200, rel=0.1)
        assert 0 <= r.recompute_tokens <= r.prompt_tokens
        assert r.memory and all(0.0 <= x <= 1.0 for _, v in r.memory for x in v)
        assert "CPU sim" in r.notes
    thunder = [r for r in results if r.router == "thunder"]
    assert all("pauses" in r.notes for r in thunder)
    assert [r.to_dict() for r in load_results(d)] == [r.to_dict() for r in results]
    assert not (d / "logs").exists()  # logs are kept for failed runs only


def test_thunder_with_inferred_ids_serves_clients_that_send_none(tmp_path):
    """``thunder-inferred``: the driver sends no program id and releases nothing; the router
    infers the programs, so it pauses, holds and keeps hits like thunder with ids."""
    spec = BenchSpec(cluster="tiny", nodes=1, programs=(6,), routers=("thunder", "thunder-inferred"),
                     duration_s=200, warmup_s=40, time_scale=40, seed=3, mode="http", name="inferred",
                     out=tmp_path)
    explicit, inferred = run_bench(spec, progress=QuietProgress())
    for r in (explicit, inferred):
        assert not r.errors.get(FAILED), r.notes
        assert r.steps_completed > 0 and "pauses" in r.notes
    assert inferred.kv_hit_rate == pytest.approx(explicit.kv_hit_rate, abs=0.1)
    with pytest.raises(ValueError, match="agent loops"):
        BenchSpec(routers=("thunder-inferred",), mode="des", trace="t.jsonl")


def test_thunder_inferred_in_des_releases_nothing_and_its_ended_programs_go_dormant(tmp_path):
    """DES ``thunder-inferred``: the tickets carry each agent's program, marked inferred, and an
    agent's end releases nothing; ended programs go dormant (paused, waiting for a request that
    never comes) instead of holding their place, so thunder keeps up with explicit ids."""
    spec = BenchSpec(cluster="tiny", nodes=1, programs=(6,), routers=("thunder", "thunder-inferred"),
                     duration_s=300, warmup_s=60, seed=3, mode="des", name="inferred-des", out=tmp_path)
    explicit, inferred = run_bench(spec, progress=QuietProgress())
    assert "dormant=" in inferred.notes and "dormant=" not in explicit.notes
    assert inferred.steps_completed > 0
    assert inferred.steps_per_min == pytest.approx(explicit.steps_per_min, rel=0.25)


def test_router_that_fails_to_start_is_recorded_and_the_sweep_goes_on(tmp_path):
    spec = BenchSpec(cluster="tiny", programs=(2,), routers=("thunder-paper", "thunder"),
                     router_args=(("thunder-paper", "--thunder-lambda-max -1"),),
                     duration_s=60, warmup_s=0, time_scale=40, mode="http", name="broken", out=tmp_path)
    bad, good = run_bench(spec, progress=QuietProgress())
    assert bad.errors.get(FAILED) == 1 and "exited (code 2)" in bad.notes
    assert not good.errors.get(FAILED) and good.steps_completed > 0
    logs = tmp_path / "broken" / "logs" / "thunder-paper-N2"
    assert "configuration error" in (logs / "thunder-paper.log").read_text()
    assert (logs / "sim.log").exists()
    assert "| thunder-paper | failed |" in (tmp_path / "broken" / "results.md").read_text()


def _tagged(tag: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["environ"]):
        try:
            if (p.info["environ"] or {}).get("THUNDER_TEST_TAG") == tag and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


@pytest.mark.parametrize(("sig", "when"), [(signal.SIGINT, "running"), (signal.SIGTERM, "running"),
                                          (signal.SIGINT, "starting")],
                         ids=["sigint-running", "sigterm-running", "sigint-starting"])
def test_ctrl_c_stops_every_process(tmp_path, sig, when):
    """SIGINT (Ctrl-C) or SIGTERM while the run is on, or while the workers start: the bench
    and every process it started (each in a session of its own: they never see the signal)
    are gone within seconds, exit status 130."""
    tag = f"{os.getpid()}-{sig}-{when}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "THUNDER_TEST_TAG": tag}
    cmd = [sys.executable, "-m", "thunder_sgl", "bench", "--cluster", "tiny", "--programs", "2",
           "--routers", "thunder", "--duration", "4000", "--warmup", "0", "--time-scale", "20",
           "--out", str(tmp_path), "--name", "sigint"]
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        want = 2 if when == "running" else 1
        deadline = time.monotonic() + 120
        tagged: list[int] = []
        while time.monotonic() < deadline and len(tagged) < want and proc.poll() is None:
            tagged = [p.pid for p in _tagged(tag) if p.pid != proc.pid]
            time.sleep(0.05 if when == "starting" else 0.3)
        assert len(tagged) >= want, "sim and router did not start"
        if when == "running":  # the router up, the workload on
            up = time.monotonic() + 120
            while time.monotonic() < up and not _router_up(tag):
                time.sleep(0.2)
            assert _router_up(tag), "the router did not come up"
            time.sleep(1.0)
        proc.send_signal(sig)
        t0 = time.monotonic()
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - t0
        assert proc.returncode == 130, out.decode()[-2000:]
        assert took < 25, f"took {took:.0f} s to stop:\n{out.decode()[-4000:]}"  # at 30 s it exits by force
        gone = time.monotonic() + 10  # killed ones that outlived the bench are reaped by init
        while time.monotonic() < gone and (alive := _tagged(tag)):
            time.sleep(0.1)
        assert not alive, f"left running: {[p.pid for p in alive]}"
        assert (tmp_path / "sigint" / "command.txt").read_text().startswith("thunder-sgl bench --cluster tiny")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for p in _tagged(tag):  # whatever happened: nothing of this test outlives it
            with contextlib.suppress(psutil.Error):
                p.kill()


def _router_up(tag: str) -> bool:
    for p in _tagged(tag):
        with contextlib.suppress(psutil.Error, ValueError, IndexError):
            argv = p.cmdline()
            if "thunder_sgl.launch_router" in argv:
                return http_ok(f"http://127.0.0.1:{argv[argv.index('--port') + 1]}/health")
    return False


def test_des_sweep_fills_the_same_report(tmp_path):
    spec = BenchSpec(cluster="tiny", nodes=2, programs=(4, 8), routers=("thunder", "sglang-round_robin"),
                     duration_s=300, warmup_s=60, seed=2, mode="des", name="des", out=tmp_path)
    results = run_bench(spec, command="thunder-sgl bench --mode des", progress=QuietProgress())
    assert [(r.router, r.programs, r.mode) for r in results] == [
        ("thunder", 4, "des"), ("thunder", 8, "des"), ("sglang-round_robin", 4, "des"), ("sglang-round_robin", 8, "des")]
    for r in results:
        assert not r.errors.get(FAILED), r.notes
        assert r.steps_completed > 0 and 0.0 <= r.kv_hit_rate <= 1.0 and r.ideal_steps_per_min > 0
    md = (tmp_path / "des" / "results.md").read_text()
    assert "(des mode)" in md and "### N = 8 programs" in md
    assert (tmp_path / "des" / "memory_thunder.png").stat().st_size > 0


def test_des_router_arguments_build_the_thunder_routers_config(tmp_path):
    spec = BenchSpec(cluster="tiny", nodes=1, programs=(4,), routers=("thunder", "thunder-paper"), mode="des",
                     router_args=(("thunder", "--thunder-decay returns --thunder-lambda-max 0.9"),))
    cfg = spec.des_router_config("thunder")
    assert cfg is not None and cfg.scheduler.decay == "returns" and cfg.scheduler.lambda_max == 0.9
    assert spec.des_router_config("thunder-paper") is None
    for router, args, why in [("sglang-round_robin", "--thunder-decay returns", "takes no router arguments"),
                              ("thunder", "--policy cache_aware", "only --thunder-"),
                              ("thunder", "--thunder-decay sometimes", "invalid choice"),
                              ("thunder", "--thunder-variant paper", "name the router"),
                              ("thunder", "--thunder-time-scale 20", "own clock")]:
        with pytest.raises(ValueError, match=why):
            BenchSpec(cluster="tiny", routers=(router,), mode="des", router_args=((router, args),))


def test_des_router_arguments_reach_the_run(tmp_path):
    def admission(args):
        spec = BenchSpec(cluster="tiny", nodes=1, programs=(6,), routers=("thunder",), duration_s=120, warmup_s=30,
                         seed=1, mode="des", name=f"args-{len(args)}", out=tmp_path,
                         router_args=(("thunder", args),) if args else ())
        [r] = run_bench(spec, command="thunder-sgl bench --mode des", progress=QuietProgress())
        return admission_of(r.notes)

    assert admission("").startswith("L") and admission("--thunder-admission fixed") == ""  # fixed: no rule
