"""Where thunder's SLO attainment differs from direct's at overload: the trace's answered turns by
the minute of their arrival (mean TTFT from arrival, mean send delay, turns within the 5-s SLO).
Usage (repository root): python bench/results/mooncake-trace-cpu-des-grid/by_minute.py TRACE SPEED [NODES]
(TRACE: the Mooncake FAST'25 conversation_trace.jsonl; the grid's first 3,000 requests, tokens / 16)."""
import statistics as S
import sys

from thunder_sgl.benchmark.des.trace import TraceRun

trace, speed = sys.argv[1], float(sys.argv[2])
nodes = int(sys.argv[3]) if len(sys.argv) > 3 else 1
for router in ("direct", "thunder"):
    run = TraceRun("sglang-cpu-gpt2-small-t1", nodes, router, trace, 1e9, warmup_s=0, seed=1, speed=speed,
                   limit=3000, token_scale=16)
    r = run.run()
    minutes: dict[int, list[tuple[float, float]]] = {}
    for arrival, sent, first, *_ in run.turn_sent:
        minutes.setdefault(int(arrival // 60), []).append((first - arrival, sent - arrival))
    print(f"{router}: SLO {r.trace['slo_attainment']:.3f}, TTFT p50 {r.trace['ttft_p50_s']:.2f} s; by minute of "
          "arrival (mean TTFT from arrival s / mean send delay s / turns within 5 s):")
    print("   " + "  ".join(f"{m}: {S.mean(x for x, _ in v):.1f} / {S.mean(y for _, y in v):.2f} / "
                            f"{sum(x <= 5 for x, _ in v)}" for m, v in sorted(minutes.items())))
