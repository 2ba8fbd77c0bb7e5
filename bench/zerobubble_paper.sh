#!/usr/bin/env bash
# The Zero Bubble paper's Table 5 from its Table 9 with 'repipe simulate':
# for each of its twelve settings (tests/fixtures/zero-bubble) a profile of
# p nodes with the setting's F, B and W (backward_input_time,
# backward_weight_time) and no parameters, p machines whose links delay a
# transfer by its T_comm (--latency; no bytes to send), and 1f1b, zb-h1 and
# zb-h2 simulated; prints each steady bubble rate (what one more update adds
# to a long call: steady_bubble_fraction) beside the paper's, and the worst
# difference. Nothing is measured: this checks the model, in a second.
# Usage: bench/zerobubble_paper.sh BUILD_DIR
default_rounds=1
. "$(dirname "$0")/common.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '%3s %4s  %-15s %-15s %-15s\n' p m "1f1b (paper)" "zb-h1 (paper)" "zb-h2 (paper)"
worst=0
while read -r p m F B W c r1 r2 r3 _; do
  case $p in '#'* | '') continue ;; esac
  awk -v p="$p" -v F="$F" -v B="$B" -v W="$W" 'BEGIN {
    print "node0 -- Input0 -- forward_compute_time=0.000, backward_compute_time=0.000, activation_size=0.000, parameter_size=0.000"
    for (i = 0; i < p; i++)
      printf "node%d -- stage%d backward_input_time=%.3f backward_weight_time=%.3f -- forward_compute_time=%.3f, backward_compute_time=%.3f, activation_size=0.000, parameter_size=0.000\n", i + 1, i, B / 1e3, W / 1e3, F / 1e3, (B + W) / 1e3
    for (i = 0; i < p; i++) printf "\tnode%d -- node%d\n", i, i + 1 }' > "$tmp/profile.txt"
  line=$(printf '%3s %4s' "$p" "$m")
  for k in 1 2 3; do
    sched=$(echo "1f1b zb-h1 zb-h2" | cut -d' ' -f$k)
    paper=$(echo "$r1 $r2 $r3" | cut -d' ' -f$k)
    ones=$(awk -v p="$p" 'BEGIN { for (i = 0; i < p; i++) printf "%s1", i ? ", " : "" }')
    printf '{"micro_batch_size": 1, "gradient_accumulation_steps": %s, "schedule": "%s", "layers_per_stage": [%s]}\n' \
      "$m" "$sched" "$ones" > "$tmp/c.json"
    ours=$("$build/repipe" simulate --profile "$tmp/profile.txt" --config "$tmp/c.json" \
             --machines "$p" --bandwidth 1e15 --latency "${c}e-6" --json - 2>/dev/null |
           sed -n 's/.*"steady_bubble_fraction":[[:space:]]*\([0-9.e+-]*\).*/\1/p')
    line+=$(printf '  %.4f (%.4f)' "$ours" "$paper")
    worst=$(awk -v a="$ours" -v b="$paper" -v w="$worst" 'BEGIN { d = a - b; d = d < 0 ? -d : d; print (d > w ? d : w) }')
  done
  echo "$line"
done < tests/fixtures/zero-bubble/bubble_rates.txt
echo "worst |difference| $worst"
