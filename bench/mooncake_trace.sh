#!/usr/bin/env bash
# The Mooncake FAST'25 conversation trace replayed in DES mode against thunder and the stock routers
# (bench/results/mooncake-trace-des/). The trace (12,031 requests, 3 MB) is not in this repository:
#   curl -LO https://raw.githubusercontent.com/kvcache-ai/Mooncake/3b5a594133958449a1feaf1c9e0fc1b553e34a28/FAST25-release/traces/conversation_trace.jsonl
#   bench/mooncake_trace.sh conversation_trace.jsonl
# Each sweep takes about 2 minutes (5 routers x ~25 s of DES).
set -euo pipefail
TRACE=${1:?usage: bench/mooncake_trace.sh PATH/TO/conversation_trace.jsonl}
ROUTERS=thunder,thunder-fixed,sglang-cache_aware,smg-cache_aware,direct
OUT=bench/results/mooncake-trace-des
# nodes speed: 3 x 1 has headroom, 2 x 1 is at capacity (engines ~99% busy), 2 x 1.25 is over it,
# 4 x 1.5 is 3 x 1's load per node at a higher rate
for cfg in "3 1" "2 1" "2 1.25" "4 1.5"; do
  set -- $cfg
  thunder-sgl bench --mode des --cluster glm46-fp8-h100x8 --nodes "$1" --trace "$TRACE" --trace-speed "$2" \
    --routers "$ROUTERS" --seed 1 --out "$OUT" --name "glm46-fp8-${1}n-x$2"
done
