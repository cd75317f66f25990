#!/bin/bash
# The Mooncake conversation trace past the engines' capacity: a grid of overloads (DES), two seeds.
# usage: bash run.sh TRACE   (conversation_trace.jsonl, kvcache-ai/Mooncake 3b5a594 FAST25-release/traces/)
set -e
trace=${1:?conversation_trace.jsonl}
cd "$(dirname "$0")"
cells="1:5 1:6 1:7 1:8 1:10 1:12 2:10 2:12 2:14 2:16 2:20"
for seed in 1 2; do
  for c in $cells; do
    n=${c%%:*}; s=${c##*:}
    echo "thunder-sgl bench --mode des --cluster sglang-cpu-gpt2-small-t1 --nodes $n --trace $trace --trace-limit 3000 --trace-token-scale 16 --trace-speed $s --seed $seed --routers direct,sglang-cache_aware,smg-cache_aware,thunder --out . --name n$n-s$s-seed$seed"
  done
done | xargs -P 2 -I{} bash -c "{} > /dev/null 2>&1"
rm -f */*.png  # the plots: thunder-sgl bench --report-only DIR rebuilds them
python summarize.py . > table.md
