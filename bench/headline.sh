#!/usr/bin/env bash
# The headline benchmark runs whose results are committed under bench/results/ (each results
# directory also holds its exact command in command.txt). Run from the repository root after
# `pip install -e ".[test]"` (smg is needed for the smg-cache_aware router). Takes ~4 h on 2 cores.
set -euo pipefail
ROUTERS=thunder,thunder-paper,sglang-cache_aware,sglang-round_robin,smg-cache_aware

# (a) HTTP mode, real processes: mini-swe-agent on 2 simulated GLM-4.6-FP8 nodes (8×H100 each),
#     programs ≈ 1×, 2×, 3× the cluster's KV capacity (≈ 140 programs of c̄ ≈ 15 K tokens).
thunder-sgl bench --mode http --cluster glm46-fp8-h100x8 --nodes 2 --programs 140,280,420 \
  --profile mini-swe-agent --routers $ROUTERS --duration 1200 --warmup 900 --time-scale 8 --seed 1 \
  --name glm46-fp8-2n-http
# (b) the same with the HiCache host tier (ratio 2) enabled on every worker, for every router.
thunder-sgl bench --mode http --cluster glm46-fp8-h100x8-hicache --nodes 2 --programs 140,280,420 \
  --profile mini-swe-agent --routers $ROUTERS --duration 1200 --warmup 900 --time-scale 8 --seed 1 \
  --name glm46-fp8-hicache-2n-http
# (c) toolorchestra (heavy-tailed remote tools) with Qwen3-8B on one RTX 5090, as the paper's Fig. 4.
thunder-sgl bench --mode http --cluster qwen3-8b-rtx5090 --nodes 1 --programs 24,32,48 \
  --profile toolorchestra --routers $ROUTERS --duration 1800 --warmup 900 --time-scale 10 --seed 1 \
  --name toolorchestra-rtx5090-http
# (d) DES mode at 8 nodes (1×, 2×, 3× capacity), without and with HiCache; longer warm-up.
thunder-sgl bench --mode des --cluster glm46-fp8-h100x8 --nodes 8 --programs 472,944,1416 \
  --profile mini-swe-agent --routers $ROUTERS --duration 1200 --warmup 1800 --seed 1 \
  --name glm46-fp8-8n-des
thunder-sgl bench --mode des --cluster glm46-fp8-h100x8-hicache --nodes 8 --programs 472,944,1416 \
  --profile mini-swe-agent --routers $ROUTERS --duration 1200 --warmup 1800 --seed 1 \
  --name glm46-fp8-hicache-8n-des
