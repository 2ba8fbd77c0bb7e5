#!/usr/bin/env bash
# Trains both example models with the reference recipe (SGD lr 0.05, batch 64,
# 2 epochs) on Fashion-MNIST and checks the test accuracy: MLP >= 0.83,
# CNN >= 0.85 (PyTorch with the same recipe: 0.838 and 0.860).
# Then the MLP on two stages exchanging fp16, starting from a loss scale of
# 2^40 that overflows fp16: loss scaling skips updates until the scale fits
# and must reach the same band.
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
  local model=$1 min=$2 config=${3:-$src/examples/fmnist.json}
  local acc
  out=$("$bin" train --model "$src/examples/$model.model" --config "$config" \
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
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed 's/"auto_loss_scaling": true,/"auto_loss_scaling": true, "loss_scaling": 1099511627776,/' \
  "$src/examples/fmnist-fp16.json" >"$tmp/overflow.json"
grep -q '"loss_scaling"' "$tmp/overflow.json" || { echo "overflow config not made" >&2; exit 1; }
check fmnist-mlp 0.83 "$tmp/overflow.json"
skipped=$(sed -n 's/^loss scaling: \([0-9]*\) update.*/\1/p' <<<"$out")
echo "fp16 overflow run: $skipped updates skipped"
if [ -z "$skipped" ] || [ "$skipped" -eq 0 ]; then
  echo "expected skipped updates from the fp16 overflow" >&2
  fail=1
fi
exit $fail
