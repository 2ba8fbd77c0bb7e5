#!/usr/bin/env bash
# The simulator against a real network, in one run: 2 ranks in 2 network
# namespaces (scripts/cluster, root needed), one rank a core, on links shaped
# to 1 Gbit and 100 Mbit. An MLP of three 1024-wide layers is profiled here
# ('repipe profile', micro-batches of 64); each configuration is predicted
# ('repipe simulate --machines 1 2 --bandwidth 2e9 LINK --backend mpi': two
# servers of one worker, the link between them) and measured (bench_train
# across the namespaces, the median of ROUNDS runs), with Open MPI's TCP
# default flags (PUT on) and with repipe's (PUT off, what rp_comm_mpi_init
# sets unless the user chose). Prints predicted
# beside measured time per update, each error, and the median and worst
# |error| of each set.
# Usage: bench/cluster_vs_simulate.sh BUILD_DIR [ROUNDS]
default_rounds=3
. "$(dirname "$0")/common.sh"
if [ "$(id -u)" != 0 ]; then
  echo "bench/cluster_vs_simulate.sh: needs root (scripts/cluster makes network namespaces)" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'input 1 28 28\nflatten\nlinear 1024\nrelu\nlinear 1024\nrelu\nlinear 1024\nrelu\nlinear 10\nsoftmax_cross_entropy\n' > "$tmp/mlp.model"
"$build/repipe" profile --model "$tmp/mlp.model" --micro-batch 64 --out "$tmp/mlp.txt" >/dev/null
med() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# name rate bytes/s R layers GA schedule steps
cases="dp 1gbit 1.25e8 2 [-1] 1 1f1b 20
pipe 1gbit 1.25e8 1 [5,-1] 4 1f1b 20
pipe 1gbit 1.25e8 1 [5,-1] 8 1f1b 12
pipe 1gbit 1.25e8 1 [5,-1] 8 zb-h1 12
dp 100mbit 1.25e7 2 [-1] 1 1f1b 6
pipe 100mbit 1.25e7 1 [5,-1] 4 1f1b 10
pipe 100mbit 1.25e7 1 [5,-1] 8 1f1b 8
pipe 100mbit 1.25e7 1 [5,-1] 8 zb-h1 8"
for flags in "send,put,inplace,need-ack,need-csum,hetero-rdma" repipe; do
  echo "== btl_tcp_flags: $flags$([ "$flags" = repipe ] || echo " (Open MPI's default)")"
  printf '%-5s %-7s %3s %-6s %12s %12s %9s\n' run link GA sched "predicted ms" "measured ms" error
  mca=()
  [ "$flags" != repipe ] && mca=(--mca btl_tcp_flags "$flags")
  errors=""
  while read -r name rate bw R layers ga sched steps; do
    cfg="$tmp/c.json"
    printf '{"micro_batch_size": 64, "replication_factor": %s, "layers_per_stage": %s, "gradient_accumulation_steps": %s, "schedule": "%s"}\n' \
      "$R" "$layers" "$ga" "$sched" > "$cfg"
    pred=$("$build/repipe" simulate --config "$cfg" --profile "$tmp/mlp.txt" --machines 1 2 \
           --bandwidth 2e9 "$bw" --backend mpi --json - 2>/dev/null |
           sed -n 's/.*"seconds_per_update":[[:space:]]*\([0-9.e+-]*\).*/\1/p')
    : > "$tmp/runs"
    for _ in $(seq "$rounds"); do
      scripts/cluster --rate "$rate" --timeout 600 -- "${mca[@]}" -np 2 \
        "$build/bench/bench_train" "$tmp/mlp.model" "$cfg" "$steps" --mpi 2>/dev/null </dev/null |
        sed -n 's/.*"samples_per_s": \([0-9.]*\).*/\1/p' >> "$tmp/runs"
    done
    rate_s=$(med < "$tmp/runs")
    line=$(awk -v p="$pred" -v r="$rate_s" -v s=$((64 * ga * R)) 'BEGIN {
      m = s / r; printf "%12.1f %12.1f %+8.1f%%", p * 1e3, m * 1e3, 100 * (p - m) / m }')
    printf '%-5s %-7s %3s %-6s %s\n' "$name" "$rate" "$ga" "$sched" "$line"
    errors+=$(awk '{ e = $NF; sub(/%/, "", e); e += 0; print (e < 0 ? -e : e) }' <<<"$line")$'\n'
  done <<<"$cases"
  sort -g <<<"$errors" | awk 'NF { v[++n] = $1 } END {
    printf "%d configurations: median |error| %.1f %%, worst %.1f %%\n\n", n,
           (n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2), v[n] }'
done
