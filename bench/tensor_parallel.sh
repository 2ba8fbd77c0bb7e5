#!/usr/bin/env bash
# Tensor parallelism on this machine, in one run: a GPT-2 block at C 512
# (8 heads, MLP 2048, 64 positions, bytes of the repository's own text)
# written as a graph, its attention and MLP split over t = 2 workers (two
# threads on the 2 cores), against t = 1 on one core. ROUNDS runs of each,
# interleaved; prints the median time per update of each, the ratio, and
# what 'repipe simulate --cores N --tensor-split' predicts from a profile
# measured in the same run, with the error of each prediction.
# Usage: bench/tensor_parallel.sh BUILD_DIR [ROUNDS]
default_rounds=5
. "$(dirname "$0")/common.sh"
cores=$(nproc)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/gpt.model" <<'MODEL'
input 64
embedding 256 512 std=0.02
x = position_embedding
layernorm
linear 1536
attention heads=8
o = linear 512
x1 = add < o x
layernorm
linear 2048
gelu
m = linear 512
add < m x1
layernorm
linear 256 bias=false tie=0
softmax_cross_entropy
MODEL
cat docs/*.md README.md > "$tmp/text.txt"
B=8 steps=12
"$build/repipe" profile --model "$tmp/gpt.model" --micro-batch "$B" --out "$tmp/gpt.txt" >/dev/null
med() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
for t in 1 2; do
  printf '{"micro_batch_size": %s, "tensor_parallel": %s, "optimizer": {"type": "adamw", "lr": 0.001}}\n' \
    "$B" "$t" > "$tmp/t$t.json"
  : > "$tmp/t$t.runs"
done
for _ in $(seq "$rounds"); do
  for t in 1 2; do
    "$build/bench/bench_train" "$tmp/gpt.model" "$tmp/t$t.json" "$steps" --text "$tmp/text.txt" </dev/null |
      sed -n 's/.*"samples_per_s": \([0-9.]*\).*/\1/p' >> "$tmp/t$t.runs"
  done
done
printf '%-3s %12s %9s %12s %9s %12s\n' t "measured ms" "vs t=1" "predicted ms" error "pred. ratio"
base="" pbase=""
for t in 1 2; do
  rate=$(med < "$tmp/t$t.runs")
  pred=$("$build/repipe" simulate --config "$tmp/t$t.json" --profile "$tmp/gpt.txt" --cores "$cores" \
         --tensor-split "$tmp/gpt.model" --json - 2>/dev/null |
         sed -n 's/.*"seconds_per_update":[[:space:]]*\([0-9.e+-]*\).*/\1/p')
  ms=$(awk -v r="$rate" -v n="$B" 'BEGIN { printf "%.3f", 1e3 * n / r }')
  [ -z "$base" ] && base=$ms pbase=$pred
  awk -v t="$t" -v m="$ms" -v b="$base" -v p="$pred" -v pb="$pbase" 'BEGIN {
    printf "%-3s %12.3f %9.3f %12.3f %+8.1f%% %12.3f\n", t, m, m / b, p * 1e3, 100 * (p * 1e3 - m) / m, p / pb }'
done
