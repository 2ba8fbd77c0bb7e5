#!/usr/bin/env bash
# Checkpoints end to end: resuming equals the uninterrupted run (bit for
# bit on the same layout, within 1e-5 on another), after a clean stop, a
# SIGINT, a SIGKILL of the process and of one MPI rank; what changes the
# mathematics is refused; outputs are checked before training.
# Usage: checkpoint_test.sh REPIPE [MPIRUN]
. "$(dirname "$0")/lib.sh"
bin=$1
mpirun=${2:-}
same() { # NAME A B RTOL: the weights agree
  if "$bin" weights compare "$2" "$3" --rtol "$4" >"$tmp/cmp" 2>&1 && grep -q "^same: 0 tensors" "$tmp/cmp"; then ok
  else bad "$1: $(tail -3 "$tmp/cmp")"; fi
}

# A dataset of 512 8x8 images of noise, labels 0-9 in turn.
noise_idx "$tmp/idx" 512 64
printf 'input 8 8\nflatten\nlinear 32\nrelu\ndropout 0.1\nlinear 10\nsoftmax_cross_entropy\n' > "$tmp/m.model"
opt='"optimizer": {"type": "sgd", "lr": 0.01, "momentum": 0.9}'
printf '{"micro_batch_size": 8, "gradient_accumulation_steps": 2, "replication_factor": 2, %s}\n' "$opt" > "$tmp/r2.json"
printf '{"micro_batch_size": 4, "gradient_accumulation_steps": 2, "replication_factor": 4, %s}\n' "$opt" > "$tmp/r4.json"
printf '{"micro_batch_size": 8, "gradient_accumulation_steps": 2, "replication_factor": 2, "optimizer": {"type": "sgd", "lr": 0.02, "momentum": 0.9}}\n' > "$tmp/lr.json"
train() { "$bin" train --model "$tmp/m.model" --data "$tmp/idx" --log-every 1000000 "$@"; }
# The same in the background, as the job itself: $! is repipe, for signals.
start() { exec "$bin" train --model "$tmp/m.model" --data "$tmp/idx" --log-every 1000000 "$@"; }

# 60 updates straight; 30 with checkpoints every 10 (two kept), then 30 more.
train --config "$tmp/r2.json" --updates 60 --save "$tmp/straight.rpw" >/dev/null 2>&1
train --config "$tmp/r2.json" --updates 30 --checkpoint-dir "$tmp/a" --checkpoint-every 10 --keep 2 >/dev/null 2>&1
if [ "$(ls "$tmp/a")" = "$(printf 'ckpt-000000000020.rpc\nckpt-000000000030.rpc')" ]; then ok; else bad "kept: $(ls "$tmp/a")"; fi
out=$(train --config "$tmp/r2.json" --updates 60 --resume "$tmp/a" --save "$tmp/resumed.rpw" 2>&1)
if grep -q "^resuming from $tmp/a/ckpt-000000000030.rpc: update 30 (written by 2 workers, 1 stage, local backend)" <<<"$out" &&
   grep -q "(30 updates of 32 samples" <<<"$out"; then ok; else bad "resume: $out"; fi
same "resumed = straight" "$tmp/straight.rpw" "$tmp/resumed.rpw" 0
# written under zb-v (2 replicas of 4 chunks on 2 workers each: 4 workers), resumed under
# 1f1b on 2 replicas of 4 stages: the bits, and the words name the workers launched
printf '{"micro_batch_size": 8, "gradient_accumulation_steps": 2, "replication_factor": 2, "layers_per_stage": [2, 1, 1, -1], "schedule": "zb-v", "virtual_stages": 2, %s}\n' "$opt" > "$tmp/zbv.json"
printf '{"micro_batch_size": 8, "gradient_accumulation_steps": 2, "replication_factor": 2, "layers_per_stage": [2, 1, 1, -1], %s}\n' "$opt" > "$tmp/p4.json"
train --config "$tmp/zbv.json" --updates 30 --checkpoint-dir "$tmp/v" >/dev/null 2>&1
out=$(train --config "$tmp/p4.json" --updates 60 --resume "$tmp/v" --save "$tmp/v.rpw" 2>&1)
if grep -q "^resuming from $tmp/v/ckpt-000000000030.rpc: update 30 (written by 4 workers, 4 stages, local backend)" <<<"$out"
then ok; else bad "resume zb-v: $out"; fi
train --config "$tmp/p4.json" --updates 60 --save "$tmp/p4.rpw" >/dev/null 2>&1
same "zb-v resumed under 1f1b = straight under 1f1b" "$tmp/p4.rpw" "$tmp/v.rpw" 0
# on another layout: four replicas of half the micro-batch
train --config "$tmp/r4.json" --updates 60 --resume "$tmp/a" --save "$tmp/r4.rpw" >/dev/null 2>&1
same "resumed on R 4 = straight on R 2" "$tmp/straight.rpw" "$tmp/r4.rpw" 1e-5
# what changes the mathematics is refused, unless asked
out=$(train --config "$tmp/lr.json" --updates 60 --resume "$tmp/a" 2>&1); rc=$?
if [ $rc = 1 ] && grep -q "optimizer.lr differs from the checkpoint's configuration" <<<"$out"; then ok; else bad "lr change: $rc $out"; fi
if train --config "$tmp/lr.json" --updates 40 --resume "$tmp/a" --resume-anyway >/dev/null 2>&1; then ok; else bad "--resume-anyway"; fi
printf 'input 8 8\nflatten\nlinear 33\nrelu\ndropout 0.1\nlinear 10\nsoftmax_cross_entropy\n' > "$tmp/other.model"
out=$("$bin" train --model "$tmp/other.model" --data "$tmp/idx" --config "$tmp/r2.json" --updates 60 --resume "$tmp/a" 2>&1)
if grep -q "was made for another model than $tmp/other.model" <<<"$out"; then ok; else bad "other model: $out"; fi
# a damaged newest checkpoint is named and the one before used
cp -r "$tmp/a" "$tmp/d"
printf 'XXXX' | dd of="$tmp/d/ckpt-000000000030.rpc" bs=1 seek=500 conv=notrunc 2>/dev/null
out=$(train --config "$tmp/r2.json" --updates 60 --resume "$tmp/d" 2>&1)
if grep -q "ckpt-000000000030.rpc: skipped: .*checksum mismatch" <<<"$out" &&
   grep -q "resuming from $tmp/d/ckpt-000000000020.rpc: update 20" <<<"$out"; then ok; else bad "damaged: $out"; fi
# what it holds, and its weights read directly
out=$("$bin" checkpoint show "$tmp/a")
if grep -q "update              30 (30 optimizer steps, 0 skipped)" <<<"$out" &&
   grep -q "optimizer state     4 tensors, 2410 values" <<<"$out"; then ok; else bad "checkpoint show: $out"; fi
if "$bin" weights show "$tmp/a/ckpt-000000000030.rpc" | grep -q "^1.weight "; then ok; else bad "weights show checkpoint"; fi
# a checkpoint of tensor groups names them
printf 'input 8 8\nflatten\nlinear 32\nrelu\nlinear 10\nsoftmax_cross_entropy\n' > "$tmp/tp.model"
printf '{"micro_batch_size": 8, "tensor_parallel": 2, %s}\n' "$opt" > "$tmp/tp.json"
"$bin" train --model "$tmp/tp.model" --data "$tmp/idx" --config "$tmp/tp.json" --updates 4 \
  --checkpoint-dir "$tmp/tp" --log-every 1000000 >/dev/null 2>&1
out=$("$bin" checkpoint show "$tmp/tp" 2>&1)
if grep -q "written from        2 workers, 1 stage, 1 replica, tensor groups of 2, local backend" <<<"$out"
then ok; else bad "checkpoint show, tensor groups: $out"; fi

# A checkpoint directory holds one run. A new run where an earlier, longer
# run left its checkpoints is refused before any work, and none of them is
# removed (it pruned every checkpoint it wrote, then resumed the other run).
train --config "$tmp/r2.json" --updates 40 --checkpoint-dir "$tmp/p" --checkpoint-every 10 --keep 3 >/dev/null 2>&1
before=$(ls "$tmp/p")
out=$(train --config "$tmp/r2.json" --updates 20 --checkpoint-dir "$tmp/p" --checkpoint-every 5 --keep 1 2>&1); rc=$?
if [ $rc = 1 ] && grep -q "$tmp/p holds checkpoints of another run (the newest: ckpt-000000000040.rpc)" <<<"$out" &&
   ! grep -q "^training" <<<"$out" && [ "$(ls "$tmp/p")" = "$before" ]; then ok; else bad "new run in another's directory: $rc $out; $(ls "$tmp/p")"; fi
# Resumed past a damaged newest with --keep 1: the one resumed from stays,
# the run goes on writing its own, and a later --resume finds its newest.
cp -r "$tmp/a" "$tmp/q"
printf 'XXXX' | dd of="$tmp/q/ckpt-000000000030.rpc" bs=1 seek=500 conv=notrunc 2>/dev/null
out=$(train --config "$tmp/r2.json" --updates 60 --resume "$tmp/q" --checkpoint-dir "$tmp/q" --checkpoint-every 5 \
      --keep 1 --save "$tmp/q.rpw" 2>&1)
if grep -q "resuming from $tmp/q/ckpt-000000000020.rpc" <<<"$out" &&
   [ "$(ls "$tmp/q")" = "$(printf 'ckpt-000000000020.rpc\nckpt-000000000060.rpc')" ]; then ok; else bad "resume past damage, keep 1: $out; $(ls "$tmp/q")"; fi
same "resumed past damage = straight" "$tmp/straight.rpw" "$tmp/q.rpw" 0
if "$bin" checkpoint show "$tmp/q" | grep -q "update              60 "; then ok; else bad "newest after keep 1"; fi
# A path that is a file, and a FIFO among checkpoints (read, it would block).
: > "$tmp/file"
out=$(train --config "$tmp/r2.json" --updates 5 --checkpoint-dir "$tmp/file" 2>&1); rc=$?
if [ $rc = 1 ] && grep -q "$tmp/file: not a directory" <<<"$out" && ! grep -q "^training" <<<"$out"; then ok; else bad "--checkpoint-dir FILE: $rc $out"; fi
cp -r "$tmp/a" "$tmp/f"; mkfifo "$tmp/f/ckpt-999999999999.rpc"; ln -s /dev/zero "$tmp/f/ckpt-999999999998.rpc"
out=$(timeout 20 "$bin" checkpoint show "$tmp/f" 2>&1); rc=$?
if [ $rc = 0 ] && grep -q "ckpt-999999999999.rpc: skipped: .*a FIFO, not a file" <<<"$out" &&
   grep -q "ckpt-999999999998.rpc: skipped: .*a character device" <<<"$out" &&
   grep -q "update              30 " <<<"$out"; then ok; else bad "FIFO and device among checkpoints: $rc $out"; fi
out=$(timeout 20 "$bin" train --model "$tmp/m.model" --data "$tmp/idx" --config "$tmp/r2.json" --updates 40 --resume "$tmp/f" 2>&1); rc=$?
if [ $rc = 0 ] && grep -q "resuming from $tmp/f/ckpt-000000000030.rpc" <<<"$out"; then ok; else bad "resume past a FIFO: $rc $out"; fi
# PipeDream: each stage's optimizer steps are its own (a stage of 4
# replicas steps a quarter as often), and its layout is its mathematics.
pd='"micro_batch_size": 4, "gradient_accumulation_steps": 4, "layers_per_stage": [3, 3], "schedule": "pipedream", "optimizer": {"type": "adam", "lr": 0.003}'
printf '{%s, "stage_replication": [4, 1]}\n' "$pd" > "$tmp/pd41.json"
printf '{%s, "stage_replication": [2, 1]}\n' "$pd" > "$tmp/pd21.json"
train --config "$tmp/pd41.json" --updates 40 --save "$tmp/pd.rpw" >/dev/null 2>&1
train --config "$tmp/pd41.json" --updates 20 --checkpoint-dir "$tmp/pdc" >/dev/null 2>&1
out=$(train --config "$tmp/pd41.json" --updates 40 --resume "$tmp/pdc" --save "$tmp/pdr.rpw" 2>&1)
if grep -q "resuming from $tmp/pdc/ckpt-000000000020.rpc" <<<"$out"; then ok; else bad "pipedream resume: $out"; fi
same "pipedream, Adam, [4, 1]: resumed = straight" "$tmp/pd.rpw" "$tmp/pdr.rpw" 0
out=$(train --config "$tmp/pd21.json" --updates 40 --resume "$tmp/pdc" 2>&1); rc=$?
if [ $rc = 1 ] && grep -q "stage_replication (under schedule pipedream it is part of the mathematics) differs" <<<"$out"; then ok; else bad "pipedream on another layout: $rc $out"; fi
printf '{%s}\n' "$pd" > "$tmp/pd11.json" # 4 steps an update: more steps than updates
train --config "$tmp/pd11.json" --updates 40 --save "$tmp/pd11.rpw" >/dev/null 2>&1
train --config "$tmp/pd11.json" --updates 20 --checkpoint-dir "$tmp/pd11c" >/dev/null 2>&1
out=$(train --config "$tmp/pd11.json" --updates 40 --resume "$tmp/pd11c" --save "$tmp/pd11r.rpw" 2>&1)
if grep -q "resuming from $tmp/pd11c/ckpt-000000000020.rpc" <<<"$out"; then ok; else bad "pipedream [1, 1] resume: $out"; fi
same "pipedream, Adam, [1, 1]: resumed = straight" "$tmp/pd11.rpw" "$tmp/pd11r.rpw" 0
printf '{%s}\n' "${pd/pipedream/pipedream_2bw}" > "$tmp/2bw.json"
out=$(train --config "$tmp/2bw.json" --updates 5 --checkpoint-dir "$tmp/bw" 2>&1); rc=$?
if [ $rc = 1 ] && grep -q "schedule pipedream_2bw keeps two versions of the weights" <<<"$out" &&
   ! grep -q "^training" <<<"$out"; then ok; else bad "2bw with --checkpoint-dir: $rc $out"; fi

# Outputs are checked before training.
out=$(train --config "$tmp/r2.json" --updates 5 --save "$tmp/no/such/dir/w.rpw" 2>&1); rc=$?
if [ $rc = 1 ] && grep -q "\-\-save $tmp/no/such/dir/w.rpw: cannot write in $tmp/no/such/dir" <<<"$out" &&
   ! grep -q "^training" <<<"$out"; then ok; else bad "unwritable --save: $rc $out"; fi

# Runs that are stopped mid-way log each update to a FIFO: the test reads
# as far as it wants, then stops reading, and the run waits on its log (a
# pipe's buffer ahead at most) until the signal, however fast this machine.
# reach FD N: reads lines from fd 3 until one logs update N or later.
reach() { local line; while read -r line <&3; do
  [[ $line =~ ^\{\"update\":([0-9]+), ]] && [ "${BASH_REMATCH[1]}" -ge "$1" ] && return 0; done; return 1; }
# The runs to stop are $long updates: a line of the log is about 100 bytes, so
# a FIFO's 64 KiB holds a run some 650 updates past the last line read, and
# 1000 leave it short of its end when the signal comes (the MPI run below, read
# to update 101, likewise).
long=1000
train --config "$tmp/r2.json" --updates $long --save "$tmp/long.rpw" >/dev/null 2>&1
# running NAME ARGS: a run of $long updates in the background ($pid), logging
# to the FIFO $tmp/NAME.fifo (read on fd 3) and to $tmp/NAME.err, read as far
# as update 5.
running() {
  local name=$1; shift
  mkfifo "$tmp/$name.fifo"
  start --config "$tmp/r2.json" --updates $long --checkpoint-every 1000000 \
    --json-log "$tmp/$name.fifo" --log-every 1 "$@" >/dev/null 2>"$tmp/$name.err" &
  pid=$!
  exec 3<"$tmp/$name.fifo"
  reach 5
}

# SIGINT: the current update finishes, a checkpoint is written, the JSON log
# ends with a whole line, exit 130; resuming finishes the run exactly.
running i --checkpoint-dir "$tmp/i"
kill -INT $pid
cat <&3 > "$tmp/i.log"; exec 3<&-
wait $pid; rc=$?
last=$(tail -1 "$tmp/i.log")
if [ $rc = 130 ] && grep -q '^{"stopped":"SIGINT","update":[0-9]*}$' <<<"$last" &&
   grep -q "stopped by SIGINT after update [0-9]*: a checkpoint of it is written" "$tmp/i.err" &&
   ls "$tmp/i"/ckpt-*.rpc >/dev/null 2>&1; then ok; else bad "SIGINT: exit $rc, last line $last, $(cat "$tmp/i.err")"; fi
n=$(sed -n 's/.*"update":\([0-9]*\)}$/\1/p' <<<"$last")
if [ -n "$n" ] && [ "$n" -lt $long ]; then ok; else bad "SIGINT came after the end ($n)"; fi
train --config "$tmp/r2.json" --updates $long --resume "$tmp/i" --save "$tmp/i.rpw" >/dev/null 2>&1
same "SIGINT, resumed = straight" "$tmp/long.rpw" "$tmp/i.rpw" 0

# Two runs, one directory: the second is refused at once, naming the first;
# the first goes on and its checkpoints are its own.
running t --checkpoint-dir "$tmp/t"
out=$(train --config "$tmp/r2.json" --updates 10 --checkpoint-dir "$tmp/t" 2>&1); rc=$?
kill -INT $pid
cat <&3 >/dev/null; exec 3<&-
wait $pid; rc1=$?
if [ $rc = 1 ] && grep -q "$tmp/t is in use by another run (run [0-9a-f]*, pid $pid on host " <<<"$out" &&
   ! grep -q "^training" <<<"$out" && [ $rc1 = 130 ] && ! [ -e "$tmp/t/repipe.lock" ] &&
   "$bin" checkpoint show "$tmp/t" >/dev/null 2>&1; then ok; else bad "two runs: $rc $out; first: $rc1 $(cat "$tmp/t.err")"; fi

# SIGKILL: nothing but the checkpoints survive; resuming finishes exactly.
mkfifo "$tmp/k.fifo"
start --config "$tmp/r2.json" --updates $long --checkpoint-dir "$tmp/k" --checkpoint-every 200 \
  --json-log "$tmp/k.fifo" --log-every 1 >/dev/null 2>&1 &
pid=$!
exec 3<"$tmp/k.fifo"
reach 201 # past the first checkpoint, which is written behind the training:
for _ in $(seq 600); do [ -e "$tmp/k/ckpt-000000000200.rpc" ] && break; sleep 0.05; done
kill -KILL $pid; exec 3<&-
{ wait $pid; } 2>/dev/null; rc=$?
if [ $rc = 137 ]; then ok; else bad "SIGKILL: exit $rc"; fi
out=$(train --config "$tmp/r2.json" --updates $long --resume "$tmp/k" --save "$tmp/k.rpw" 2>&1)
if grep -q "^resuming from .*: update [1-9][0-9]*00 " <<<"$out"; then ok; else bad "SIGKILL resume: $out"; fi
same "SIGKILL, resumed = straight" "$tmp/long.rpw" "$tmp/k.rpw" 0

# Under MPI: one rank killed ends the job; resuming on ranks equals the
# uninterrupted run on ranks, and resuming on threads agrees within 1e-5.
# The run is long enough that its log, which nobody reads past line 101,
# fills the FIFO (64 KiB) and holds it until the kill.
if [ -n "$mpirun" ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
  mpi() { "$mpirun" --oversubscribe --bind-to none --mca btl self,vader -np 2 "$bin" train \
          --model "$tmp/m.model" --data "$tmp/idx" --log-every 1000000 --backend mpi "$@"; }
  mpi --config "$tmp/r2.json" --updates $long --save "$tmp/mpi.rpw" >/dev/null 2>&1
  mkfifo "$tmp/m.fifo"
  mpi --config "$tmp/r2.json" --updates $long --checkpoint-dir "$tmp/m" --checkpoint-every 100 \
    --json-log "$tmp/m.fifo" --log-every 1 >/dev/null 2>&1 &
  job=$!
  exec 3<"$tmp/m.fifo"
  reach 101
  for _ in $(seq 600); do [ -e "$tmp/m/ckpt-000000000100.rpc" ] && break; sleep 0.05; done
  rank=$(pgrep -f -- "--json-log $tmp/m.fifo" | while read -r p; do
           [ "$(ps -o comm= -p "$p")" = repipe ] && echo "$p"; done | tail -1)
  t0=$(date +%s)
  [ -n "$rank" ] && kill -KILL "$rank"
  exec 3<&-
  wait $job; rc=$?
  t1=$(date +%s)
  if [ -n "$rank" ] && [ $rc != 0 ] && [ $((t1 - t0)) -le 5 ]; then ok; else bad "MPI rank kill: rank '$rank', exit $rc after $((t1 - t0)) s"; fi
  cp -r "$tmp/m" "$tmp/mt" # the killed run's checkpoints, for the threads too
  mpi --config "$tmp/r2.json" --updates $long --resume "$tmp/m" --save "$tmp/m.rpw" >/dev/null 2>&1
  same "MPI rank killed, resumed on ranks = straight on ranks" "$tmp/mpi.rpw" "$tmp/m.rpw" 0
  train --config "$tmp/r2.json" --updates $long --resume "$tmp/mt" --save "$tmp/mt.rpw" >/dev/null 2>&1
  same "MPI checkpoint resumed on threads" "$tmp/mpi.rpw" "$tmp/mt.rpw" 1e-5
fi

summary
