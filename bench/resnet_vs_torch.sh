#!/usr/bin/env bash
# torchvision's resnet18 for Fashion-MNIST, exported to repipe (repipe.torch.export), beside
# PyTorch training the same module: one thread each, batch 64, SGD, the same number of
# updates, in one run. Each side runs ROUNDS times, alternating; the best samples/s of each
# is compared. PyTorch and torchvision: PyPI's, the project's environment (scripts/python-env).
# Usage: bench/resnet_vs_torch.sh BUILD_DIR [ROUNDS] [STEPS]
set -eu
build=$(cd "${1:-build}" && pwd)
rounds=${2:-3}
steps=${3:-30}
cd "$(dirname "$0")/.."
py=$(sh scripts/python-env)
export OPENBLAS_NUM_THREADS=1 PYTHONPATH="$PWD/python" REPIPE_LIBRARY="$build/librepipe.so"
[ -e "$REPIPE_LIBRARY" ] || { echo "resnet_vs_torch.sh: $REPIPE_LIBRARY is missing: build $build first (make build)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" bench/torch_resnet18.py --export "$tmp/resnet18.model"
printf '{"micro_batch_size": 64, "optimizer": {"type": "sgd", "lr": 0.05}}\n' > "$tmp/one.json"
best() { sed -n 's/.*"samples_per_s": \([0-9.]*\).*/\1/p' | sort -g | tail -1; }
for _ in $(seq "$rounds"); do
  "$build/bench/bench_train" "$tmp/resnet18.model" "$tmp/one.json" "$steps" >> "$tmp/r"
  "$py" bench/torch_resnet18.py --steps "$steps" --threads 1 >> "$tmp/t"
done
r=$(best < "$tmp/r"); t=$(best < "$tmp/t")
printf '%-9s %6s %14s %14s %8s\n' model steps "repipe (s/s)" "PyTorch (s/s)" ratio
printf '%-9s %6s %14s %14s %7.2fx\n' resnet18 "$steps" "$r" "$t" "$(awk -v r="$r" -v t="$t" 'BEGIN { print r / t }')"
