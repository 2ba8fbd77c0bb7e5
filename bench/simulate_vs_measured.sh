#!/usr/bin/env bash
# The simulator against this machine, in one run: both example models are
# profiled here ('repipe profile', micro-batches of 64), then every
# configuration below is predicted ('repipe simulate --cores N', N = this
# machine's cores) and measured (bench_train: 20 warm-up updates, then
# STEPS updates; the median of ROUNDS runs), on the local backend and
# under mpirun. Prints predicted beside measured time per update, the
# error of each, and the median and worst |error| of all.
# Usage: bench/simulate_vs_measured.sh BUILD_DIR [ROUNDS]
default_rounds=3
. "$(dirname "$0")/common.sh"
cores=$(nproc)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for model in mlp cnn; do
  "$build/repipe" profile --model "examples/fmnist-$model.model" --micro-batch 64 \
    --out "$tmp/$model.txt" >/dev/null
done
# model backend R stage_replication layers_per_stage GA schedule steps
cases="mlp local 1 [1] [-1] 8 1f1b 40
mlp local 2 [1] [-1] 4 1f1b 40
mlp mpi 2 [1] [-1] 4 1f1b 40
mlp local 1 [1,1] [2,5] 8 1f1b 40
mlp local 1 [2,1] [2,5] 8 1f1b 40
mlp local 1 [3,1] [2,5] 12 1f1b 30
mlp mpi 1 [2,1] [2,5] 8 1f1b 40
mlp local 1 [2,1] [2,5] 8 gpipe 40
cnn local 1 [1] [-1] 8 1f1b 15
cnn local 2 [1] [-1] 4 1f1b 15
cnn mpi 2 [1] [-1] 4 1f1b 15
cnn local 1 [1,1] [4,5] 8 1f1b 15
cnn local 1 [2,1] [4,5] 8 1f1b 15
cnn local 1 [3,1] [4,5] 12 1f1b 10
cnn mpi 1 [2,1] [4,5] 8 1f1b 15
cnn local 2 [2,1] [4,5] 4 1f1b 10"
printf '%-5s %-6s %-22s %8s %12s %12s %9s\n' model backend "R x [r] (layers)" GA "predicted ms" "measured ms" error
errors=""
while read -r model backend R reps layers ga sched steps; do
  cfg="$tmp/c.json"
  printf '{"micro_batch_size": 64, "replication_factor": %s, "stage_replication": %s, "layers_per_stage": %s, "gradient_accumulation_steps": %s, "schedule": "%s"}\n' \
    "$R" "$reps" "$layers" "$ga" "$sched" > "$cfg"
  pred=$("$build/repipe" simulate --config "$cfg" --profile "$tmp/$model.txt" --cores "$cores" \
         --backend "$backend" --json - 2>/dev/null | sed -n 's/.*"seconds_per_update":[[:space:]]*\([0-9.e+-]*\).*/\1/p')
  workers=$("$build/repipe" config show "$cfg" | awk '/workers needed/ { print $3; exit }')
  runs=""
  for _ in $(seq "$rounds"); do
    if [ "$backend" = mpi ]; then
      runs+=$($mpirun -np "$workers" "$build/bench/bench_train" "examples/fmnist-$model.model" "$cfg" "$steps" --mpi </dev/null)$'\n'
    else
      runs+=$("$build/bench/bench_train" "examples/fmnist-$model.model" "$cfg" "$steps" </dev/null)$'\n'
    fi
  done
  rate=$(sed -n 's/.*"samples_per_s": \([0-9.]*\).*/\1/p' <<<"$runs" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
  line=$(awk -v p="$pred" -v r="$rate" -v s=$((64 * ga * R)) 'BEGIN {
    m = s / r; printf "%12.3f %12.3f %+8.1f%%", p * 1e3, m * 1e3, 100 * (p - m) / m }')
  printf '%-5s %-6s %-22s %8s %s\n' "$model" "$backend" "$R x $reps ($layers)$( [ "$sched" = gpipe ] && echo ' gpipe')" "$ga" "$line"
  errors+=$(awk '{ e = $NF; sub(/%/, "", e); e += 0; print (e < 0 ? -e : e) }' <<<"$line")$'\n'
done <<<"$cases"
sort -g <<<"$errors" | awk 'NF { v[++n] = $1 } END {
  printf "\n%d configurations on %s cores: median |error| %.1f %%, worst %.1f %%\n", n, "'"$cores"'",
         (n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2), v[n] }'

# Part 2: a replicated stage is not a slowdown. R = 1 x [2, 2] at GA 8 against
# R = 2 x [1, 1] at GA 4 (the same workers and samples) and against GPipe;
# the three interleaved, ROUNDS + 2 runs each, medians.
echo
echo "== replication is not a slowdown: median samples/s of $((rounds + 2)) interleaved runs"
printf '%-5s %16s %16s %16s %10s %10s\n' model "[2,2] GA 8 1f1b" "2x[1,1] GA 4" "[2,2] GA 8 gpipe" "vs 2x[1,1]" "vs gpipe"
for spec in "mlp [2,5] 40" "cnn [4,5] 12"; do
  set -- $spec
  model=$1 layers=$2 steps=$3
  i=0
  for c in "1 [2,2] 8 1f1b" "2 [1,1] 4 1f1b" "1 [2,2] 8 gpipe"; do
    set -- $c
    i=$((i + 1))
    printf '{"micro_batch_size": 64, "replication_factor": %s, "stage_replication": %s, "layers_per_stage": %s, "gradient_accumulation_steps": %s, "schedule": "%s"}\n' \
      "$1" "$2" "$layers" "$3" "$4" > "$tmp/r$i.json"
  done
  r1=""; r2=""; r3=""
  for _ in $(seq $((rounds + 2))); do
    r1+=$("$build/bench/bench_train" "examples/fmnist-$model.model" "$tmp/r1.json" "$steps" </dev/null)$'\n'
    r2+=$("$build/bench/bench_train" "examples/fmnist-$model.model" "$tmp/r2.json" "$steps" </dev/null)$'\n'
    r3+=$("$build/bench/bench_train" "examples/fmnist-$model.model" "$tmp/r3.json" "$steps" </dev/null)$'\n'
  done
  med() { sed -n 's/.*"samples_per_s": \([0-9.]*\).*/\1/p' | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
  a=$(med <<<"$r1"); b=$(med <<<"$r2"); g=$(med <<<"$r3")
  awk -v m="$model" -v a="$a" -v b="$b" -v g="$g" 'BEGIN {
    printf "%-5s %16.0f %16.0f %16.0f %+9.1f%% %+9.1f%%\n", m, a, b, g, 100 * (a - b) / b, 100 * (a - g) / g }'
done
