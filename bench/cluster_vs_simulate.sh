#!/usr/bin/env bash
# The simulator against a real network, in one run: ranks in network
# namespaces (scripts/cluster, root needed) on links shaped with tc tbf. An
# MLP of three 1024-wide layers is profiled here ('repipe profile',
# micro-batches of 64); each configuration is predicted ('repipe simulate
# --machines 1 N [S] --bandwidth 2e9 RATE [LINK] --backend mpi': a worker a
# machine, N machines a server on RATE links, S servers joined by LINK) and
# measured (bench_train across the namespaces, the median of ROUNDS runs).
# Each prediction is made twice: with the links' nominal rates, and with the
# latency and bandwidth that a ping-pong over each link measured first
# (bench_comm sweep; TCP/IP's headers and the token bucket's rate in it).
# Rows with a latency (US, 'links' 100mbit+US) add that many microseconds to
# each way of each machine's link (scripts/cluster --latency: a delay line,
# this kernel has no netem); a message crosses two such links, so the nominal
# prediction adds 2 x US to simulate's --latency. They run at 100 Mbit and
# with an MTU of 9000 (scripts/cluster --mtu): the delay line's work is per
# frame, and with 1500-byte frames it took 0.45 of one of this machine's two
# cores, which the ranks then lacked.
# Three sets:
#  1. two ranks, one a core, with Open MPI's TCP default flags (PUT on);
#  2. the same with repipe's (PUT off, what rp_comm_mpi_init sets unless the
#     user chose);
#  3. three and four ranks sharing this machine's cores (uneven stage
#     replication, 2 servers x 2 machines), predicted with --cores N.
# Prints predicted beside measured time per update, each error, and the
# median and worst |error| of each set.
# Usage: bench/cluster_vs_simulate.sh BUILD_DIR [ROUNDS] [--no-put]
# (--no-put leaves out set 1)
default_rounds=3
. "$(dirname "$0")/common.sh"
need_root "scripts/cluster makes network namespaces"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cores=$(nproc)
printf 'input 1 28 28\nflatten\nlinear 1024\nrelu\nlinear 1024\nrelu\nlinear 1024\nrelu\nlinear 10\nsoftmax_cross_entropy\n' > "$tmp/mlp.model"
"$build/repipe" profile --model "$tmp/mlp.model" --micro-batch 64 --out "$tmp/mlp.txt" >/dev/null
med() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
bytes_of() { case $1 in 1gbit) echo 1.25e8 ;; 100mbit) echo 1.25e7 ;; esac; }
declare -A fit_bw fit_lat
mtu_of() { if [ "$1" -gt 0 ]; then echo 9000; else echo 1500; fi; }
for link in 1gbit:0 100mbit:0 100mbit:1000; do
  r=${link%:*} us=${link#*:}
  fit=$(scripts/cluster --rate "$r" --latency "$us" --mtu "$(mtu_of "$us")" --timeout 300 -- -np 2 \
        "$build/bench/bench_comm" sweep 2>/dev/null </dev/null | tee "$tmp/sweep-$link" |
        sed -n 's/^fit latency \([^ ]*\) bandwidth \([^ ]*\)$/\1 \2/p')
  read -r fit_lat[$link] fit_bw[$link] <<<"$fit"
  echo "== ping-pong and allreduce over a $r link, $us us added each way, MTU $(mtu_of "$us") (bench_comm sweep)"
  cat "$tmp/sweep-$link"
  echo
done
# name, servers x machines, machine link (RATE or RATE+US), link between
# servers, R, stage replication, layers, GA, schedule, steps
two="dp 1x2 1gbit - 2 [1] [-1] 1 1f1b 20
dp 1x2 1gbit - 2 [1] [-1] 4 1f1b 10
pipe 1x2 1gbit - 1 [1,1] [5,-1] 4 1f1b 20
pipe 1x2 1gbit - 1 [1,1] [5,-1] 8 1f1b 12
pipe 1x2 1gbit - 1 [1,1] [5,-1] 8 zb-h1 12
dp 1x2 100mbit - 2 [1] [-1] 1 1f1b 6
pipe 1x2 100mbit - 1 [1,1] [5,-1] 4 1f1b 10
pipe 1x2 100mbit - 1 [1,1] [5,-1] 8 1f1b 8
pipe 1x2 100mbit - 1 [1,1] [5,-1] 8 zb-h1 8
pipe 1x2 100mbit - 1 [1,1] [5,-1] 8 zb-h2 8
dp 1x2 100mbit+1000 - 2 [1] [-1] 1 1f1b 6
pipe 1x2 100mbit+1000 - 1 [1,1] [5,-1] 4 1f1b 10
pipe 1x2 100mbit+1000 - 1 [1,1] [5,-1] 8 1f1b 8
pipe 1x2 100mbit+1000 - 1 [1,1] [5,-1] 8 zb-h1 8"
shared="uneven 1x3 1gbit - 1 [2,1] [5,-1] 8 1f1b 8
uneven 1x3 100mbit - 1 [2,1] [5,-1] 8 1f1b 6
dp 2x2 1gbit 100mbit 4 [1] [-1] 1 1f1b 6
r2p2 2x2 1gbit 100mbit 2 [1,1] [5,-1] 4 1f1b 6"
run_set() { # title, cases, extra mpirun arguments...
  local title=$1 cases=$2
  shift 2
  echo "== $title"
  printf '%-6s %-4s %-15s %3s %-6s %9s %9s %9s %8s %8s\n' run net links GA sched nominal fitted \
    measured error "error (fitted)"
  local errors="" errors_fit=""
  while read -r name shape links link R sr layers ga sched steps; do
    local servers=${shape%x*} machines=${shape#*x} cfg="$tmp/c.json"
    local rate=${links%+*} us=0
    [ "$rate" != "$links" ] && us=${links#*+}
    local np=$((servers * machines))
    printf '{"micro_batch_size": 64, "replication_factor": %s, "stage_replication": %s, "layers_per_stage": %s, "gradient_accumulation_steps": %s, "schedule": "%s"}\n' \
      "$R" "$sr" "$layers" "$ga" "$sched" > "$cfg"
    local hier=(--machines 1 "$machines" --bandwidth 2e9 "$(bytes_of "$rate")"
                --latency "$(awk -v u="$us" 'BEGIN { print 2e-5 + 2 * u * 1e-6 }')")
    local net=(--rate "$rate" --latency "$us" --mtu "$(mtu_of "$us")")
    local fitted=(--machines 1 "$machines" --bandwidth 2e9 "${fit_bw[$rate:$us]}"
                  --latency "${fit_lat[$rate:$us]}")
    if [ "$servers" -gt 1 ]; then
      hier=(--machines 1 "$machines" "$servers" --bandwidth 2e9 "$(bytes_of "$rate")" "$(bytes_of "$link")")
      fitted=(--machines 1 "$machines" "$servers" --bandwidth 2e9 "${fit_bw[$rate:0]}" "${fit_bw[$link:0]}"
              --latency "${fit_lat[$link:0]}")
      net+=(--servers "$servers" --machines "$machines" --link-rate "$link")
    else
      net+=(--machines "$machines")
    fi
    if [ "$np" -gt "$cores" ]; then
      hier+=(--cores "$cores")
      fitted+=(--cores "$cores")
    fi
    local pred pfit
    simulate() {
      "$build/repipe" simulate --config "$cfg" --profile "$tmp/mlp.txt" "$@" --backend mpi \
        --json - 2>/dev/null | sed -n 's/.*"seconds_per_update":[[:space:]]*\([0-9.e+-]*\).*/\1/p'
    }
    pred=$(simulate "${hier[@]}")
    pfit=$(simulate "${fitted[@]}")
    : > "$tmp/runs"
    for _ in $(seq "$rounds"); do
      scripts/cluster "${net[@]}" --timeout 600 -- "$@" -np "$np" \
        "$build/bench/bench_train" "$tmp/mlp.model" "$cfg" "$steps" --mpi 2>/dev/null </dev/null |
        sed -n 's/.*"samples_per_s": \([0-9.]*\).*/\1/p' >> "$tmp/runs"
    done
    local line
    line=$(awk -v p="$pred" -v f="$pfit" -v r="$(med < "$tmp/runs")" -v s=$((64 * ga * R)) 'BEGIN {
      m = s / r; printf "%9.1f %9.1f %9.1f %+7.1f%% %+7.1f%%", p * 1e3, f * 1e3, m * 1e3,
                        100 * (p - m) / m, 100 * (f - m) / m }')
    printf '%-6s %-4s %-15s %3s %-6s %s\n' "$name" "$shape" "$links${link#-}" "$ga" "$sched" "$line"
    errors+=$(awk '{ e = $(NF - 1); sub(/%/, "", e); e += 0; print (e < 0 ? -e : e) }' <<<"$line")$'\n'
    errors_fit+=$(awk '{ e = $NF; sub(/%/, "", e); e += 0; print (e < 0 ? -e : e) }' <<<"$line")$'\n'
  done <<<"$cases"
  summarise() {
    sort -g | awk -v what="$1" 'NF { v[++n] = $1 } END {
      printf "%d configurations, %s: median |error| %.1f %%, worst %.1f %%\n", n, what,
             (n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2), v[n] }'
  }
  summarise "nominal rates" <<<"$errors"
  summarise "fitted links" <<<"$errors_fit"
  echo
}
if [ "${3:-}" != --no-put ]; then
  run_set "2 ranks, one a core; btl_tcp_flags Open MPI's default (PUT on)" "$two" \
    --mca btl_tcp_flags send,put,inplace,need-ack,need-csum,hetero-rdma
fi
run_set "2 ranks, one a core; repipe's TCP settings" "$two"
run_set "3 and 4 ranks on $cores cores (simulate --cores $cores); repipe's TCP settings" "$shared"
