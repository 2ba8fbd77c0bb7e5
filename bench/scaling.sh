#!/usr/bin/env bash
# Data-parallel scaling, in one run: samples/s of the MLP and the CNN with
# one worker, two replicas on the local backend (threads), two replicas on
# the MPI backend (mpirun -np 2), and PyTorch DistributedDataParallel with
# two processes (../shared/bench/torch_peer.py --ddp 2). Batch 64 per worker,
# one thread per worker. Each case runs ROUNDS times; the best is kept.
# Part 2 times 2-stage pipelines against the bubble model (bench_pipeline).
# Usage: bench/scaling.sh BUILD_DIR [ROUNDS]
default_rounds=5
. "$(dirname "$0")/common.sh"
peer=../shared/bench/torch_peer.py
py=/usr/bin/python3
have_torch=0
[ -f "$peer" ] && "$py" -c "import torch" 2>/dev/null && have_torch=1
best() { sed -n 's/.*"samples_per_s": \([0-9.]*\).*/\1/p' | sort -g | tail -1; }
printf '%-5s %12s %12s %12s %12s %9s %9s\n' model "1 worker" "R=2 local" "R=2 mpi" "torch ddp2" "R2/1" "R2/ddp"
for spec in "mlp 600" "cnn 200"; do
  set -- $spec
  model=$1 steps=$2
  one=""; loc=""; mpi=""; ddp=""
  for _ in $(seq "$rounds"); do
    one+=$("$build/bench/bench_train" "examples/fmnist-$model.model" examples/fmnist.json "$steps")$'\n'
    loc+=$("$build/bench/bench_train" "examples/fmnist-$model.model" examples/fmnist-r2.json "$steps")$'\n'
    mpi+=$($mpirun -np 2 "$build/bench/bench_train" "examples/fmnist-$model.model" examples/fmnist-r2.json "$steps" --mpi)$'\n'
    if [ $have_torch = 1 ]; then
      ddp+=$("$py" "$peer" --model "$model" --ddp 2 --steps "$steps")$'\n'
    fi
  done
  o=$(best <<<"$one"); l=$(best <<<"$loc"); m=$(best <<<"$mpi"); d=$(best <<<"$ddp")
  awk -v n="$model" -v o="$o" -v l="$l" -v m="$m" -v d="${d:-0}" 'BEGIN {
    printf "%-5s %12.0f %12.0f %12.0f %12.0f %8.2fx %8s\n", n, o, l, m, d, l / o,
           (d > 0 ? sprintf("%.2fx", l / d) : "n/a") }'
done

echo
echo "== part 2: pipelines (P = 2, and R = 2 x P = 2 on four workers) against the bubble model"
"$build/bench/bench_pipeline" examples/fmnist-mlp.model 3 32
"$build/bench/bench_pipeline" examples/fmnist-cnn.model 4 32
