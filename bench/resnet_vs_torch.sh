#!/usr/bin/env bash
# torchvision's resnet18 for Fashion-MNIST, exported to repipe (repipe.torch.export), beside
# PyTorch training the same module: one thread each, batch 64, SGD, the same number of
# updates, in one run. Each side runs ROUNDS times, alternating; the median samples/s of each
# is compared. PyTorch and torchvision: PyPI's, the project's environment (scripts/python-env),
# named by version and build on the last line. Beside them, the model's bound: its
# convolutions' kernels alone (bench_conv_bound: oneDNN's kernels, or im2col's products, for
# each layer as the engine chooses it), as samples/s at most.
# ARCH=resnet50 times torchvision's resnet50 on random 3 x 64 x 64 images instead (batch
# BATCH, 32 by default; 5 warm-up updates).
# Usage: [ARCH=resnet50] bench/resnet_vs_torch.sh BUILD_DIR [ROUNDS] [STEPS]
set -eu
build=$(cd "${1:-build}" && pwd)
rounds=${2:-3}
steps=${3:-30}
arch=${ARCH:-resnet18}
cd "$(dirname "$0")/.."
py=$(sh scripts/python-env)
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 PYTHONPATH="$PWD/python" \
  REPIPE_LIBRARY="$build/librepipe.so"
[ -e "$REPIPE_LIBRARY" ] || { echo "resnet_vs_torch.sh: $REPIPE_LIBRARY is missing: build $build first (make build)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ "$arch" = resnet50 ]; then
  batch=${BATCH:-32}
  model_args=(--arch resnet50 --size 64 --warmup 5)
  data_args=(--synthetic 10 --warmup 5)
else
  batch=${BATCH:-64}
  model_args=()
  data_args=()
fi
"$py" bench/torch_resnet18.py "${model_args[@]}" --export "$tmp/model"
printf '{"micro_batch_size": %d, "optimizer": {"type": "sgd", "lr": 0.05}}\n' "$batch" \
  > "$tmp/one.json"
rates() { sed -n 's/.*"samples_per_s": \([0-9.]*\).*/\1/p'; }
median() { sort -g | awk '{ v[NR] = $1 } END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
for _ in $(seq "$rounds"); do
  "$build/bench/bench_train" "$tmp/model" "$tmp/one.json" "$steps" "${data_args[@]}" >> "$tmp/r"
  "$py" bench/torch_resnet18.py "${model_args[@]}" --batch "$batch" --steps "$steps" \
    --threads 1 >> "$tmp/t"
done
r=$(rates < "$tmp/r" | median); t=$(rates < "$tmp/t" | median)
printf '%-9s %6s %14s %14s %8s   (median of %d alternating rounds)\n' model steps \
  "repipe (s/s)" "PyTorch (s/s)" ratio "$rounds"
printf '%-9s %6s %14s %14s %7.2fx\n' "$arch" "$steps" "$r" "$t" \
  "$(awk -v r="$r" -v t="$t" 'BEGIN { print r / t }')"
echo "rounds: repipe $(rates < "$tmp/r" | tr '\n' ' ')| PyTorch $(rates < "$tmp/t" | tr '\n' ' ')"
bound=$("$build/bench/bench_conv_bound" "$tmp/model" "$batch" 3 | awk '$1 == "all" { print $(NF - 4) }')
awk -v b="$bound" -v B="$batch" -v r="$r" 'BEGIN { printf "bound: the convolutions alone %.1f ms a step, %.1f samples/s at most; repipe at %.2f of it\n", b, B * 1000 / b, r / (B * 1000 / b) }'
"$py" -c 'import torch; c = torch.__config__.show(); print("PyTorch", torch.__version__,
  "(PyPI; oneDNN:", torch.backends.mkldnn.is_available(), "; MKL:", torch.backends.mkl.is_available(), ")")'
