#!/usr/bin/env bash
# A GPT beside llm.c's CPU trainer and PyTorch: L4 C256 H4, byte vocabulary,
# B = 4, one thread each, all three from the same llm.c checkpoint and the
# same batches (file order, AdamW), tokens/s at T = 64 and T = 256. Each side
# runs ROUNDS times, alternating, and keeps its best; the first 2 steps of a
# run are not timed. Beside them, the bound of the step's matrix products
# alone (bench_gpt_gemm), and the first losses of each, which must agree.
# Needs ../shared (bench/gen_llmc_files.py, bench/torch_gpt.py, peers/llmc),
# python3-torch and numpy, and Debian's bible-kjv (scripts/kjv-text).
# Then it learns: 400 AdamW updates at lr 1e-3, B = 4, T = 64, repipe and
# PyTorch from the same checkpoint in the same order, and the validation
# loss of each on the same 20 held-out windows.
# Usage: bench/gpt_vs_peers.sh BUILD_DIR [ROUNDS] [STEPS]
set -eu
build=$(cd "${1:-build}" && pwd)
rounds=${2:-3}
steps=${3:-20}
cd "$(dirname "$0")/.."
shared=../shared
py=/usr/bin/python3
if [ ! -f "$shared/bench/torch_gpt.py" ] || [ ! -d "$shared/peers/llmc" ]; then
  echo "gpt_vs_peers: needs $shared/bench and $shared/peers/llmc beside the repository"; exit 0
fi
if ! "$py" -c "import torch, numpy" 2>/dev/null; then
  echo "gpt_vs_peers: needs python3-torch and python3-numpy"; exit 0
fi
sh scripts/kjv-text "$build"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
# llm.c, built as its README says
cp -r "$shared/peers/llmc/." "$work/llmc"
(cd "$work/llmc" && gcc -Ofast -march=native -fopenmp -DOMP -Wno-unused-result -I. \
   train_gpt2_bench.c -lm -o train_gpt2_bench)
"$py" "$shared/bench/gen_llmc_files.py" model "$work/m.bin" --L 4 --C 256 --NH 4 --V 256 --maxT 256 > /dev/null
"$py" "$shared/bench/gen_llmc_files.py" data "$build/kjv-train.txt" "$work/kjv" > /dev/null
# repipe's run ends with a validation loss: a short one (2048 tokens of the held-out text)
"$py" -c 'import sys, numpy as np
h = np.fromfile(sys.argv[1], dtype=np.int32, count=256); t = np.fromfile(sys.argv[1], dtype=np.uint16, offset=1024)[:2048]
h[2] = len(t); open(sys.argv[2], "wb").write(h.tobytes() + t.tobytes())' "$work/kjv_val.bin" "$work/val.bin"
printf '%-6s %12s %12s %12s %12s %10s %10s %8s\n' T "repipe" "PyTorch" "llm.c" "gemm bound" \
  "/PyTorch" "/llm.c" "/bound"
for T in 64 256; do
  { printf 'input %d\nembedding 256 256 std=0.02\nposition_embedding\n' "$T"
    for _ in 1 2 3 4; do echo "transformer_block heads=4"; done
    printf 'layernorm\nlinear 256 bias=false tie=0\nsoftmax_cross_entropy\n'; } > "$work/gpt$T.model"
  "$build/repipe" weights import-llmc "$work/m.bin" --model "$work/gpt$T.model" --out "$work/m$T.rpw" > /dev/null
  printf '{"micro_batch_size": 4, "data_order": "sequential", "optimizer": {"type": "adamw", "lr": 0.0001, "weight_decay": 0}}\n' > "$work/seq.json"
  r=0 t=0 l=0
  for _ in $(seq "$rounds"); do
    "$build/repipe" train --model "$work/gpt$T.model" --config "$work/seq.json" --tokens "$work/kjv_train.bin" \
      --val-tokens "$work/val.bin" --load "$work/m$T.rpw" --updates "$steps" --log-every 1 \
      --json-log "$work/r.jsonl" > /dev/null 2>&1
    x=$(awk -F'"elapsed_s":' -v B=4 -v T="$T" -v n="$steps" '
        { split($2, a, /[,}]/); e[NR] = a[1] } END { print (n - 2) * B * T / (e[n] - e[2]) }' "$work/r.jsonl")
    r=$(awk -v a="$r" -v b="$x" 'BEGIN { print (b > a ? b : a) }')
    x=$("$py" "$shared/bench/torch_gpt.py" --threads 1 --ckpt "$work/m.bin" --data "$work/kjv_train.bin" \
        --B 4 --T "$T" --steps "$steps" | tee "$work/t.txt" | sed -n 's/.*tok_per_s=\([0-9.]*\).*/\1/p')
    t=$(awk -v a="$t" -v b="$x" 'BEGIN { print (b > a ? b : a) }')
    x=$("$work/llmc/train_gpt2_bench" "$work/m.bin" "$work/kjv_train.bin" - 4 "$T" "$steps" 1e-4 0 |
        tee "$work/l.txt" | sed -n 's/.*tok_per_s=\([0-9.]*\).*/\1/p')
    l=$(awk -v a="$l" -v b="$x" 'BEGIN { print (b > a ? b : a) }')
  done
  g=$("$build/bench/bench_gpt_gemm" 4 "$T" 256 4 256 4 | sed -n 's/.*s a step, \([0-9.]*\) tokens.*/\1/p')
  printf '%-6s %12.0f %12.0f %12.0f %12.0f %9.2fx %9.2fx %7.0f%%\n' "$T" "$r" "$t" "$l" "$g" \
    "$(awk -v a="$r" -v b="$t" 'BEGIN { print a / b }')" "$(awk -v a="$r" -v b="$l" 'BEGIN { print a / b }')" \
    "$(awk -v a="$r" -v b="$g" 'BEGIN { print 100 * a / b }')"
  # the same numbers: the first 5 losses of the three
  paste <(grep -o '"loss":[0-9.]*' "$work/r.jsonl" | head -5 | sed 's/"loss"://') \
        <(sed -n 's/^step [0-9]*: train loss \([0-9.]*\).*/\1/p' "$work/t.txt" | head -5) \
        <(sed -n 's/^step [0-9]*: train loss \([0-9.]*\).*/\1/p' "$work/l.txt" | head -5) |
    awk '{ printf "       losses %s  %s  %s\n", $1, $2, $3 }'
done

echo
echo "It learns: 400 updates at lr 1e-3 (B 4, T 64), validation loss on 20 held-out windows"
"$py" -c 'import sys, numpy as np
h = np.fromfile(sys.argv[1], dtype=np.int32, count=256); t = np.fromfile(sys.argv[1], dtype=np.uint16, offset=1024)[:5 * 4 * 64 + 1]
h[2] = len(t); open(sys.argv[2], "wb").write(h.tobytes() + t.tobytes())' "$work/kjv_val.bin" "$work/val20.bin"
printf '{"micro_batch_size": 4, "data_order": "sequential", "optimizer": {"type": "adamw", "lr": 0.001, "weight_decay": 0}}\n' > "$work/learn.json"
r=$("$build/repipe" train --model "$work/gpt64.model" --config "$work/learn.json" --tokens "$work/kjv_train.bin" \
    --val-tokens "$work/val20.bin" --load "$work/m64.rpw" --updates 400 --log-every 400 2>&1 |
    sed -n 's/^validation loss: \([0-9.]*\).*/\1/p')
t=$("$py" "$shared/bench/torch_gpt.py" --threads 1 --ckpt "$work/m.bin" --data "$work/kjv_train.bin" \
    --val "$work/val20.bin" --B 4 --T 64 --steps 400 --lr 1e-3 | sed -n 's/^val loss \([0-9.]*\)/\1/p' | tail -1)
printf 'repipe %s, PyTorch %s nats per byte: %+.2f%%\n' "$r" "$t" "$(awk -v a="$r" -v b="$t" 'BEGIN { print 100 * (a - b) / b }')"
