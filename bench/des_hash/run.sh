#!/usr/bin/env bash
# DES bit-exactness check for the house refactor: same commands before/after, compare hashes.
# usage: run.sh OUTDIR   (from the repository root, the package installed; OUTDIR is replaced)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT=$1; rm -rf "$OUT"; mkdir -p "$OUT"
thunder-sgl bench --mode des --cluster glm46-fp8-h100x8 --nodes 2 --programs 140 --profile mini-swe-agent --routers thunder,thunder-occupancy,thunder-fixed,thunder-paper,sglang-cache_aware,smg-cache_aware,direct --duration 300 --warmup 120 --seed 1 --out "$OUT" --name a >/dev/null
thunder-sgl bench --mode des --cluster sglang-cpu-gpt2-small-t1 --grid ctx20-tool2-out16-x6,ctx05-tool0.5-out16-x2 --repeats 1 --routers thunder,thunder-fixed,direct,sglang-cache_aware --duration 120 --warmup 30 --out "$OUT" --name b >/dev/null
thunder-sgl bench --mode des --cluster glm46-fp8-h100x8-hicache --nodes 2 --programs 200 --profile openhands --routers thunder,thunder-paper --duration 300 --warmup 120 --seed 2 --out "$OUT" --name c >/dev/null
thunder-sgl bench --mode des --cluster glm46-fp8-h100x8 --nodes 2 --rollout async --profile mini-swe-agent --routers thunder,sglang-cache_aware --out "$OUT" --name d >/dev/null
cd "$OUT" && find . -name results.json | sort | xargs python3 "$HERE/norm.py"
