#!/usr/bin/env bash
# The whole workflow on both example models: profile each on this machine,
# plan it for one level of 4 machines, predict the plan's time per update,
# train one epoch with it, and show the measured time beside the prediction.
# Usage: examples/workflow.sh [BUILD_DIR]
set -euo pipefail
bin=${1:-build}/repipe
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for model in mlp cnn; do
  echo "== $model"
  "$bin" profile --model "examples/fmnist-$model.model" --micro-batch 64 --out "$out/$model.txt"
  "$bin" plan --profile "$out/$model.txt" --machines 4 --bandwidth 1e10 --json "$out/$model-plan.json" \
    | sed -n '/^level 1/,/^$/p;/^workers/,/^$/p'
  "$bin" simulate --plan "$out/$model-plan.json" --config examples/fmnist.json --cores "$(nproc)" \
    --profile "$out/$model.txt" --model "examples/fmnist-$model.model"
  "$bin" train --model "examples/fmnist-$model.model" --config examples/fmnist.json \
    --plan "$out/$model-plan.json" --epochs 1 --log-every 100000 | grep -E "workers|accuracy|took"
  echo
done
