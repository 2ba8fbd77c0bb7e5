#!/usr/bin/env bash
# Over real links: ranks in network namespaces on shaped veth links
# (scripts/cluster) train to the same bytes as the same ranks over shared
# memory: a pipeline, data parallelism, a zero-bubble pipeline,
# R = 2 x 2 stages on 2 servers with a slower link between them, and
# data parallelism's sums in buckets during backward and over servers
# (the latter also the threads' bytes), a pipeline over links with added
# latency and lost frames, and one with jumbo frames (the delay line: a 1 KB message takes at least
# the latency its links add); a
# checkpoint written there resumes here to the uninterrupted run's bytes;
# a machine whose link goes down mid-run, a failing job and a job past
# --timeout end; and nothing the fixture made
# (namespace, veth, bridge, process) is left. Skipped, with the reason,
# where the fixture cannot run (not root, no ip netns).
# Usage: cluster_test.sh REPIPE CLUSTER MPIRUN BENCH_COMM
. "$(dirname "$0")/lib.sh"
bin=$1
cluster=$2
mpirun=$3
bench_comm=$4
probe=$("$cluster" -- -np 1 true 2>&1)
rc=$?
if [ $rc = 77 ]; then
  echo "skipped: $(grep '^cluster:' <<<"$probe" | head -1)"
  exit 77
fi
[ $rc = 0 ] || bad "the fixture does not run one rank: $probe"
prefixes=$(sed -n 's/^cluster: \(rp[0-9]*\):.*/\1/p' <<<"$probe")
# each rank on a machine of its own: its own hostname and address
out=$("$cluster" -- -np 2 sh -c 'echo "$(hostname) $(ip -o -4 addr show scope global | wc -l)"' 2>&1)
prefixes+=" $(sed -n 's/^cluster: \(rp[0-9]*\):.*/\1/p' <<<"$out")"
names=$(grep -c "^rp[0-9]*m[01] 1$" <<<"$out")
if [ "$names" = 2 ] && [ "$(grep "^rp[0-9]*m[01] 1$" <<<"$out" | sort -u | wc -l)" = 2 ]; then ok
else bad "two ranks, two machines: $out"; fi
# the delay line: each of the two links a message crosses adds 2 ms, at least
out=$("$cluster" --latency 2000 --timeout 60 -- -np 2 "$bench_comm" pingpong 2>&1)
prefixes+=" $(sed -n 's/^cluster: \(rp[0-9]*\):.*/\1/p' <<<"$out")"
if awk '/^pingpong/ { t = $6 } END { exit !(t >= 4.0) }' <<<"$out"; then ok
else bad "--latency 2000: a 1 KB message one way should take 4 ms or more: $out"; fi
# --mtu: the machine's link carries frames of that size through the delay line
out=$("$cluster" --mtu 9000 --latency 100 --timeout 60 -- -np 1 sh -c 'ip -o link show' 2>&1)
prefixes+=" $(sed -n 's/^cluster: \(rp[0-9]*\):.*/\1/p' <<<"$out")"
if grep -q "rp[0-9]*m0n.* mtu 9000 " <<<"$out"; then ok; else bad "--mtu 9000: $out"; fi
out=$("$cluster" --mtu 100 -- -np 1 true 2>&1)
if [ $? = 2 ] && grep -q "mtu takes a whole number of bytes, 576 to 65521, not '100'" <<<"$out"; then ok
else bad "--mtu 100 should be refused: $out"; fi
# numbers bash would misread (08 is octal to it; 2^64 + 10 wraps to 10, past the
# cap of 9 servers) are refused with the usage, before anything is made
for a in "--machines 08" "--servers 18446744073709551626" "--timeout 99999999999999999999" \
         "--cut 0:08"; do
  # shellcheck disable=SC2086
  "$cluster" $a -- -np 1 true > "$tmp/refused" 2>&1 &
  pid=$!
  wait $pid
  rc=$?
  out=$(cat "$tmp/refused")
  if [ $rc = 2 ] && grep -q "usage: scripts/cluster" <<<"$out" &&
     ! ip netns list | grep -q "^rp${pid}m"; then ok
  else bad "$a should be refused with the usage, leaving nothing: $out"; fi
done
for i in $(seq 300); do printf 'the quick brown fox jumps over the lazy dog. '; done > "$tmp/text.txt"
printf 'input 16\nembedding 256 16\nposition_embedding\ngelu\nlinear 256\nsoftmax_cross_entropy\n' > "$tmp/lm.model"
adam='"optimizer": {"type": "adam", "lr": 0.01}'
printf '{"micro_batch_size": 8, "gradient_accumulation_steps": 4, "layers_per_stage": [2, -1], %s}\n' "$adam" > "$tmp/pipe.json"
printf '{"micro_batch_size": 8, "replication_factor": 2, %s}\n' "$adam" > "$tmp/dp.json"
printf '{"micro_batch_size": 8, "gradient_accumulation_steps": 4, "layers_per_stage": [2, -1], "schedule": "zb-h1", %s}\n' "$adam" > "$tmp/zb.json"
printf '{"micro_batch_size": 4, "gradient_accumulation_steps": 4, "replication_factor": 2, "layers_per_stage": [2, -1], %s}\n' "$adam" > "$tmp/r2p2.json"
cp "$tmp/pipe.json" "$tmp/late.json"
cp "$tmp/pipe.json" "$tmp/jumbo.json"
# data parallelism's sums in buckets during backward (two ranks exchange), and over
# servers of 2 (4 ranks: inside, across, back), with buckets too
printf '{"micro_batch_size": 8, "replication_factor": 2, "reduction_bucket_mb": 0.01, %s}\n' "$adam" > "$tmp/bkt.json"
printf '{"micro_batch_size": 4, "replication_factor": 4, "workers_per_server": 2, "reduction_bucket_mb": 0.01, %s}\n' "$adam" > "$tmp/srv.json"
train() { # where (ns ARGS... | local), ranks, config, more arguments
  local where=$1; shift
  local opts=()
  if [ "$where" = ns ]; then
    while [ "$1" != -- ]; do opts+=("$1"); shift; done
    shift
  fi
  local np=$1 cfg=$2; shift 2
  local cmd=(-np "$np" "$bin" train --model "$tmp/lm.model" --config "$cfg" --text "$tmp/text.txt"
             --log-every 100000 --backend mpi "$@")
  if [ "$where" = ns ]; then
    timeout 300 "$cluster" --timeout 240 "${opts[@]}" -- "${cmd[@]}" 2>&1
  else
    timeout 300 $mpirun --oversubscribe --bind-to none --mca btl self,vader "${cmd[@]}" 2>&1
  fi
}
for c in "pipe 2 --rate 1gbit" "dp 2 --rate 100mbit" "zb 2 --rate 1gbit" \
         "r2p2 4 --servers 2 --machines 2 --rate 1gbit --link-rate 100mbit --link-latency 500" \
         "late 2 --rate 100mbit --latency 1000 --loss 0.5" \
         "jumbo 2 --rate 100mbit --latency 1000 --mtu 9000" \
         "bkt 2 --rate 100mbit" "srv 4 --servers 2 --machines 2 --rate 1gbit --link-rate 100mbit"; do
  set -- $c
  name=$1 np=$2; shift 2
  out=$(train ns "$@" -- "$np" "$tmp/$name.json" --updates 12 --save "$tmp/$name-ns.rpw")
  prefixes+=" $(sed -n 's/^cluster: \(rp[0-9]*\):.*/\1/p' <<<"$out")"
  train local "$np" "$tmp/$name.json" --updates 12 --save "$tmp/$name-local.rpw" >/dev/null
  if [ -s "$tmp/$name-ns.rpw" ] && cmp -s "$tmp/$name-ns.rpw" "$tmp/$name-local.rpw"; then ok
  else bad "$name over namespaces ($*) is not the shared-memory run's bytes: $out"; fi
done
# over servers, the sums are in worker order: the bytes of the same run on threads
"$bin" train --model "$tmp/lm.model" --config "$tmp/srv.json" --text "$tmp/text.txt" \
  --log-every 100000 --updates 12 --save "$tmp/srv-threads.rpw" >/dev/null 2>&1
if cmp -s "$tmp/srv-ns.rpw" "$tmp/srv-threads.rpw"; then ok
else bad "4 ranks on servers of 2 are not the threads' bytes"; fi
# a checkpoint written by namespaced ranks, resumed on this machine
out=$(train ns --rate 1gbit -- 2 "$tmp/pipe.json" --updates 6 --checkpoint-dir "$tmp/ck" --checkpoint-every 6)
prefixes+=" $(sed -n 's/^cluster: \(rp[0-9]*\):.*/\1/p' <<<"$out")"
train local 2 "$tmp/pipe.json" --updates 12 --resume "$tmp/ck" --save "$tmp/resumed.rpw" >/dev/null
if cmp -s "$tmp/resumed.rpw" "$tmp/pipe-local.rpw"; then ok; else bad "resumed from the namespaces' checkpoint: $out"; fi
# a machine that loses its link mid-run: the job ends, with Open MPI's word
# naming the machine, well before --timeout
start=$(date +%s)
out=$(train ns --rate 1gbit --cut 1:3 -- 2 "$tmp/pipe.json" --updates 10000000)
rc=$?
prefixes+=" $(sed -n 's/^cluster: \(rp[0-9]*\):.*/\1/p' <<<"$out")"
took=$(( $(date +%s) - start ))
if [ $rc != 0 ] && [ $rc != 124 ] && [ $took -lt 60 ] && grep -q "cut off after 3 s" <<<"$out" &&
   grep -q "lost communication with a remote daemon" <<<"$out"; then ok
else bad "a machine cut off: exit $rc after $took s: $out"; fi
# a rank that fails, and a job past its time: both end, with mpirun's word
out=$(timeout 120 "$cluster" -- -np 2 sh -c '[ "$OMPI_COMM_WORLD_RANK" = 0 ] || exit 3; sleep 60' 2>&1)
rc=$?
prefixes+=" $(sed -n 's/^cluster: \(rp[0-9]*\):.*/\1/p' <<<"$out")"
if [ $rc != 0 ] && [ $rc != 124 ] && grep -q "non-zero" <<<"$out"; then ok; else bad "a failing rank: exit $rc: $out"; fi
start=$(date +%s)
out=$(timeout 120 "$cluster" --timeout 2 -- -np 2 sleep 60 2>&1)
rc=$?
prefixes+=" $(sed -n 's/^cluster: \(rp[0-9]*\):.*/\1/p' <<<"$out")"
if [ $rc = 124 ] && [ $(( $(date +%s) - start )) -lt 30 ]; then ok; else bad "--timeout: exit $rc: $out"; fi
# --cpu: each server's ranks run in its cgroup (v1's cpu hierarchy or v2's),
# with the share as its CPU quota, and the cgroups are gone afterwards (the
# ranks' /sys is their network namespace's: they name their group, not read it)
out=$(timeout 120 "$cluster" --servers 2 --machines 1 --cpu 1,0.25 -- -np 2 sh -c '
  g=$(sed -n "s/^[0-9]*:\(cpu\|cpu,cpuacct\|cpuacct,cpu\):\(.*\)/\2/p" /proc/self/cgroup)
  [ -n "$g" ] || g=$(sed -n "s/^0::\(.*\)/\1/p" /proc/self/cgroup)
  echo "rank $OMPI_COMM_WORLD_RANK group $g"' 2>&1)
rc=$?
p=$(sed -n 's/^cluster: \(rp[0-9]*\):.*/\1/p' <<<"$out")
prefixes+=" $p"
if [ $rc = 0 ] && [ -n "$p" ] && grep -qx "rank 0 group /${p}s0" <<<"$out" &&
   grep -qx "rank 1 group /${p}s1" <<<"$out" &&
   ! ls /sys/fs/cgroup/cpu /sys/fs/cgroup 2>/dev/null | grep -q "^${p}s"; then ok
else bad "--cpu 1,0.25: exit $rc: $out"; fi
# nothing left of any of them
n=0
for p in $prefixes; do
  n=$((n + 1))
  if ip netns list | grep -q "^$p" || ip -o link | grep -q ": $p"; then bad "$p left behind: $(ip netns list) $(ip -o link | grep ": $p")"; else ok; fi
done
[ "$n" -ge 10 ] && ok || bad "only $n clusters named themselves"
sleep 1
if pgrep -f "$tmp/" >/dev/null; then bad "processes left: $(pgrep -af "$tmp/")"; else ok; fi
summary
