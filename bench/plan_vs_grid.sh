#!/usr/bin/env bash
# The engine's planner against a grid of hand-written configurations, on
# this machine, in one run. Both example models are profiled here, at
# micro-batches of 8 to 128; then, for
# 2 and 4 workers and 256 samples per update, `repipe plan --objective
# engine --cores N` (N = this machine's cores) writes its configuration,
# and it is measured (bench_train, median of ROUNDS runs) beside every
# configuration of the grid: data parallelism, 2- and 3-stage pipelines,
# uneven stage replication, GA 1-16, all with the same samples per update.
# The 4-worker plan and data parallelism also run on 4 MPI ranks. Prints
# the plan against the grid's fastest and against data parallelism, and the
# spread of repeated runs of one configuration (the noise).
# Usage: bench/plan_vs_grid.sh BUILD_DIR [ROUNDS]
default_rounds=3
. "$(dirname "$0")/common.sh"
cores=$(nproc)
N=256
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# each model profiled at five micro-batches: the planner scales the times of
# the one measured nearest each micro-batch it considers
for model in mlp cnn; do
  for b in 64 8 16 32 128; do
    "$build/repipe" profile --model "examples/fmnist-$model.model" --micro-batch $b \
      --out "$tmp/$model-$b.txt" >/dev/null
  done
done
profiles() { for b in 64 8 16 32 128; do printf -- '--profile %s ' "$tmp/$1-$b.txt"; done; }

# median samples/s of ROUNDS runs of a configuration: CONFIG MODEL [mpi]
measure() {
  local cfg=$1 model=$2 backend=${3:-local} runs="" steps w
  steps=$([ "$model" = mlp ] && echo 60 || echo 20)
  for _ in $(seq "$rounds"); do
    if [ "$backend" = mpi ]; then
      w=$("$build/repipe" config show "$cfg" | awk '/workers needed/ { print $3; exit }')
      runs+=$($mpirun -np "$w" "$build/bench/bench_train" "examples/$model.model" "$cfg" "$steps" --mpi </dev/null)$'\n'
    else
      runs+=$("$build/bench/bench_train" "examples/$model.model" "$cfg" "$steps" </dev/null)$'\n'
    fi
  done
  sed -n 's/.*"samples_per_s": \([0-9.]*\).*/\1/p' <<<"$runs" | sort -g |
    awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)], v[1], v[NR] }'
}

# config R reps layers GA
config() {
  printf '{"micro_batch_size": %d, "replication_factor": %s, "stage_replication": %s, "layers_per_stage": %s, "gradient_accumulation_steps": %s}\n' \
    $((N / $1 / $4)) "$1" "$2" "$3" "$4"
}

for model in mlp cnn; do
  if [ $model = mlp ]; then two='[2,5]' three='[2,2,3]'; else two='[4,5]' three='[1,3,5]'; fi
  for W in 2 4; do
    grid=""
    for ga in 1 2 4 8 16; do
      grid+="$W [1] [-1] $ga"$'\n'
      [ $ga -ge 2 ] && grid+="$((W / 2)) [1,1] $two $ga"$'\n'
      if [ $W = 4 ]; then
        [ $ga -ge 2 ] && grid+="1 [2,2] $two $ga"$'\n'
        [ $ga -ge 4 ] && grid+="1 [3,1] $two $ga"$'\n'
        [ $ga -ge 2 ] && grid+="1 [2,1] $two $ga"$'\n'
        [ $ga -ge 2 ] && grid+="1 [1,1,1] $three $ga"$'\n'
        [ $ga -ge 2 ] && grid+="1 [2,1,1] $three $ga"$'\n'
      fi
    done
    echo "== $model, $W workers, $N samples per update (samples/s, median of $rounds)"
    best=0 bestname="" dp=0 spread=0
    while read -r R reps layers ga; do
      [ -n "$R" ] || continue
      config "$R" "$reps" "$layers" "$ga" > "$tmp/g.json"
      read -r med lo hi <<<"$(measure "$tmp/g.json" "fmnist-$model")"
      name="R=$R $reps $layers GA $ga"
      printf '  %-32s %10.0f\n' "$name" "$med"
      if awk -v a="$med" -v b="$best" 'BEGIN { exit !(a > b) }'; then best=$med bestname=$name; fi
      if [ "$reps" = "[1]" ] && awk -v a="$med" -v b="$dp" 'BEGIN { exit !(a > b) }'; then dp=$med; fi
      spread=$(awk -v s="$spread" -v lo="$lo" -v hi="$hi" 'BEGIN { d = (hi - lo) / hi; print (d > s ? d : s) }')
    done <<<"$grid"
    # shellcheck disable=SC2046
    "$build/repipe" plan $(profiles $model) --machines "$W" --bandwidth 1e10 --cores "$cores" \
      --objective engine --global-batch $N --config-out "$tmp/plan.json" \
      | grep -E "^(data parallelism|a pipeline)"
    read -r pm _ _ <<<"$(measure "$tmp/plan.json" "fmnist-$model")"
    awk -v p="$pm" -v b="$best" -v n="$bestname" -v d="$dp" -v s="$spread" 'BEGIN {
      printf "  plan %.0f samples/s: %.2f of the grid'"'"'s fastest (%s, %.0f), %.2f of data parallelism (%.0f); runs of one configuration spread up to %.0f %%\n",
             p, p / b, n, b, p / d, d, 100 * s }'
    if [ $W = 4 ]; then
      read -r mp _ _ <<<"$(measure "$tmp/plan.json" "fmnist-$model" mpi)"
      # shellcheck disable=SC2046
      "$build/repipe" plan $(profiles $model) --machines 4 --bandwidth 1e10 --cores "$cores" \
        --backend mpi --objective engine --global-batch $N --config-out "$tmp/planmpi.json" >/dev/null
      read -r mpm _ _ <<<"$(measure "$tmp/planmpi.json" "fmnist-$model" mpi)"
      config 4 "[1]" "[-1]" 1 > "$tmp/dp.json"
      read -r md _ _ <<<"$(measure "$tmp/dp.json" "fmnist-$model" mpi)"
      awk -v p="$mp" -v q="$mpm" -v d="$md" 'BEGIN {
        printf "  on 4 MPI ranks: the plan %.0f, the plan for --backend mpi %.0f, data parallelism (GA 1) %.0f samples/s: %.2f and %.2f of it\n",
               p, q, d, p / d, q / d }'
    fi
    echo
  done
done
