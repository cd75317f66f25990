#!/usr/bin/env bash
# The headline benchmark runs whose results are committed under bench/results/ (each results
# directory also holds its exact command in command.txt). Run from the repository root after
# `pip install -e ".[test]"` (smg is needed for the smg-cache_aware router). Takes ~3 h on 2 cores.
set -euo pipefail
# thunder = the default (cost-based admission, KV references); thunder-fixed = the earlier default.
ROUTERS=thunder,thunder-fixed,thunder-paper,sglang-cache_aware,sglang-round_robin,smg-cache_aware

# (a) DES mode at 8 nodes (1×, 2×, 3× capacity), without and with HiCache; 30 min warm-up.
thunder-sgl bench --mode des --cluster glm46-fp8-h100x8 --nodes 8 --programs 472,944,1416 \
  --profile mini-swe-agent --routers $ROUTERS --duration 1200 --warmup 1800 --seed 1 \
  --name glm46-fp8-8n-des
thunder-sgl bench --mode des --cluster glm46-fp8-h100x8-hicache --nodes 8 --programs 472,944,1416 \
  --profile mini-swe-agent --routers $ROUTERS --duration 1200 --warmup 1800 --seed 1 \
  --name glm46-fp8-hicache-8n-des
#     Rerun with the goodput default (bench/results/glm46-fp8-hicache-8n-des-goodput/), and the
#     previous default beside it (--routers thunder-occupancy --name glm46-fp8-hicache-8n-des-occupancy):
#       thunder-sgl bench --mode des --cluster glm46-fp8-h100x8-hicache --nodes 8 --programs 472,944,1416 \
#         --profile mini-swe-agent --routers thunder,thunder-paper,sglang-cache_aware,sglang-round_robin,smg-cache_aware \
#         --duration 1200 --warmup 1800 --seed 1 --name glm46-fp8-hicache-8n-des-goodput
# (b) toolorchestra (heavy-tailed remote tools) with Qwen3-8B on one RTX 5090, as the paper's Fig. 4.
thunder-sgl bench --mode des --cluster qwen3-8b-rtx5090 --nodes 1 --programs 24,32,48 \
  --profile toolorchestra --routers $ROUTERS --duration 1800 --warmup 900 --seed 1 \
  --name toolorchestra-rtx5090-des
# (c) HTTP cross-check with real processes (simulated workers, thunder, stock sglang_router, smg):
#     2 GLM nodes at 1× and 3× their KV capacity (≈ 140 programs of c̄ ≈ 15 K tokens per 1×).
#     Keep the machine otherwise idle: client, router and workers share its cores.
thunder-sgl bench --mode http --cluster glm46-fp8-h100x8 --nodes 2 --programs 140,420 \
  --profile mini-swe-agent --routers $ROUTERS \
  --duration 900 --warmup 600 --time-scale 8 --seed 1 --name glm46-fp8-2n-http-5routers
#     The same configuration in DES mode, to compare the two modes:
thunder-sgl bench --mode des --cluster glm46-fp8-h100x8 --nodes 2 --programs 140,420 \
  --profile mini-swe-agent --routers $ROUTERS --duration 900 --warmup 600 --seed 1 \
  --name glm46-fp8-2n-des
#     Rerun with the new default and data plane, three routers (bench/results/glm46-fp8-2n-http-new/):
#       thunder-sgl bench --mode http --cluster glm46-fp8-h100x8 --nodes 2 --programs 140,420 \
#         --profile mini-swe-agent --routers thunder,thunder-fixed,sglang-cache_aware --duration 900 \
#         --warmup 600 --time-scale 8 --seed 1 --name glm46-fp8-2n-http-new
#     (an earlier HTTP run with three routers is kept in bench/results/glm46-fp8-2n-http/:
#      --routers thunder,sglang-cache_aware,smg-cache_aware --name glm46-fp8-2n-http)
# (d) OpenHands profile (longer contexts) on the same 8 GLM nodes, 1×/2×/3× capacity (c̄ ≈ 38 K).
thunder-sgl bench --mode des --cluster glm46-fp8-h100x8 --nodes 8 --programs 220,440,660 \
  --profile openhands --routers $ROUTERS --duration 1200 --warmup 1800 --seed 1 \
  --name openhands-glm46-fp8-8n-des

# (e) Real SGLang 0.5.23 CPU engines (thunder-sgl engine prepare first). Keep the machine idle:
#     anything on the other core slows a one-thread engine by 20-40% (docs/real-engine.md; each
#     run's notes carry the timing check, and flag a slow engine). N ≈ 1×, 2×, 4× the pool.
REAL=direct,sglang-cache_aware,smg-cache_aware,thunder,thunder-fixed,thunder-paper
thunder-sgl bench --mode real --nodes 1 --programs 8,16,32 --profile cpu-agent --routers $REAL \
  --duration 120 --warmup 45 --engine-threads 1 --name real-cpu-1e
#     (2 engines: the three routers of the goal at 1× and 4×, for time; committed so)
thunder-sgl bench --mode real --nodes 2 --programs 16,64 --profile cpu-agent \
  --routers direct,sglang-cache_aware,thunder --duration 120 --warmup 45 --engine-threads 1 --name real-cpu-2e
python bench/real/timing_check.py bench/results/real-cpu-1e --out bench/results/real-cpu-1e/timing-check.md \
  --write-config sglang-cpu-gpt2-small-t1-loaded
python bench/real/timing_check.py bench/results/real-cpu-2e --out bench/results/real-cpu-2e/timing-check.md
#     The simulator calibrated against that engine (python bench/real/calibrate.py --model small
#     --threads 1 --name small-t1), and the same config scaled to the engine under load (above),
#     same sweeps in DES mode: the real-vs-simulated tables.
for cfg in sglang-cpu-gpt2-small-t1 sglang-cpu-gpt2-small-t1-loaded; do
  suf=sim; [ $cfg = sglang-cpu-gpt2-small-t1-loaded ] && suf=sim-loaded
  thunder-sgl bench --mode des --cluster $cfg --nodes 1 --programs 8,16,32 --profile cpu-agent \
    --routers $REAL --duration 120 --warmup 45 --seed 1 --name real-cpu-1e-$suf
  thunder-sgl bench --mode des --cluster $cfg --nodes 2 --programs 16,64 --profile cpu-agent \
    --routers direct,sglang-cache_aware,thunder --duration 120 --warmup 45 --seed 1 --name real-cpu-2e-$suf
  python bench/real/compare.py bench/results/real-cpu-1e bench/results/real-cpu-1e-$suf \
    --out bench/results/real-cpu-1e/real-vs-$suf.md
  python bench/real/compare.py bench/results/real-cpu-2e bench/results/real-cpu-2e-$suf \
    --out bench/results/real-cpu-2e/real-vs-$suf.md
done
