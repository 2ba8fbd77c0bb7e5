#!/usr/bin/env bash
# A mixture-of-experts language model's expert all-to-alls over real links,
# beside what the planner prices them at (rp_cluster_all_to_all): 4 MPI ranks
# on 2 servers of 2 machines (scripts/cluster, root needed), each machine's
# link RATE [1gbit], the servers joined by one link of LINK [100mbit], the
# model's experts split over all 4 ranks ("expert_parallel": 4), so each
# all-to-all crosses the servers' link. The links are fitted first, as
# bench/alltoall_on_link.sh does (the same cluster file). 'repipe train
# --trace' then runs UPDATES [6] updates and every rank writes its trace,
# on the host's one monotonic clock (the traces' clock_origin_s); each
# all-to-all's time runs from the last rank's arrival to the last rank's
# end (the earlier ranks' waits are the owners' unequal work, not the
# link). The first update is left out (warm-up). The engine's blocks are
# padded to the most a rank can send (every pair to one owner), so the bytes
# priced are the engine's: a dispatch of 4 x (1 + N K (C + 2)) floats a rank,
# the return and the gradients' 4 x N K C and 4 x N K (C + 2). Prints the
# medians of each of the 4 kinds, measured and predicted, and their ratio,
# the median over ROUNDS runs.
# Usage: bench/moe_on_link.sh BUILD_DIR [ROUNDS] [RATE] [LINK] [UPDATES]
default_rounds=3
. "$(dirname "$0")/common.sh"
rate=${3:-1gbit}
link=${4:-100mbit}
updates=${5:-6}
need_root "scripts/cluster makes network namespaces"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
links_2x2 "$rate" "$link" "$tmp/links.json"
# 32 tokens a sample, C 128, 8 experts of 256, 2 a token; micro-batches of 4: N 128, N K 256
T=32 C=128 B=4 K=2 G=4
cat > "$tmp/moe.model" <<EOF
input $T
x0 = embedding 256 $C std=0.02
rmsnorm
linear $((3 * C)) bias=false
attention heads=4
o = linear $C bias=false
x1 = add < o x0
n = rmsnorm
m = moe experts=8 top_k=$K ffn=256 balance=0.01
add < m x1
rmsnorm
linear 256 bias=false
softmax_cross_entropy
EOF
cat > "$tmp/moe.json" <<EOF
{"micro_batch_size": $B, "gradient_accumulation_steps": 2, "replication_factor": $G,
 "expert_parallel": $G, "optimizer": {"type": "adamw", "lr": 0.001}}
EOF
cat docs/*.md > "$tmp/text.txt"
NK=$((B * T * K))
sizes="$((G * (1 + NK * (C + 2)) * 4)) $((G * NK * C * 4)) $((G * NK * C * 4)) $((G * NK * (C + 2) * 4))"
"$build/bench/bench_comm" price "$tmp/links.json" "$G" 1 $sizes | tee "$tmp/price"
for r in $(seq "$rounds"); do
  rm -f "$tmp"/trace.json.*
  scripts/cluster --servers 2 --machines 2 --rate "$rate" --link-rate "$link" --timeout 600 -- \
    -np "$G" "$build/repipe" train --backend mpi --model "$tmp/moe.model" --config "$tmp/moe.json" \
    --text "$tmp/text.txt" --updates "$updates" --trace "$tmp/trace.json" >/dev/null 2>"$tmp/err" \
    </dev/null || { cat "$tmp/err"; exit 1; }
  python3 - "$tmp/price" "$tmp"/trace.json.* <<'EOF' | tee -a "$tmp/runs"
import json, re, statistics, sys
price = [float(re.search(r"predicted\s+([\d.]+) ms", l).group(1)) for l in open(sys.argv[1])]
ranks = []
for path in sys.argv[2:]:
    t = json.load(open(path))
    o = t["otherData"]["clock_origin_s"]
    ranks.append([(o + e["ts"] / 1e6, o + (e["ts"] + e["dur"]) / 1e6) for e in t["traceEvents"]
                  if e.get("cat") == "expert all-to-all"])
n = min(len(r) for r in ranks)
least = [(max(r[i][1] for r in ranks) - max(r[i][0] for r in ranks)) * 1e3 for i in range(n)]
# one stage: a micro-batch's forward (dispatch, return) then its backward (gradients out,
# back), 4 events in that order; the first update's 2 micro-batches are left out
names = ["dispatch", "return", "gradients out", "gradients back"]
for k in range(4):
    vals = [t for i, t in enumerate(least) if i % 4 == k and i >= 8]
    print("%-15s measured %8.2f ms  predicted %8.2f ms  ratio %.2f"
          % (names[k], statistics.median(vals), price[k], statistics.median(vals) / price[k]))
EOF
done
echo "== measured / predicted, median of $rounds runs"
python3 - "$tmp/runs" <<'EOF'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"(.+?)\s+measured\s+([\d.]+) ms\s+predicted\s+([\d.]+) ms", line)
    if m:
        rows.setdefault(m.group(1), []).append((float(m.group(2)), float(m.group(3))))
for name, runs in rows.items():
    got = statistics.median(r[0] for r in runs)
    print("%-15s measured %8.2f ms, predicted %8.2f ms, ratio %.2f" % (name, got, runs[0][1],
                                                                      got / runs[0][1]))
EOF
