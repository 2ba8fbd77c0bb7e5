#!/usr/bin/env bash
# DualPipe and DualPipeV against 1f1b and zb-h1 on this machine's two cores,
# in one run: the example GPT (its blocks two and two) on two devices, one a
# core, micro-batches of 8 windows, 64 windows an update, one update a call:
#   1f1b, zb-h1   stages [4, -1], GA 8
#   dualpipev     chunks [3, 1, 1, -1] in a V (device 0 holding the first and
#                 the last), GA 8
#   dualpipe      stages [4, -1], two replicas in opposite directions over
#                 the same two devices, GA 4 each
# The same 64 windows an update and the same two threads; 1f1b's and
# dualpipe's weights are equal bit for bit (tests/test_dualpipe.c).
# A round profiles the model, then times the four in one bench_interleave
# process (a session each, two calls a turn, the second timed) and asks
# 'repipe simulate --cores 2' for each from that round's profile. ROUNDS
# rounds; prints each round's median call, its paired ratio to 1f1b's and
# the prediction, then the medians over rounds.
# Usage: bench/dualpipe.sh BUILD_DIR [ROUNDS]
default_rounds=3
. "$(dirname "$0")/common.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat docs/*.md README.md > "$tmp/text.txt" # the GPT reads bytes of the repository's own text
conf() { # name stages GA R schedule
  printf '{"micro_batch_size": 8, "layers_per_stage": %s, "gradient_accumulation_steps": %s, "replication_factor": %s, "schedule": "%s"}\n' \
    "$2" "$3" "$4" "$5" > "$tmp/$1.json"
}
conf 1f1b "[4, -1]" 8 1 1f1b
conf zb-h1 "[4, -1]" 8 1 zb-h1
conf dualpipev "[3, 1, 1, -1]" 8 1 dualpipev
conf dualpipe "[4, -1]" 4 2 dualpipe
names=(1f1b zb-h1 dualpipev dualpipe)
med() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
printf '%5s %-10s %12s %8s %13s %7s\n' round schedule "measured ms" paired "predicted ms" error
for r in $(seq "$rounds"); do
  "$build/repipe" profile --model examples/gpt-kjv.model --micro-batch 8 --out "$tmp/gpt.txt" >/dev/null
  files=()
  for s in "${names[@]}"; do files+=("$tmp/$s.json"); done
  "$build/bench/bench_interleave" examples/gpt-kjv.model 16 --text "$tmp/text.txt" --warmup 3 \
    --turn 2 "${files[@]}" </dev/null |
    sed -n 's|.*"config": "[^"]*/\([^"/]*\)\.json", .*"median_call_ms": \([0-9.]*\), "median_ratio": \([0-9.]*\).*|\1 \2 \3|p' |
    while read -r s ms ratio; do
      pred=$("$build/repipe" simulate --profile "$tmp/gpt.txt" --config "$tmp/$s.json" --cores 2 |
             sed -n 's/^predicted time per update *\([0-9.]*\) ms.*/\1/p')
      printf '%5s %-10s %12.1f %8.3f %13.1f %+6.1f%%\n' "$r" "$s" "$ms" "$ratio" "$pred" \
        "$(echo "$pred $ms" | awk '{ print 100 * ($1 - $2) / $2 }')"
      echo "$ms" >> "$tmp/$s.ms"; echo "$ratio" >> "$tmp/$s.ratio"; echo "$pred" >> "$tmp/$s.pred"
    done
done
echo "medians over $rounds rounds:"
for s in "${names[@]}"; do
  printf '%5s %-10s %12.1f %8.3f %13.1f\n' - "$s" "$(med < "$tmp/$s.ms")" "$(med < "$tmp/$s.ratio")" \
    "$(med < "$tmp/$s.pred")"
done
