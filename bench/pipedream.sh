#!/usr/bin/env bash
# PipeDream's asynchronous schedules (pipedream, with and without vertical
# sync, and pipedream_2bw) beside the synchronous 1F1B: the MLP and
# the CNN on 2 stages, micro-batches of 16, 8 a host call, SGD lr 0.05, 2
# epochs; 2 workers on threads and 4 MPI ranks (2 replicas), in one run.
# Prints samples/s and test accuracy of each, and the ratio.
# Usage: bench/pipedream.sh BUILD_DIR
default_rounds=1
. "$(dirname "$0")/common.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '%-5s %-6s %-14s %12s %9s\n' model where schedule "samples/s" accuracy
for model in mlp cnn; do
  for where in local mpi; do
    for sched in 1f1b pipedream pipedream+vsync pipedream_2bw; do
      R=1; [ "$where" = mpi ] && R=2
      vs=false; [ "$sched" = pipedream+vsync ] && vs=true
      printf '{"seed": 1, "micro_batch_size": 16, "gradient_accumulation_steps": 8, "replication_factor": %d, "layers_per_stage": [-1, -1], "schedule": "%s", "pipedream_vertical_sync": %s, "optimizer": {"type": "sgd", "lr": 0.05}}\n' \
        "$R" "${sched%+vsync}" "$vs" > "$work/c.json"
      if [ "$where" = mpi ]; then
        $mpirun -np 4 "$build/repipe" train --model "examples/fmnist-$model.model" --config "$work/c.json" \
          --epochs 2 --backend mpi --json-log "$work/l.jsonl" > "$work/out.txt" 2>&1
      else
        "$build/repipe" train --model "examples/fmnist-$model.model" --config "$work/c.json" \
          --epochs 2 --json-log "$work/l.jsonl" > "$work/out.txt" 2>&1
      fi
      sps=$(grep '"samples_per_s"' "$work/l.jsonl" | tail -1 | sed 's/.*"samples_per_s":\([0-9.]*\).*/\1/')
      acc=$(sed -n 's/^test accuracy: //p' "$work/out.txt")
      printf '%-5s %-6s %-14s %12s %9s\n' "$model" "$where" "$sched" "$sps" "$acc"
    done
  done
done
