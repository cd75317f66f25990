"""The locust file, run headless as a subprocess against the in-test fake OpenAI server."""

from __future__ import annotations

import asyncio
import csv
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


async def run_locust(
    url: str, tmp_path: Path, *extra: str, run_time: str = "10s"
) -> tuple[int, str, dict[str, str]]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "locust",
        "-f",
        "loadtest/locustfile.py",
        "--headless",
        "-u",
        "4",
        "-r",
        "4",
        "-t",
        run_time,
        "--host",
        url,
        "--csv",
        str(tmp_path / "run"),
        *extra,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 45)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    metrics = {}
    report = tmp_path / "run_thunder.csv"
    if report.exists():
        metrics = {row["metric"]: row["value"] for row in csv.DictReader(report.open())}
    return proc.returncode, out.decode(errors="replace"), metrics


async def test_locust_runs_agent_programs_and_reports_steps_per_min_and_hit_rate(
    fake_openai, tmp_path
):
    fake = await fake_openai()
    rc, out, m = await run_locust(
        fake.url, tmp_path, "--time-scale", "50", "--profile", "mini-swe-agent"
    )
    assert rc == 0, out[-3000:]
    assert "steps/min" in out and "KV hit rate" in out and "AGENT" in out
    assert float(m["steps_per_min"]) > 0 and float(m["kv_hit_rate"]) > 0.5
    assert int(m["steps_completed"]) > 20
    assert {c.body["model"] for c in fake.calls} == {"fake-model"}
    # Every program that sent a request was released, including those cut by the stop.
    assert fake.live == set() and set(fake.releases) == {c.body["program_id"] for c in fake.calls}
    assert {c.headers["X-SMG-Routing-Key"] for c in fake.calls} == set(fake.releases)


async def test_locust_against_a_stock_router_exits_zero(fake_openai, tmp_path):
    fake = await fake_openai(release_mode="stock")
    rc, out, m = await run_locust(
        fake.url,
        tmp_path,
        "--time-scale",
        "100",
        "--profile",
        "openhands",
        "--max-tokens-cap",
        "64",
        run_time="4s",
    )
    assert rc == 0, out[-3000:]
    assert sum(fake.releases.values()) == 1 and m["release_supported"] == "False"
    assert all(c.body["program_id"].startswith("openhands-") for c in fake.calls)
    assert fake.calls and max(c.body["max_tokens"] for c in fake.calls) <= 64


async def test_locust_with_an_unknown_profile_fails_before_sending_anything(fake_openai, tmp_path):
    fake = await fake_openai()
    rc, out, _ = await run_locust(
        fake.url, tmp_path, "--profile", "no-such-profile", run_time="30s"
    )
    assert rc == 1 and "not found" in out and "mini-swe-agent" in out and not fake.calls
