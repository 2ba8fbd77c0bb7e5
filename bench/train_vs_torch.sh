#!/usr/bin/env bash
# repipe beside PyTorch (../shared/bench/torch_peer.py, Debian's python3-torch),
# one thread each, batch 64, the same number of updates, in one run. Each side
# runs ROUNDS times, alternating, and the best samples/s of each is compared.
# Usage: bench/train_vs_torch.sh BUILD_DIR [ROUNDS]
set -eu
build=${1:-build}
rounds=${2:-3}
cd "$(dirname "$0")/.."
peer=../shared/bench/torch_peer.py
py=/usr/bin/python3
if [ ! -f "$peer" ] || ! "$py" -c "import torch" 2>/dev/null; then
  echo "train_vs_torch: needs $peer and python3-torch (apt-get install python3-torch)"; exit 0
fi
export OPENBLAS_NUM_THREADS=1
best() { sed -n 's/.*"samples_per_s": \([0-9.]*\).*/\1/p' | sort -g | tail -1; }
printf '%-6s %8s %14s %14s %8s\n' model steps "repipe (s/s)" "PyTorch (s/s)" ratio
for spec in "mlp 1000" "cnn 300"; do
  set -- $spec
  model=$1 steps=$2
  : > /tmp/repipe-bench-$$.r; : > /tmp/repipe-bench-$$.t
  for _ in $(seq "$rounds"); do
    "$build/bench/bench_train" "examples/fmnist-$model.model" examples/fmnist.json "$steps" >> /tmp/repipe-bench-$$.r
    "$py" "$peer" --model "$model" --threads 1 --steps "$steps" >> /tmp/repipe-bench-$$.t
  done
  r=$(best < /tmp/repipe-bench-$$.r); t=$(best < /tmp/repipe-bench-$$.t)
  printf '%-6s %8s %14s %14s %7.2fx\n' "$model" "$steps" "$r" "$t" "$(awk -v r="$r" -v t="$t" 'BEGIN { print r / t }')"
done
rm -f /tmp/repipe-bench-$$.r /tmp/repipe-bench-$$.t
