#!/usr/bin/env bash
# The RL rollout benchmark runs whose results are committed under bench/results/rollout-*/
# (each directory holds its exact command in command.txt). DES mode; ~15 min on 2 cores.
# Paper Table 2: GLM-4.6 on 2 nodes of 8xH100, N = 144 (mini-swe-agent 1.79x, OpenHands 3.92x).
set -euo pipefail
ROUTERS=thunder,thunder-paper,sglang-cache_aware,sglang-round_robin,smg-cache_aware
SUFFIX="${SUFFIX:-}"   # SUFFIX=-v2 bench/rollout.sh writes rollout-...-v2 beside the earlier runs
ONLY="${ONLY:-abc}"     # which parts to run: ONLY=ab skips the 8-node runs
C="--mode des --cluster glm46-fp8-h100x8 --routers $ROUTERS --seed 1"

# (a) Steady (asynchronous) rollout, 2 nodes, N = 144 in flight in groups of G = 8, a weight
#     update every 10 simulated minutes (30 s, engines paused in retract mode).
[[ $ONLY == *a* ]] && thunder-sgl bench $C --nodes 2 --programs 144 --profile mini-swe-agent --rollout async --group-size 8 \
  --update-every 10 --update-seconds 30 --warmup 600 --duration 1800 --name rollout-async-mini-swe-agent-2n-des$SUFFIX
[[ $ONLY == *a* ]] && thunder-sgl bench $C --nodes 2 --programs 144 --profile openhands --rollout async --group-size 8 \
  --update-every 10 --update-seconds 30 --warmup 1800 --duration 1800 --name rollout-async-openhands-2n-des$SUFFIX
#     ... and without weight updates (the rollout alone, as the paper's table measures it)
[[ $ONLY == *a* ]] && thunder-sgl bench $C --nodes 2 --programs 144 --profile mini-swe-agent --rollout async --group-size 8 \
  --update-every 0 --warmup 600 --duration 1800 --name rollout-async-noupdate-mini-swe-agent-2n-des$SUFFIX
[[ $ONLY == *a* ]] && thunder-sgl bench $C --nodes 2 --programs 144 --profile openhands --rollout async --group-size 8 \
  --update-every 0 --warmup 1800 --duration 1800 --name rollout-async-noupdate-openhands-2n-des$SUFFIX

# (b) Synchronous (batch) rollout, 2 nodes: 3 batches of T x G = 18 x 8 = 144, each released at
#     once when the previous one has finished; weight updates every 10 minutes.
[[ $ONLY == *b* ]] && thunder-sgl bench $C --nodes 2 --profile mini-swe-agent --rollout sync --tasks 18 --group-size 8 --batches 3 \
  --update-every 10 --update-seconds 30 --duration 28800 --name rollout-sync-mini-swe-agent-2n-des$SUFFIX
[[ $ONLY == *b* ]] && thunder-sgl bench $C --nodes 2 --profile openhands --rollout sync --tasks 18 --group-size 8 --batches 3 \
  --update-every 10 --update-seconds 30 --duration 28800 --name rollout-sync-openhands-2n-des$SUFFIX

# (c) 8 nodes: N = 576 in flight (async) and batches of 72 x 8 = 576 (sync), mini-swe-agent.
[[ $ONLY == *c* ]] && thunder-sgl bench $C --nodes 8 --programs 576 --profile mini-swe-agent --rollout async --group-size 8 \
  --update-every 10 --update-seconds 30 --warmup 600 --duration 1800 --name rollout-async-mini-swe-agent-8n-des$SUFFIX
[[ $ONLY == *c* ]] && thunder-sgl bench $C --nodes 8 --profile mini-swe-agent --rollout sync --tasks 72 --group-size 8 --batches 2 \
  --update-every 10 --update-seconds 30 --duration 28800 --name rollout-sync-mini-swe-agent-8n-des$SUFFIX
true
