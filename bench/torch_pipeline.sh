#!/usr/bin/env bash
# repipe's engine beside PyTorch's pipelining on the same GPT stages, and
# rt.Pipeline beside PyTorch's own schedule class: 2 workers of 1 thread
# each, 1f1b, GA 8, micro-batches of 4 sequences of 64 bytes (C 128, 4 blocks
# of 4 heads, the head tied), SGD. A round runs repipe's engine (bench_train
# on examples/gpt-kjv.model, 2 threads, the cut after its second block) and
# then, under torchrun on gloo, PyTorch's Schedule1F1B on two hand-written
# stages and rt.Pipeline on the same cut, each first in one of two turns of
# 10 updates (bench/torch_pipeline.py); each
# round's ratios, then their medians.
# Needs the project's PyTorch environment (scripts/python-env makes it).
# Usage: bench/torch_pipeline.sh BUILD_DIR [ROUNDS]
set -eu
build=$(cd "${1:-build}" && pwd)
rounds=${2:-5}
cd "$(dirname "$0")/.."
py=$(sh scripts/python-env)
sh scripts/kjv-text "$build"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# the package from this checkout and the library from the build given (not whatever the
# environment exports)
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 PYTHONPATH="$PWD/python" \
  REPIPE_LIBRARY="$build/librepipe.so"
[ -e "$REPIPE_LIBRARY" ] || { echo "torch_pipeline.sh: $REPIPE_LIBRARY is missing: build $build first (make build)" >&2; exit 1; }
cat > "$work/gpt.json" <<'JSON'
{"micro_batch_size": 4, "gradient_accumulation_steps": 8, "layers_per_stage": [4, -1],
 "schedule": "1f1b", "optimizer": {"type": "sgd", "lr": 0.01}}
JSON
for r in $(seq 1 "$rounds"); do
  "$build/bench/bench_train" examples/gpt-kjv.model "$work/gpt.json" 20 \
    --text "$build/kjv-train.txt" --warmup 3 > "$work/engine.$r"
  if ! "$(dirname "$py")/torchrun" --standalone --nproc-per-node 2 bench/torch_pipeline.py 2 10 \
       > "$work/torchrun.$r" 2>&1 || ! grep '^{' "$work/torchrun.$r" > "$work/torch.$r"; then
    echo "torch_pipeline.sh: round $r under torchrun failed:" >&2
    tail -20 "$work/torchrun.$r" >&2
    exit 1
  fi
done
"$py" - "$work" "$rounds" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
rows = []
for r in range(1, rounds + 1):
    e = json.load(open("%s/engine.%d" % (work, r)))
    t = json.load(open("%s/torch.%d" % (work, r)))
    rows.append((e["samples_per_s"], t["pytorch"]["samples_per_s"],
                 t["rt_pipeline"]["samples_per_s"]))
print("round  engine samples/s  PyTorch Schedule1F1B  rt.Pipeline  engine/PyTorch  rt.Pipeline time/PyTorch's")
for i, (e, p, q) in enumerate(rows):
    print("%5d  %16.1f  %20.1f  %11.1f  %14.2f  %26.3f" % (i + 1, e, p, q, e / p, p / q))
print("median engine/PyTorch %.2f, rt.Pipeline's time over PyTorch's %.3f"
      % (statistics.median(e / p for e, p, _ in rows), statistics.median(p / q for _, p, q in rows)))
PY
