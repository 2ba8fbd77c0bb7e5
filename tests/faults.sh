#!/usr/bin/env bash
# A fault campaign: runs killed (SIGKILL) at random moments while they
# checkpoint, on threads and on MPI ranks, then resumed: the newest
# checkpoint always loads, at most two intervals behind the last update
# logged (one interval, and one write under way), and the resumed run ends
# with the uninterrupted run's weights, bit for bit. Two runs started at
# once on one directory: one trains, the other is refused, and the
# directory holds one run's checkpoints. FIFOs and devices wherever repipe
# reads a directory: named and passed over, never waited on.
# Usage: faults.sh REPIPE [MPIRUN] [ROUNDS] [SECONDS]: ROUNDS kills on threads
# and half as many on ranks, no round started once SECONDS have passed
# (`make test` runs 2 rounds; `make soak` as many as its time allows).
. "$(dirname "$0")/lib.sh"
bin=$1
mpirun=${2:-}
rounds=${3:-6}
budget=${4:-100000}
more() { [ "$1" -eq 1 ] || [ "$SECONDS" -lt "$budget" ]; } # the first round always runs
noise_idx "$tmp/idx" 512 64
printf 'input 8 8\nflatten\nlinear 256\nrelu\ndropout 0.1\nlinear 10\nsoftmax_cross_entropy\n' > "$tmp/m.model"
printf '{"micro_batch_size": 8, "gradient_accumulation_steps": 2, "replication_factor": 2, "optimizer": {"type": "adam", "lr": 0.001}}\n' > "$tmp/c.json"
total=3000 every=5
train() { "$bin" train --model "$tmp/m.model" --data "$tmp/idx" --config "$tmp/c.json" --log-every 1 "$@"; }
# the same as the background job itself: $! is repipe, for the kill
start() { exec "$bin" train --model "$tmp/m.model" --data "$tmp/idx" --config "$tmp/c.json" --log-every 1 "$@"; }
mpi() { "$mpirun" --oversubscribe --bind-to none --mca btl self,vader -np 2 "$bin" train --backend mpi \
        --model "$tmp/m.model" --data "$tmp/idx" --config "$tmp/c.json" --log-every 1 "$@"; }
same() { # NAME A B: bit for bit
  if "$bin" weights compare "$2" "$3" --rtol 0 >"$tmp/cmp" 2>&1 && grep -q "^same: 0 tensors" "$tmp/cmp"; then ok
  else bad "$1: $(tail -3 "$tmp/cmp")"; fi
}
# the newest checkpoint loads, close behind what the killed run had logged
behind() { # NAME DIR LOG
  local shown at logged
  shown=$("$bin" checkpoint show "$2" 2>&1)
  at=$(sed -n 's/^  update *\([0-9]*\) .*/\1/p' <<<"$shown")
  logged=$(sed -n 's/^{"update":\([0-9]*\),.*/\1/p' "$3" | tail -1)
  if [ -n "$at" ] && [ -n "$logged" ] && [ "$at" -ge $((logged - 2 * every)) ]; then ok
  else bad "$1: newest checkpoint '$at', last update logged '$logged': $shown"; fi
}
# kill_at SECONDS PID: SIGKILL after a delay
kill_at() { sleep "$1"; kill -KILL "$2" 2>/dev/null; }
delay() { awk -v s="$RANDOM" 'BEGIN { srand(s); printf "%.2f", 0.2 + rand() * 1.5 }'; }

train --updates $total --save "$tmp/straight.rpw" >/dev/null 2>&1
for r in $(seq "$rounds"); do
  more "$r" || break
  d="$tmp/k$r"
  start --updates $total --checkpoint-dir "$d" --checkpoint-every $every --keep 2 \
    --json-log "$tmp/k$r.log" >/dev/null 2>&1 &
  pid=$!
  kill_at "$(delay)" $pid
  wait $pid 2>/dev/null
  [ -e "$d" ] && ls "$d"/ckpt-*.rpc >/dev/null 2>&1 || continue # killed before the first
  behind "threads, round $r" "$d" "$tmp/k$r.log"
  train --updates $total --resume "$d" --checkpoint-dir "$d" --checkpoint-every $every --keep 2 \
    --save "$tmp/k$r.rpw" >"$tmp/k$r.out" 2>&1 || bad "threads, round $r: resume: $(tail -3 "$tmp/k$r.out")"
  same "threads, round $r: killed, resumed = straight" "$tmp/straight.rpw" "$tmp/k$r.rpw"
done

if [ -n "$mpirun" ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
  mpi --updates $total --save "$tmp/mpi.rpw" >/dev/null 2>&1
  for r in $(seq $(( (rounds + 1) / 2 ))); do
    more "$r" || break
    d="$tmp/m$r"
    mpi --updates $total --checkpoint-dir "$d" --checkpoint-every $every --keep 2 \
      --json-log "$tmp/m$r.log" >/dev/null 2>&1 &
    job=$!
    sleep "$(delay)"
    rank=$(pgrep -f -- "--json-log $tmp/m$r.log" | while read -r p; do
             [ "$(ps -o comm= -p "$p")" = repipe ] && echo "$p"; done | shuf -n 1 2>/dev/null)
    [ -n "$rank" ] && kill -KILL "$rank" 2>/dev/null
    wait $job 2>/dev/null
    ls "$d"/ckpt-*.rpc >/dev/null 2>&1 || continue
    behind "MPI, round $r" "$d" "$tmp/m$r.log"
    mpi --updates $total --resume "$d" --checkpoint-dir "$d" --checkpoint-every $every --keep 2 \
      --save "$tmp/m$r.rpw" >"$tmp/m$r.out" 2>&1 || bad "MPI, round $r: resume: $(tail -3 "$tmp/m$r.out")"
    same "MPI, round $r: a rank killed, resumed = straight" "$tmp/mpi.rpw" "$tmp/m$r.rpw"
  done
fi

# Two runs at once on one directory: one trains, one is refused
for r in 1 2 3; do
  d="$tmp/race$r"
  start --updates 40 --checkpoint-dir "$d" --checkpoint-every 10 >"$tmp/ra$r" 2>&1 & a=$!
  start --updates 40 --checkpoint-dir "$d" --checkpoint-every 10 >"$tmp/rb$r" 2>&1 & b=$!
  wait $a; ra=$?; wait $b; rb=$?
  runs=$(for f in "$d"/ckpt-*.rpc; do "$bin" checkpoint show "$f" 2>/dev/null | sed -n 's/^  run *//p'; done | sort -u | wc -l)
  refused=$(cat "$tmp/ra$r" "$tmp/rb$r" | grep -c "is in use by another run\|holds checkpoints of another run")
  if [ $((ra + rb)) = 1 ] && [ "$refused" = 1 ] && [ "$runs" = 1 ]; then ok
  else bad "race $r: exits $ra $rb, $refused refused, $runs runs: $(cat "$tmp/ra$r" "$tmp/rb$r" | grep -v '^update')"; fi
done

# FIFOs and devices where repipe reads a directory: never waited on
mkdir -p "$tmp/fd"; cp "$tmp/idx"/t10k-* "$tmp/fd/"; mkfifo "$tmp/fd/train-images-idx3-ubyte"
cp "$tmp/idx/train-labels-idx1-ubyte" "$tmp/fd/"
out=$(timeout 20 "$bin" train --model "$tmp/m.model" --data "$tmp/fd" --config "$tmp/c.json" --updates 2 2>&1); rc=$?
if [ $rc = 1 ] && grep -q "train-images-idx3-ubyte: a FIFO, not a file" <<<"$out"; then ok; else bad "FIFO in the data directory: $rc $out"; fi
rm "$tmp/fd/train-images-idx3-ubyte"; ln -s /dev/zero "$tmp/fd/train-images-idx3-ubyte"
out=$(timeout 20 "$bin" train --model "$tmp/m.model" --data "$tmp/fd" --config "$tmp/c.json" --updates 2 2>&1); rc=$?
if [ $rc = 1 ] && grep -q "a character device, not a file" <<<"$out"; then ok; else bad "/dev/zero in the data directory: $rc $out"; fi
d="$tmp/k1"; [ -d "$d" ] || d="$tmp/race1"
mkfifo "$d/ckpt-999999999999.rpc"; ln -s /dev/zero "$d/ckpt-999999999998.rpc"; mkdir "$d/ckpt-999999999997.rpc"
out=$(timeout 20 "$bin" train --model "$tmp/m.model" --data "$tmp/idx" --config "$tmp/c.json" --updates $total \
      --resume "$d" 2>&1); rc=$?
if [ $rc = 0 ] && grep -q "ckpt-999999999999.rpc: skipped: .*a FIFO" <<<"$out" &&
   grep -q "ckpt-999999999998.rpc: skipped: .*a character device" <<<"$out" &&
   grep -q "ckpt-999999999997.rpc: skipped: .*a directory" <<<"$out"; then ok; else bad "special files among checkpoints: $rc $out"; fi
printf '{"micro_batch_size": 8, "executable_cache_dir": "%s"}\n' "$tmp/cache" > "$tmp/cc.json"
mkdir -p "$tmp/cache"
"$bin" train --model "$tmp/m.model" --data "$tmp/idx" --config "$tmp/cc.json" --updates 1 >/dev/null 2>&1
for e in "$tmp/cache"/*.rpx; do rm "$e"; mkfifo "$e"; done
out=$(timeout 20 "$bin" train --model "$tmp/m.model" --data "$tmp/idx" --config "$tmp/cc.json" --updates 1 2>&1); rc=$?
if [ $rc = 0 ] && grep -q "executable cache: .* was unreadable (.*a FIFO, not a file.*); rebuilt it" <<<"$out"; then ok; else bad "FIFO in the cache: $rc $out"; fi
summary
