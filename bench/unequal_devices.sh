#!/usr/bin/env bash
# Devices of several kinds, planned and measured in one run. Two servers of
# one machine each on a 1 Gbit link (scripts/cluster, root needed), the
# second at half the CPU time (--cpu 1,0.5: a cgroup's quota). An MLP of
# eight 1024-wide layers is profiled here at micro-batches of 8, 16, 32 and
# 64 (a small product is slower a sample than a large one: one profile
# scaled linearly predicted half the time of micro-batches of 16); 'repipe
# plan --speed 1 0.5' plans it for these devices from all four and gives,
# beside it, the best plan for devices taken as equal (its equal_devices
# row). Each plan is predicted on the unequal servers ('repipe simulate
# --speed 1 0.5', from the profile at its micro-batch) and
# measured (bench_train across the namespaces), the two plans' runs
# interleaved, the median of ROUNDS each.
# Usage: bench/unequal_devices.sh BUILD_DIR [ROUNDS] [SLOW]   (SLOW: the
# second server's share, 0.5)
default_rounds=5
. "$(dirname "$0")/common.sh"
slow=${3:-0.5}
need_root "scripts/cluster makes namespaces and cgroups"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
{ printf 'input 1 28 28\nflatten\n'
  for _ in 1 2 3 4 5 6 7 8; do printf 'linear 1024\nrelu\n'; done
  printf 'linear 10\nsoftmax_cross_entropy\n'; } > "$tmp/mlp.model"
profile() { # micro-batch: the profile's file, made once
  [ -f "$tmp/mlp$1.txt" ] ||
    "$build/repipe" profile --model "$tmp/mlp.model" --micro-batch "$1" --out "$tmp/mlp$1.txt" >/dev/null
  echo "$tmp/mlp$1.txt"
}
profiles=()
for b in 8 16 32 64; do profiles+=(--profile "$(profile $b)"); done
machines=(--machines 1 2 --bandwidth 2e9 1.25e8)
"$build/repipe" plan "${profiles[@]}" "${machines[@]}" --speed 1 "$slow" --global-batch 512 \
  --min-micro-batch 8 --backend mpi --json "$tmp/plan.json" > "$tmp/plan.out"
echo "== repipe plan --profile mlp8.txt ... mlp64.txt ${machines[*]} --speed 1 $slow --global-batch 512 --min-micro-batch 8 --backend mpi"
sed -n '/^repipe.s engine/,$p' "$tmp/plan.out"
for row in best equal_devices; do
  python3 -c 'import json, sys
e = json.load(open(sys.argv[1]))["engine"][sys.argv[2]]
assert e["found"], sys.argv[2] + ": no plan"
json.dump(e["config"], open(sys.argv[3], "w"))' "$tmp/plan.json" "$row" "$tmp/$row.json"
done
med() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
: > "$tmp/best.runs"; : > "$tmp/equal_devices.runs"
for _ in $(seq "$rounds"); do
  for row in best equal_devices; do
    scripts/cluster --servers 2 --machines 1 --link-rate 1gbit --cpu "1,$slow" --timeout 600 -- \
      -np 2 "$build/bench/bench_train" "$tmp/mlp.model" "$tmp/$row.json" 12 --mpi \
      2>/dev/null </dev/null | sed -n 's/.*"samples_per_s": \([0-9.]*\).*/\1/p' >> "$tmp/$row.runs"
  done
done
echo
echo "== on 2 servers of 1 machine, the second at $slow of a core, a 1 Gbit link between them ($rounds runs each, interleaved)"
printf '%-24s %-16s %-10s %3s %4s %-7s %10s %10s %8s\n' plan layers_per_stage replicas R GA schedule \
  predicted measured error
for row in best equal_devices; do
  mb=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["micro_batch_size"])' "$tmp/$row.json")
  pred=$("$build/repipe" simulate --config "$tmp/$row.json" --profile "$(profile "$mb")" "${machines[@]}" \
           --speed 1 "$slow" --backend mpi --json - 2>/dev/null |
         sed -n 's/.*"seconds_per_update":[[:space:]]*\([0-9.e+-]*\).*/\1/p')
  keys=$(python3 -c 'import json, sys
c = json.load(open(sys.argv[1]))
print(str(c["layers_per_stage"]).replace(" ", ""), str(c.get("stage_replication", [1])).replace(" ", ""),
      c["replication_factor"], c["gradient_accumulation_steps"], c["schedule"])' "$tmp/$row.json")
  read -r lps reps R ga sched <<<"$keys"
  sps=$(med < "$tmp/$row.runs")
  meas=$(awk -v s="$sps" 'BEGIN { print 512 / s }')
  printf '%-24s %-16s %-10s %3s %4s %-7s %8.1f ms %8.1f ms %+7.1f%%\n' \
    "$([ $row = best ] && echo "for these devices" || echo "for equal devices")" "$lps" "$reps" "$R" \
    "$ga" "$sched" "$(awk -v p="$pred" 'BEGIN { print p * 1e3 }')" \
    "$(awk -v m="$meas" 'BEGIN { print m * 1e3 }')" "$(awk -v p="$pred" -v m="$meas" 'BEGIN { print 100 * (p - m) / m }')"
  echo "$meas" > "$tmp/$row.time"
done
awk -v a="$(cat "$tmp/best.time")" -v b="$(cat "$tmp/equal_devices.time")" 'BEGIN {
  printf "measured: the plan for these devices takes %.2f of the equal-device plan'"'"'s time (%.0f %% faster)\n", a / b, 100 * (b / a - 1) }'
