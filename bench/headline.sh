#!/usr/bin/env bash
# The headline benchmark runs whose results are committed under bench/results/ (each results
# directory also holds its exact command in command.txt). Run from the repository root after
# `pip install -e ".[test]"` (smg is needed for the smg-cache_aware router). Takes ~3 h on 2 cores.
set -euo pipefail
ROUTERS=thunder,thunder-paper,sglang-cache_aware,sglang-round_robin,smg-cache_aware

# (a) DES mode at 8 nodes (1×, 2×, 3× capacity), without and with HiCache; 30 min warm-up.
thunder-sgl bench --mode des --cluster glm46-fp8-h100x8 --nodes 8 --programs 472,944,1416 \
  --profile mini-swe-agent --routers $ROUTERS --duration 1200 --warmup 1800 --seed 1 \
  --name glm46-fp8-8n-des
thunder-sgl bench --mode des --cluster glm46-fp8-h100x8-hicache --nodes 8 --programs 472,944,1416 \
  --profile mini-swe-agent --routers $ROUTERS --duration 1200 --warmup 1800 --seed 1 \
  --name glm46-fp8-hicache-8n-des
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
#     (an earlier HTTP run with three routers is kept in bench/results/glm46-fp8-2n-http/:
#      --routers thunder,sglang-cache_aware,smg-cache_aware --name glm46-fp8-2n-http)
# (d) OpenHands profile (longer contexts) on the same 8 GLM nodes, 1×/2×/3× capacity (c̄ ≈ 38 K).
thunder-sgl bench --mode des --cluster glm46-fp8-h100x8 --nodes 8 --programs 220,440,660 \
  --profile openhands --routers $ROUTERS --duration 1200 --warmup 1800 --seed 1 \
  --name openhands-glm46-fp8-8n-des
