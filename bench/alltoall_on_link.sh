#!/usr/bin/env bash
# The all-to-all a mixture of experts' expert group runs, over real links,
# beside what the planner prices it at (rp_cluster_all_to_all): 4 ranks on 2
# servers of 2 machines (scripts/cluster, root needed), each machine's link
# RATE [1gbit], the servers joined by one link of LINK [100mbit], as an
# expert group of 4 spans two nodes. The links are measured first (a
# ping-pong's fit, bench_comm sweep: a machine's link to the other machine
# of its server, and the link between servers); the cluster file then says
# what a device moves inside its node (the first) and to the other node
# (the second, shared by the server's 2 machines: half of it a device, as
# every device of a DGX has its own adapter where here they share one),
# with the larger latency. bench_comm alltoall measures 1, 4 and 16 MB a
# rank (median of 7) and prints the prediction beside each; the script
# prints the ratios, median of ROUNDS runs.
# Usage: bench/alltoall_on_link.sh BUILD_DIR [ROUNDS] [RATE] [LINK]
default_rounds=3
. "$(dirname "$0")/common.sh"
rate=${3:-1gbit}
link=${4:-100mbit}
need_root "scripts/cluster makes network namespaces"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
links_2x2 "$rate" "$link" "$tmp/links.json"
for r in $(seq "$rounds"); do
  scripts/cluster --servers 2 --machines 2 --rate "$rate" --link-rate "$link" --timeout 600 -- \
    -np 4 "$build/bench/bench_comm" alltoall "$tmp/links.json" 2>/dev/null </dev/null |
    grep '^alltoall' | tee -a "$tmp/runs"
done
echo "== measured / predicted, median of $rounds runs"
python3 - "$tmp/runs" <<'EOF'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"alltoall\s+(\d+) bytes.*?([\d.]+) ms\s+predicted\s+([\d.]+) ms", line)
    if m:
        rows.setdefault(int(m.group(1)), []).append((float(m.group(2)), float(m.group(3))))
for size, runs in sorted(rows.items()):
    got = statistics.median(r[0] for r in runs)
    want = runs[0][1]
    print("%9d bytes a rank: measured %8.1f ms, predicted %8.1f ms, ratio %.2f"
          % (size, got, want, got / want))
EOF
