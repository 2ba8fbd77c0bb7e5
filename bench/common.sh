# Sourced by the bench scripts: the build directory ($1), the rounds ($2, or
# the script's default in $default_rounds), the repository as the working
# directory, and how to run workers: Open MPI as root, oversubscribed over
# shared memory, one BLAS thread per worker.
set -eu
build=${1:-build}
rounds=${2:-$default_rounds}
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
mpirun="mpirun --oversubscribe --bind-to none --mca btl self,vader"
# need_root WHY: the scripts that make namespaces or cgroups say so and stop
need_root() {
  if [ "$(id -u)" != 0 ]; then
    echo "bench/$(basename "$0"): needs root ($1)" >&2
    exit 1
  fi
}
# links_2x2 RATE LINK FILE: scripts/cluster's 2 servers of 2 machines (machine
# links RATE, the servers joined by one link of LINK) as a cluster file. Each
# link is fitted first (a ping-pong, bench_comm sweep): a machine's link to
# the other machine of its server, and the link between servers; the file
# says what a device moves inside its node (the first) and to the other node
# (the second, shared by the server's 2 machines: half of it a device, as
# every device of a DGX has its own adapter where here they share one), with
# the larger latency. Prints the fits.
links_2x2() {
  local fit lat_in bw_in lat_out bw_out
  fit() {
    scripts/cluster "$@" --timeout 300 -- -np 2 "$build/bench/bench_comm" sweep 2>/dev/null \
      </dev/null | sed -n 's/^fit latency \([^ ]*\) bandwidth \([^ ]*\)$/\1 \2/p'
  }
  read -r lat_in bw_in <<<"$(fit --servers 1 --machines 2 --rate "$1")"
  read -r lat_out bw_out <<<"$(fit --servers 2 --machines 1 --rate "$1" --link-rate "$2")"
  echo "inside a server ($1 machine links): latency $lat_in s, bandwidth $bw_in B/s"
  echo "between servers ($2): latency $lat_out s, bandwidth $bw_out B/s"
  python3 - "$bw_in" "$bw_out" "$lat_in" "$lat_out" > "$3" <<'PY'
import json, sys
bw_in, bw_out, lat_in, lat_out = map(float, sys.argv[1:])
json.dump({"name": "namespaces-2x2", "device": "h100-80gb", "per_node": 2,
           "node_bandwidth": bw_in, "network_bandwidth": bw_out / 2,
           "latency": max(lat_in, lat_out)}, sys.stdout)
PY
}
