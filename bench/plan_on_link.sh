#!/usr/bin/env bash
# The engine objective's promise on a real link: two "servers" of one
# machine each (network namespaces, scripts/cluster, root needed), a core
# each, joined by a 100 Mbit link. For an MLP of three 2048-wide layers
# (10 M parameters: data parallelism pays a 40 MB allreduce over the link)
# and the example CNN (26 K: it pays almost nothing), profiled here at
# micro-batches of 8 to 128, the link measured with a ping-pong
# (bench_comm sweep), `repipe plan --objective engine --backend mpi
# --machines 1 1 2 --bandwidth 2e9 FAST SLOW --latency L` writes its
# configuration for 256 samples an update, and it is measured across the
# namespaces (bench_train, median of ROUNDS runs) beside every configuration
# of a grid: one worker, data parallelism and 2-stage pipelines at GA 1-16
# (1f1b; zb-h2 at GA 4 and 8).
# Prints each measured, the plan against the grid's fastest, and the spread
# of repeated runs of one configuration (the noise).
# With SERVERS 3: three servers of one machine for 384 samples an update,
# the three ranks on this machine's cores (planned with --cores), and a grid
# that adds data parallelism of 3, 3-stage pipelines and stage replication
# [2, 1] at GA 4-16.
# MODELS ("mlp cnn" by default) picks the models.
# Usage: bench/plan_on_link.sh BUILD_DIR [ROUNDS] [SERVERS] [MODELS]
default_rounds=3
. "$(dirname "$0")/common.sh"
need_root "scripts/cluster makes network namespaces"
servers=${3:-2}
models=${4:-mlp cnn}
N=$((servers == 3 ? 384 : 256))
cores=()
[ "$servers" -le "$(nproc)" ] || cores=(--cores "$(nproc)")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf 'input 1 28 28\nflatten\nlinear 2048\nrelu\nlinear 2048\nrelu\nlinear 2048\nrelu\nlinear 10\nsoftmax_cross_entropy\n' > "$tmp/mlp.model"
cp examples/fmnist-cnn.model "$tmp/cnn.model"
for model in $models; do
  for b in 64 8 16 32 128; do
    "$build/repipe" profile --model "$tmp/$model.model" --micro-batch $b --out "$tmp/$model-$b.txt" >/dev/null
  done
done
profiles() { for b in 64 8 16 32 128; do printf -- '--profile %s ' "$tmp/$1-$b.txt"; done; }
net=(--servers "$servers" --machines 1 --rate 1gbit --link-rate 100mbit)
fit() { # the fitted latency and bandwidth of the link between the servers
  scripts/cluster "${net[@]}" --timeout 300 -- -np 2 "$build/bench/bench_comm" sweep 2>/dev/null </dev/null |
    sed -n 's/^fit latency \([^ ]*\) bandwidth \([^ ]*\)$/\1 \2/p'
}
read -r lat bw <<<"$(fit)"
echo "the link between the servers, measured: latency $lat s, $bw bytes/s"
# median, lowest and highest samples/s of ROUNDS runs: CONFIG MODEL
measure() {
  local cfg=$1 model=$2 w runs=""
  w=$("$build/repipe" config show "$cfg" | awk '/workers needed/ { print $3; exit }')
  for _ in $(seq "$rounds"); do
    runs+=$(scripts/cluster "${net[@]}" --timeout 600 -- -np "$w" "$build/bench/bench_train" \
            "$tmp/$model.model" "$cfg" 4 --warmup 2 --mpi 2>/dev/null </dev/null)$'\n'
  done
  sed -n 's/.*"samples_per_s": \([0-9.]*\).*/\1/p' <<<"$runs" | sort -g |
    awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)], v[1], v[NR] }'
}
config() { # R, stage replication, layers, GA, schedule
  printf '{"micro_batch_size": %d, "replication_factor": %s, "stage_replication": %s, "layers_per_stage": %s, "gradient_accumulation_steps": %s, "schedule": "%s"}\n' \
    $((N / $1 / $4)) "$1" "$2" "$3" "$4" "$5"
}
for model in $models; do
  if [ $model = mlp ]; then two='[5,-1]' three='[3,2,-1]'; else two='[4,-1]' three='[2,2,-1]'; fi
  if [ "$servers" = 3 ]; then
    grid="1 [1] [-1] 3 1f1b"$'\n'
    for ga in 1 16; do grid+="2 [1] [-1] $ga 1f1b"$'\n'; done
    for ga in 1 4 16; do grid+="3 [1] [-1] $ga 1f1b"$'\n'; done
    for ga in 8 16; do grid+="1 [1,1] $two $ga 1f1b"$'\n'; done
    for ga in 4 8 16; do grid+="1 [1,1,1] $three $ga 1f1b"$'\n'; done
    grid+="1 [1,1,1] $three 8 zb-h2"$'\n'
    for ga in 4 8 16; do grid+="1 [2,1] $two $ga 1f1b"$'\n'; done
  else
    grid="1 [1] [-1] 1 1f1b"$'\n'
    for ga in 1 4 16; do grid+="2 [1] [-1] $ga 1f1b"$'\n'; done
    for ga in 2 4 8 16; do grid+="1 [1,1] $two $ga 1f1b"$'\n'; done
    for ga in 4 8; do grid+="1 [1,1] $two $ga zb-h2"$'\n'; done
  fi
  echo "== $model, $servers servers of one worker, 100 Mbit between them, $N samples an update (samples/s, median of $rounds)"
  best=0 bestname="" spread=0
  while read -r R reps layers ga sched; do
    [ -n "$R" ] || continue
    config "$R" "$reps" "$layers" "$ga" "$sched" > "$tmp/g.json"
    read -r med lo hi <<<"$(measure "$tmp/g.json" "$model")"
    if [ "$layers" = "[-1]" ] && [ "$R" = 1 ]; then name="one worker"
    elif [ "$layers" = "[-1]" ]; then name="data parallel R=$R GA $ga"
    elif [ "$reps" = "[2,1]" ]; then name="replicated [2,1] $layers GA $ga"
    else name="pipeline $layers GA $ga $sched"; fi
    printf '  %-30s %9.0f   (%.0f-%.0f)\n' "$name" "$med" "$lo" "$hi"
    if awk -v a="$med" -v b="$best" 'BEGIN { exit !(a > b) }'; then best=$med bestname=$name; fi
    spread=$(awk -v s="$spread" -v lo="$lo" -v hi="$hi" 'BEGIN { d = (hi - lo) / hi; print (d > s ? d : s) }')
  done <<<"$grid"
  # shellcheck disable=SC2046
  "$build/repipe" plan $(profiles $model) --machines 1 1 "$servers" --bandwidth 2e9 1.2e8 "$bw" \
    --latency "$lat" --backend mpi --objective engine --global-batch $N "${cores[@]}" \
    --config-out "$tmp/plan.json" | grep -E "^  (one worker|data parallel|fastest)" | sed 's/^ */  planner: /'
  read -r pm lo hi <<<"$(measure "$tmp/plan.json" "$model")"
  keys=$(tr -d '\n\t ' < "$tmp/plan.json" | grep -o '"\(micro_batch_size\|replication_factor\|gradient_accumulation_steps\|layers_per_stage\|stage_replication\|schedule\)":\(\[[^]]*\]\|[^,]*\)' | tr '\n' ' ')
  awk -v p="$pm" -v b="$best" -v n="$bestname" -v s="$spread" -v c="$keys" 'BEGIN {
    printf "  the plan (%s): %.0f samples/s, %.2f of the grid'"'"'s fastest (%s, %.0f); runs of one configuration spread up to %.0f %%\n\n",
           c, p, p / b, n, b, 100 * s }'
done
