"""The simulator's HiCache tiers against SGLang's real ones (issue 22 item 5): one short request
sequence (``bench/real/hicache_calibrate.py``'s ``short``: 4 programs round-robin, contexts
growing past device + host) on a real CPU server with HiCache write_back and the file storage
tier, then on the simulator with the same pool, ratio, policy and tier; the share of prompt
tokens each tier served must agree within 0.05. The full comparison (more sequences, both
policies, with and without storage, request by request) is the script's table in
``bench/results/real-cpu-hicache-calibration/``. The real server runs the ``tiny`` model, the
simulator its ``small`` config: the tiers see the same tokens either way (requests are token ids,
answers of a fixed length), and timing is not compared."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from thunder_sgl.engine.serve import HiCacheOptions

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "real" / "hicache_calibrate.py"
POOL, RATIO, POLICY = 2048, 2.0, "write_back"


def calibrate_module():  # noqa: ANN201
    spec = importlib.util.spec_from_file_location("hicache_calibrate", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_simulated_and_real_hicache_serve_the_same_share_from_each_tier(start_cluster, tmp_path: Path) -> None:
    hc = calibrate_module()
    seq = hc.seq_short(POOL, RATIO)
    engine = start_cluster(1, max_total_tokens=POOL, hicache=HiCacheOptions(RATIO, POLICY, tmp_path / "store"))
    try:
        real = hc.run_sequence(engine.urls[0], seq)
    finally:
        engine.stop()  # one real server at a time; the simulator's turn
    with hc.sim_server(POLICY, True, tmp_path / "logs", POOL, RATIO) as url:
        sim = hc.run_sequence(url, seq)
    a, b = hc.split(real["rows"]), hc.split(sim["rows"])
    detail = "\n".join(f"{x['label']}: real {x['device']}/{x['host']}/{x['storage']} sim {y['device']}/{y['host']}/{y['storage']}"
                       for x, y in zip(real["rows"], sim["rows"], strict=True))
    assert a["host"] > 0.1 and a["storage"] > 0 and a["device"] > 0, f"the sequence must reach every tier: {a}\n{detail}"
    for tier in ("device", "host", "storage"):
        assert abs(a[tier] - b[tier]) <= 0.05, f"{tier}: real {a[tier]:.3f}, sim {b[tier]:.3f}\n{detail}"
