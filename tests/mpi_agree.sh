#!/usr/bin/env bash
# MPI ranks started with different commands or files: each case ends within
# seconds, every rank saying what differs from rank 0's, where it hung in a
# collective (another --updates, --save on one rank) or failed later with
# "message truncated" (another model); the same command on both trains.
# Usage: mpi_agree.sh REPIPE MPIRUN
. "$(dirname "$0")/lib.sh"
bin=$1
mpirun=$2
noise_idx "$tmp/idx" 256 32
printf 'input 8 8\nflatten\nlinear 32\nrelu\nlinear 10\nsoftmax_cross_entropy\n' > "$tmp/m0.model"
printf 'input 8 8\nflatten\nlinear 33\nrelu\nlinear 10\nsoftmax_cross_entropy\n' > "$tmp/m1.model"
cp "$tmp/m0.model" "$tmp/same1.model"
printf '{"micro_batch_size": 8, "replication_factor": 2, "optimizer": {"type": "sgd", "lr": 0.01}}\n' > "$tmp/c0.json"
printf '{"micro_batch_size": 8, "replication_factor": 2, "optimizer": {"type": "sgd", "lr": 0.02}}\n' > "$tmp/c1.json"
cp "$tmp/c0.json" "$tmp/same.json"
# ranks NAME PATTERN -- ARGS: rank r's arguments with R replaced by r
ranks() {
  local name=$1 pat=$2; shift 3
  printf '#!/bin/sh\nr=$OMPI_COMM_WORLD_RANK\nexec "%s" train --data "%s" --backend mpi --log-every 1000000 %s\n' \
    "$bin" "$tmp/idx" "$*" > "$tmp/rank.sh"
  local start=$(date +%s)
  out=$(timeout 120 "$mpirun" --oversubscribe --bind-to none --mca btl self,vader -np 2 sh "$tmp/rank.sh" 2>&1)
  local rc=$? took=$(( $(date +%s) - start ))
  if [ -z "$pat" ]; then
    if [ $rc = 0 ] && grep -q "^test accuracy" <<<"$out"; then ok; else bad "$name: exit $rc: $out"; fi
  elif [ $rc != 0 ] && [ $rc != 124 ] && [ $took -lt 60 ] && grep -q -- "$pat" <<<"$out" &&
       ! grep -q "^training" <<<"$out"; then ok
  else bad "$name: exit $rc after ${took}s: $out"; fi
}
ranks "the same job" "" -- --model "$tmp/m0.model" --config "$tmp/c0.json" --updates 4
ranks "another learning rate" "differing from rank 0's: the configuration (on 1 rank)" -- \
  --model "$tmp/m0.model" --config "$tmp/c\$r.json" --updates 4
ranks "another model" "differing from rank 0's: the model (on 1 rank)" -- \
  --model "$tmp/m\$r.model" --config "$tmp/c0.json" --updates 4
ranks "another --updates" "differing from rank 0's: --updates or --epochs (on 1 rank)" -- \
  --model "$tmp/m0.model" --config "$tmp/c0.json" --updates "\$((4 + r))"
ranks "--save on one rank" "differing from rank 0's: --save (on 1 rank)" -- \
  --model "$tmp/m0.model" --config "$tmp/c0.json" --updates 4 "\$([ \$r = 0 ] && echo --save $tmp/w.rpw)"
ranks "--checkpoint-dir on one rank" "--checkpoint-dir and --checkpoint-every (on 1 rank)" -- \
  --model "$tmp/m0.model" --config "$tmp/c0.json" --updates 4 "\$([ \$r = 1 ] && echo --checkpoint-dir $tmp/ck)"
summary
