"""The trace-replay table of ``results.md`` (runs with ``RunResult.trace``, ``des.trace``).

Per configuration and router: requests answered of those offered in the window, throughput
(answered requests per minute; ``steps/min`` of the main table is the same number), KV hit rate,
TTFT p50/p99 (sent → first token), latency p50/p99 from the trace arrival (a turn that waited
for its predecessor's answer counts the wait), SLO attainment (arrivals in the window answered
with TTFT ≤ the objective), turns sent late, prompt tokens prefilled.
"""

from __future__ import annotations

from collections.abc import Sequence

from thunder_sgl.benchmark.reports.results import RunResult


def markdown(results: Sequence[RunResult]) -> list[str]:
    """The trace section (empty when no run replays a trace)."""
    runs = [r for r in results if r.trace]
    if not runs:
        return []
    lines = ["## Trace replay", ""]
    keys = sorted({(r.profile, r.cluster, r.nodes, r.trace.get("speed", 1.0)) for r in runs})
    for profile, cluster, nodes, speed in keys:
        mine = [r for r in runs if (r.profile, r.cluster, r.nodes, r.trace.get("speed", 1.0)) ==
                (profile, cluster, nodes, speed)]
        t0 = mine[0].trace
        lines += [f"### {profile} ×{speed:g} on {nodes} × {cluster}", "",
                  f"{t0.get('trace_requests', 0)} requests in {t0.get('trace_conversations', 0)} conversations "
                  f"({t0.get('trace_multi_turn', 0)} multi-turn), {t0.get('trace_requests_per_s', 0):.2f} req/s, "
                  f"{t0.get('trace_reusable_share', 0):.1%} of prompt tokens in blocks seen before "
                  f"(the hit rate of an unbounded cache); window {mine[0].window_s:.0f} s, "
                  f"TTFT objective {t0.get('ttft_slo_s', 0):g} s", "",
                  "| router | answered/offered | req/min | KV hit | prefill Mtok | TTFT p50/p99 s | "
                  "latency p50/p99 s | SLO attained | late turns |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in mine:
            t = r.trace
            if "requests_answered" not in t:  # the run failed before it measured (its note says why)
                lines.append(f"| {r.router} | failed: {r.notes or 'no measurement'} | | | | | | | |")
                continue
            lines.append(
                f"| {r.router} | {t['requests_answered']}/{t['requests_offered']} | {r.steps_per_min:.1f} "
                f"| {r.kv_hit_rate:.1%} | {(r.prompt_tokens - r.cached_tokens) / 1e6:.1f} "
                f"| {t['ttft_p50_s']:.2f} / {t['ttft_p99_s']:.2f} "
                f"| {t['latency_from_arrival_p50_s']:.1f} / {t['latency_from_arrival_p99_s']:.1f} "
                f"| {t['slo_attainment']:.1%} | {t['late_turns']} |")
        lines.append("")
    return lines
