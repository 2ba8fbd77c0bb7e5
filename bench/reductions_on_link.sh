#!/usr/bin/env bash
# Data parallelism's reductions over real links, each beside the simulator:
#  1. reduction_bucket_mb (sums during the last backward) against one
#     reduction after it: two ranks in network namespaces (scripts/cluster,
#     root needed), one a core, on a shaped 100 Mbit and 1 Gbit link;
#  2. workers_per_server 2 (sums inside each server, across once, back)
#     against Open MPI's flat allreduce: 4 ranks on 2 servers of 2 machines,
#     1 Gbit inside a server and 100 Mbit between (the 4 ranks share the 2
#     cores: predicted with --cores 2);
#  3. reduction_bucket_mb under zb-v: 2 replicas of 2 workers holding two
#     chunks each, a replica a server, each chunk's sum crossing the
#     100 Mbit link (the CNN; predicted with --cores 2). Each model is profiled here
# ('repipe profile'); each configuration is predicted ('repipe simulate
# --machines 1 2 --bandwidth 2e9 RATE --backend mpi', with the rate a
# ping-pong measured first, bench_comm sweep) and measured (bench_train
# across the namespaces). The runs with and without buckets alternate,
# ROUNDS of each; the medians give the time per update and the fraction
# the buckets saved, beside the fraction the simulator predicts.
#  - a CNN whose convolutions hold little and compute much, under a dense
#    layer that holds most of the parameters: its gradient is ready first and
#    crosses while the convolutions' backward runs;
#  - an MLP of three 1024-wide layers: little to compute behind its sums.
# Usage: bench/reductions_on_link.sh BUILD_DIR [ROUNDS] [BUCKET_MB]
default_rounds=3
. "$(dirname "$0")/common.sh"
bucket=${3:-1}
need_root "scripts/cluster makes network namespaces"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'input 1 28 28\nconv2d 32 kernel=3 pad=1\nrelu\nconv2d 32 kernel=3 pad=1\nrelu\nmaxpool2d 2\nconv2d 64 kernel=3 pad=1\nrelu\nmaxpool2d 2\nflatten\nlinear 512\nrelu\nlinear 10\nsoftmax_cross_entropy\n' > "$tmp/cnn.model"
printf 'input 1 28 28\nflatten\nlinear 1024\nrelu\nlinear 1024\nrelu\nlinear 1024\nrelu\nlinear 10\nsoftmax_cross_entropy\n' > "$tmp/mlp.model"
med() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
declare -A fit_bw fit_lat
for r in 1gbit 100mbit; do
  fit=$(scripts/cluster --rate "$r" --timeout 300 -- -np 2 "$build/bench/bench_comm" sweep \
        2>/dev/null </dev/null | sed -n 's/^fit latency \([^ ]*\) bandwidth \([^ ]*\)$/\1 \2/p')
  read -r fit_lat[$r] fit_bw[$r] <<<"$fit"
  echo "$r link: ping-pong fit latency ${fit_lat[$r]} s, bandwidth ${fit_bw[$r]} B/s"
done
echo "== 1. buckets of $bucket MB against one reduction; medians of $rounds interleaved runs"
printf '%-4s %-8s %4s %10s %10s %9s %10s %10s %9s\n' model link B "pred 0" "pred bkt" "pred cut" \
  "meas 0" "meas bkt" "meas cut"
# model, link, micro-batch, updates a run
cases="cnn 100mbit 128 8
cnn 1gbit 128 16
mlp 100mbit 512 8
mlp 1gbit 512 16"
while read -r model rate B steps; do
  "$build/repipe" profile --model "$tmp/$model.model" --micro-batch "$B" \
    --out "$tmp/$model-$B.txt" >/dev/null
  for b in 0 "$bucket"; do
    printf '{"micro_batch_size": %s, "replication_factor": 2, "reduction_bucket_mb": %s}\n' \
      "$B" "$b" > "$tmp/c$b.json"
  done
  pred() {
    "$build/repipe" simulate --config "$tmp/c$1.json" --profile "$tmp/$model-$B.txt" \
      --machines 1 2 --bandwidth 2e9 "${fit_bw[$rate]}" --latency "${fit_lat[$rate]}" \
      --backend mpi --json - 2>/dev/null |
      sed -n 's/.*"seconds_per_update":[[:space:]]*\([0-9.e+-]*\).*/\1/p'
  }
  p0=$(pred 0) pb=$(pred "$bucket")
  : > "$tmp/runs0"; : > "$tmp/runsb"
  for _ in $(seq "$rounds"); do
    for b in 0 "$bucket"; do
      out=$tmp/runs0; [ "$b" = 0 ] || out=$tmp/runsb
      scripts/cluster --rate "$rate" --machines 2 --timeout 600 -- -np 2 \
        "$build/bench/bench_train" "$tmp/$model.model" "$tmp/c$b.json" "$steps" --mpi \
        2>/dev/null </dev/null | sed -n 's/.*"samples_per_s": \([0-9.]*\).*/\1/p' >> "$out"
    done
  done
  awk -v m="$model" -v r="$rate" -v B="$B" -v p0="$p0" -v pb="$pb" -v s0="$(med < "$tmp/runs0")" \
      -v sb="$(med < "$tmp/runsb")" 'BEGIN {
    m0 = 2 * B / s0; mb = 2 * B / sb
    printf "%-4s %-8s %4d %8.1fms %8.1fms %8.1f%% %8.1fms %8.1fms %8.1f%%\n", m, r, B, p0 * 1e3,
           pb * 1e3, 100 * (p0 - pb) / p0, m0 * 1e3, mb * 1e3, 100 * (m0 - mb) / m0 }'
done <<<"$cases"

# 2 servers x 2 machines, 1 Gbit inside and 100 Mbit between: a configuration's predicted
# seconds per update (the 4 ranks on this machine's cores), and samples/s of one run
pred22() { # CONFIG PROFILE
  "$build/repipe" simulate --config "$1" --profile "$2" \
    --machines 1 2 2 --bandwidth 2e9 "${fit_bw[1gbit]}" "${fit_bw[100mbit]}" \
    --latency "${fit_lat[1gbit]}" --cores "$(nproc)" --backend mpi --json - 2>/dev/null |
    sed -n 's/.*"seconds_per_update":[[:space:]]*\([0-9.e+-]*\).*/\1/p'
}
run22() { # MODEL CONFIG STEPS
  scripts/cluster --rate 1gbit --servers 2 --machines 2 --link-rate 100mbit --timeout 600 \
    -- -np 4 "$build/bench/bench_train" "$tmp/$1.model" "$2" "$3" --mpi \
    2>/dev/null </dev/null | sed -n 's/.*"samples_per_s": \([0-9.]*\).*/\1/p'
}
alternate() { # MODEL STEPS CONFIG_A CONFIG_B: ROUNDS runs of each in turn, to $tmp/runsA, runsB
  : > "$tmp/runsA"; : > "$tmp/runsB"
  for _ in $(seq "$rounds"); do
    run22 "$1" "$3" "$2" >> "$tmp/runsA"
    run22 "$1" "$4" "$2" >> "$tmp/runsB"
  done
}

echo
echo "== 2. workers_per_server 2 against the flat allreduce, 2 servers x 2 at 1gbit, 100mbit between;"
echo "   medians of $rounds interleaved runs"
printf '%-4s %4s %10s %10s %9s %10s %10s %9s\n' model B "pred flat" "pred srv" "pred cut" \
  "meas flat" "meas srv" "meas cut"
cases="mlp 64 6
cnn 32 6"
while read -r model B steps; do
  "$build/repipe" profile --model "$tmp/$model.model" --micro-batch "$B" \
    --out "$tmp/$model-$B.txt" >/dev/null
  for k in 0 2; do
    printf '{"micro_batch_size": %s, "replication_factor": 4, "workers_per_server": %s}\n' \
      "$B" "$k" > "$tmp/s$k.json"
  done
  p0=$(pred22 "$tmp/s0.json" "$tmp/$model-$B.txt") p2=$(pred22 "$tmp/s2.json" "$tmp/$model-$B.txt")
  alternate "$model" "$steps" "$tmp/s0.json" "$tmp/s2.json"
  awk -v m="$model" -v B="$B" -v p0="$p0" -v p2="$p2" -v s0="$(med < "$tmp/runsA")" \
      -v s2="$(med < "$tmp/runsB")" 'BEGIN {
    m0 = 4 * B / s0; m2 = 4 * B / s2
    printf "%-4s %4d %8.1fms %8.1fms %8.1f%% %8.1fms %8.1fms %8.1f%%\n", m, B, p0 * 1e3,
           p2 * 1e3, 100 * (p0 - p2) / p0, m0 * 1e3, m2 * 1e3, 100 * (m0 - m2) / m0 }'
done <<<"$cases"

echo
echo "== 3. buckets of $bucket MB under zb-v: 2 replicas of 2 workers holding two chunks each, a"
echo "   replica a server (2 x 2 at 1gbit, 100mbit between: each chunk's sum crosses it);"
echo "   medians of $rounds interleaved runs"
printf '%-4s %4s %10s %10s %9s %10s %10s %9s\n' model B "pred 0" "pred bkt" "pred cut" \
  "meas 0" "meas bkt" "meas cut"
B=32
"$build/repipe" profile --model "$tmp/cnn.model" --micro-batch "$B" --out "$tmp/cnn-v.txt" >/dev/null
for b in 0 "$bucket"; do # chunk 3, with the dense layer, is summed first, under the others' backward
  printf '{"micro_batch_size": %s, "gradient_accumulation_steps": 4, "replication_factor": 2, "layers_per_stage": [2, 3, 3, -1], "schedule": "zb-v", "virtual_stages": 2, "reduction_bucket_mb": %s}\n' \
    "$B" "$b" > "$tmp/v$b.json"
done
p0=$(pred22 "$tmp/v0.json" "$tmp/cnn-v.txt") pb=$(pred22 "$tmp/v$bucket.json" "$tmp/cnn-v.txt")
alternate cnn 6 "$tmp/v0.json" "$tmp/v$bucket.json"
awk -v B="$B" -v p0="$p0" -v pb="$pb" -v s0="$(med < "$tmp/runsA")" -v sb="$(med < "$tmp/runsB")" 'BEGIN {
  m0 = 8 * B / s0; mb = 8 * B / sb
  printf "%-4s %4d %8.1fms %8.1fms %8.1f%% %8.1fms %8.1fms %8.1f%%\n", "cnn", B, p0 * 1e3,
         pb * 1e3, 100 * (p0 - pb) / p0, m0 * 1e3, mb * 1e3, 100 * (m0 - mb) / m0 }'
