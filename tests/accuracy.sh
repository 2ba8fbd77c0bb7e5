#!/usr/bin/env bash
# Trains both example models with the reference recipe (SGD lr 0.05, batch 64,
# 2 epochs) on Fashion-MNIST and checks the test accuracy: MLP >= 0.83,
# CNN >= 0.85 (PyTorch with the same recipe: 0.838 and 0.860).
# Usage: accuracy.sh REPIPE SOURCE_DIR
set -u
bin=$1
src=$2
data=/usr/share/datasets/fashion-mnist
if [ ! -f "$data/train-images-idx3-ubyte.gz" ]; then
  echo "SKIP: no Fashion-MNIST at $data (Debian package dataset-fashion-mnist)"
  exit 77
fi
fail=0
check() {
  local model=$1 min=$2
  local out acc
  out=$("$bin" train --model "$src/examples/$model.model" --config "$src/examples/fmnist.json" \
        --epochs 2 --log-every 100000 2>&1)
  acc=$(sed -n 's/^test accuracy: //p' <<<"$out")
  echo "$model: test accuracy $acc (needs >= $min)"
  if [ -z "$acc" ] || ! awk -v a="$acc" -v m="$min" 'BEGIN { exit !(a >= m) }'; then
    echo "$out" >&2
    fail=1
  fi
}
check fmnist-mlp 0.83
check fmnist-cnn 0.85
exit $fail
