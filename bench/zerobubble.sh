#!/usr/bin/env bash
# Zero-bubble and interleaved schedules against 1f1b on this machine, in one
# run: two stages of balanced halves (an MLP of six 768-wide layers, and the example GPT with
# its blocks two and two), GA 4 and 8 with one update a host call, and GA 8
# with 4 (device_iterations: a worker starts the next update while the other
# finishes this one), one worker per core. Each
# configuration runs 1f1b, zb-h1, zb-h2, interleaved-1f1b (the same two
# workers holding two chunks each: the MLP's pairs of layers 2, 1, 1, 2 and
# the GPT's blocks 1 each) and zb-v (two chunks each in a V, worker 0 holding
# the first and the last: the MLP's pairs 1, 2, 1, 2 with the flattening
# and the head at the ends, the GPT's blocks 1 each; ordered on the
# profile's pass times).
# A round profiles both models, then runs each configuration's five
# schedules in one bench_interleave process: a session each, called in turn
# (two calls a turn, the second timed: the first brings back the caches the
# other sessions took; each cycle starts at the next schedule), so that the
# machine's drift, which moves a core's speed by several per cent over
# seconds, falls on all five alike. A run's time is its median call; it also
# gives each schedule's median over cycles of its call over 1f1b's in the
# same cycle (paired). ROUNDS rounds; prints the median over rounds of each
# schedule's time per update, its ratio to 1f1b's, the median paired ratio,
# and what 'repipe simulate --cores N' predicts from the rounds' profiles
# (each time the median over the rounds: the profiles see the same drift as
# the runs), with the error of each prediction, the predicted ratio to 1f1b's
# prediction, the floor: the busiest device's own compute under that
# schedule (split backwards cost a little more than whole ones) over 1f1b's
# prediction, below which no order of these passes goes in the model; and,
# for one update a call, the bound: a call starts with the second device
# waiting for the first's forward of micro-batch 0 (the first chunk's), so
# no order of these passes on these stages beats that device's own compute
# plus the wait (nor the first device's compute).
# Usage: bench/zerobubble.sh BUILD_DIR [ROUNDS]
default_rounds=5
. "$(dirname "$0")/common.sh"
cores=$(nproc)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
{
  printf 'input 1 28 28\nflatten\n'
  for _ in 1 2 3 4 5 6; do printf 'linear 768\nrelu\n'; done
  printf 'linear 10\nsoftmax_cross_entropy\n'
} > "$tmp/mlp.model"
# the GPT reads the repository's own text: its documentation, bytes
cat docs/*.md README.md > "$tmp/text.txt"
med() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# the configurations: model file B layers_per_stage updates-a-run data chunks
# (interleaved-1f1b's layers_per_stage) vchunks (zb-v's); a run is
# cycles calls of each schedule, updates / D
specs=("mlp $tmp/mlp.model 64 [7,-1] 24 - [5,2,2,-1] [3,4,2,-1]"
       "gpt examples/gpt-kjv.model 8 [4,-1] 16 $tmp/text.txt [3,1,1,-1] [3,1,1,-1]")
schedules=(1f1b zb-h1 zb-h2 interleaved zb-v)
# zb-v ordered on the model's pass times (its profile's F, B and W summed;
# a layer without parameters all B)
pass_times() { awk '/forward_compute_time/ {
      f = b = w = 0
      if (match($0, /forward_compute_time=[0-9.]+/)) f = substr($0, RSTART + 21, RLENGTH - 21)
      if (match($0, /backward_compute_time=[0-9.]+/)) b = substr($0, RSTART + 22, RLENGTH - 22)
      if (match($0, /backward_input_time=[0-9.]+/)) b = substr($0, RSTART + 20, RLENGTH - 20)
      if (match($0, /backward_weight_time=[0-9.]+/)) w = substr($0, RSTART + 21, RLENGTH - 21)
      F += f; B += b; W += w }
    END { printf "[%.4g, %.4g, %.4g]", F, B, W }' "$1"; }
# the configurations of one model, GA and D
configs() {
  local B=$1 layers=$2 chunks=$3 vchunks=$4 ga=$5 D=$6 times=$7 dir=$8 s
  for s in 1f1b zb-h1 zb-h2; do
    printf '{"micro_batch_size": %s, "layers_per_stage": %s, "gradient_accumulation_steps": %s, "device_iterations": %s, "schedule": "%s"}\n' \
      "$B" "$layers" "$ga" "$D" "$s" > "$dir/$s.json"
  done
  printf '{"micro_batch_size": %s, "layers_per_stage": %s, "gradient_accumulation_steps": %s, "device_iterations": %s, "schedule": "interleaved-1f1b", "virtual_stages": 2}\n' \
    "$B" "$chunks" "$ga" "$D" > "$dir/interleaved.json"
  printf '{"micro_batch_size": %s, "layers_per_stage": %s, "gradient_accumulation_steps": %s, "device_iterations": %s, "schedule": "zb-v", "zb_pass_times": %s}\n' \
    "$B" "$vchunks" "$ga" "$D" "$times" > "$dir/zb-v.json"
}
# each round: both profiles, then every configuration's five schedules
for r in $(seq "$rounds"); do
  "$build/repipe" profile --model "$tmp/mlp.model" --micro-batch 64 --out "$tmp/mlp.$r.txt" >/dev/null
  "$build/repipe" profile --model examples/gpt-kjv.model --micro-batch 8 --out "$tmp/gpt.$r.txt" >/dev/null
  for spec in "${specs[@]}"; do
    set -- $spec
    model=$1 file=$2 B=$3 layers=$4 steps=$5 text=$6 chunks=$7 vchunks=$8
    data=()
    [ "$text" != - ] && data=(--text "$text")
    for gad in "4 1" "8 1" "8 4"; do
      set -- $gad
      ga=$1 D=$2 dir="$tmp/$model-$1-$2"
      mkdir -p "$dir"
      configs "$B" "$layers" "$chunks" "$vchunks" "$ga" "$D" "$(pass_times "$tmp/$model.$r.txt")" "$dir"
      files=()
      for s in "${schedules[@]}"; do files+=("$dir/$s.json"); done
      "$build/bench/bench_interleave" "$file" $((steps / D)) "${data[@]}" --warmup 3 --turn 2 \
        "${files[@]}" </dev/null |
        sed -n 's|.*"config": "[^"]*/\([^"/]*\)\.json", .*"median_call_ms": \([0-9.]*\), "median_ratio": \([0-9.]*\).*|\1 \2 \3|p' |
        while read -r s ms ratio; do
          echo "$ms" >> "$dir/$s.runs"
          echo "$ratio" >> "$dir/$s.paired"
        done
    done
  done
done
# each model's profile: every time the median over the rounds' profiles
for model in mlp gpt; do
  awk '{ line[FNR] = $0; n = split($0, w, /[=, ]/)
         for (i = 1; i <= n; i++) if (w[i] ~ /_time$/) { k = FNR SUBSEP w[i]; c[k]++; v[k, c[k]] = w[i + 1] } }
       END { for (l = 1; l in line; l++) { out = ""; rest = line[l]
               while (match(rest, /[a-z_]+_time=[0-9.]+/)) {
                 kv = substr(rest, RSTART, RLENGTH); eq = index(kv, "="); k = l SUBSEP substr(kv, 1, eq - 1)
                 m = c[k]; for (i = 1; i <= m; i++) x[i] = v[k, i] + 0
                 for (i = 2; i <= m; i++) for (j = i; j > 1 && x[j - 1] > x[j]; j--) { t = x[j]; x[j] = x[j - 1]; x[j - 1] = t }
                 out = out substr(rest, 1, RSTART - 1) substr(kv, 1, eq) sprintf("%.3f", x[int((m + 1) / 2)])
                 rest = substr(rest, RSTART + RLENGTH) }
               print out rest } }' "$tmp/$model".[0-9]*.txt > "$tmp/$model.txt"
done
printf '%-4s %3s %2s %-11s %12s %9s %7s %12s %9s %9s %9s %9s\n' model GA D schedule "measured ms" "vs 1f1b" \
  paired "predicted ms" error "pred. vs" floor bound
# each schedule's waits: before chunk d, the forwards of chunks 0 .. d - 1
# of one micro-batch (seconds, from the profile; chunk sizes in layers)
waits() { awk -v sizes="$1" '
    BEGIN { gsub(/[][ ]/, "", sizes); k = split(sizes, n, ","); c = 1; left = n[1] }
    /forward_compute_time/ && !/Input/ {
      if (left == 0 && c < k) { c++; left = n[c] }
      match($0, /forward_compute_time=[0-9.]+/)
      f[c] += substr($0, RSTART + 21, RLENGTH - 21) / 1e3; left-- }
    END { w = 0; for (i = 1; i <= k; i++) { printf "%s%.6g", (i > 1 ? " " : ""), w; w += f[i] } }' \
    "$2"; }
declare -A wait_of
for spec in "${specs[@]}"; do
  set -- $spec
  model=$1 B=$3 layers=$4 chunks=$7 vchunks=$8
  prof="$tmp/$model.txt"
  wait_of[1f1b]=$(waits "$layers" "$prof") wait_of[interleaved]=$(waits "$chunks" "$prof")
  wait_of[zb-v]=$(waits "$vchunks" "$prof") wait_of[zb-h1]=${wait_of[1f1b]} wait_of[zb-h2]=${wait_of[1f1b]}
  for gad in "4 1" "8 1" "8 4"; do
    set -- $gad
    ga=$1 D=$2 dir="$tmp/$model-$1-$2"
    # the predictions from the median profile (zb-v ordered on its times)
    configs "$B" "$layers" "$chunks" "$vchunks" "$ga" "$D" "$(pass_times "$prof")" "$dir"
    base="" pbase=""
    for s in "${schedules[@]}"; do
      call=$(med < "$dir/$s.runs") paired=$(med < "$dir/$s.paired")
      # the prediction, and its busiest worker's own compute: no order of
      # these passes takes less (the floor; split backwards cost more)
      # (a chunked schedule's workers are its chunks, two a device: interleaved
      # puts stage s on device s mod P, zb-v on s or 2P - 1 - s)
      # (the bound: device d > 0 waits for micro-batch 0's forwards on
      # chunks 0 .. d - 1)
      waits=${wait_of[$s]}
      read -r pred floor bound < <("$build/repipe" simulate --config "$dir/$s.json" --profile "$prof" \
             --cores "$cores" --json - 2>/dev/null | awk -v s="$s" -v waits="$waits" '
        /"seconds_per_update"/ { gsub(/[^0-9.e+-]/, "", $2); t = $2 }
        /"workers"/ { gsub(/[^0-9]/, "", $2); P = (s == "interleaved" || s == "zb-v") ? $2 / 2 : $2 }
        /"stage"/ { gsub(/[^0-9]/, "", $2); st = $2 }
        /"busy_fraction"/ { gsub(/[^0-9.e+-]/, "", $2)
          d = s == "interleaved" ? st % P : s == "zb-v" && st >= P ? 2 * P - 1 - st : st
          busy[d] += $2 }
        END { split(waits, w, " ")
          for (d in busy) { if (busy[d] > b) b = busy[d]
                            if (t * busy[d] + w[d + 1] > x) x = t * busy[d] + w[d + 1] }
          print t, t * b, x }')
      ms=$(awk -v c="$call" -v d="$D" 'BEGIN { printf "%.3f", c / d }')
      [ -z "$base" ] && base=$ms pbase=$pred
      awk -v m="$model" -v g="$ga" -v d="$D" -v s="$s" -v t="$ms" -v b="$base" -v q="$paired" \
          -v p="$pred" -v pb="$pbase" -v f="$floor" -v x="$bound" 'BEGIN {
        printf "%-4s %3s %2s %-11s %12.3f %9.3f %7.3f %12.3f %+8.1f%% %9.3f %9.3f %9s\n", m, g, d, s, t,
               t / b, q, p * 1e3, 100 * (p * 1e3 - t) / t, p / pb, f / pb,
               d == 1 ? sprintf("%.3f", x / pb) : "-" }'
    done
  done
done
# The norm's wait: gradient clipping sums a norm over every worker after the
# reductions, so no stage steps before all have reduced (auto loss scaling's
# overflow check the same); a zero-bubble schedule's last Ws then hold the
# other stage's step. The MLP at GA 8, D 1 and 4, with and without
# "gradient_clipping", under 1f1b and zb-h2, the four in one process a
# round as above.
echo
echo "the norm's wait (gradient_clipping 1): time per update, clipped / unclipped"
printf '%-4s %3s %2s %-11s %12s %12s %9s %12s %9s\n' model GA D schedule "plain ms" "clipped ms" ratio \
  "predicted" "(pred.)"
for D in 1 4; do
  for s in 1f1b zb-h2; do
    for clip in 0 1; do
      extra=""
      [ $clip = 1 ] && extra=', "gradient_clipping": 1'
      printf '{"micro_batch_size": 64, "layers_per_stage": [7,-1], "gradient_accumulation_steps": 8, "device_iterations": %s, "schedule": "%s"%s}\n' \
        "$D" "$s" "$extra" > "$tmp/$s-$clip.json"
      : > "$tmp/$s-$clip.runs"
    done
  done
  for r in $(seq "$rounds"); do
    "$build/bench/bench_interleave" "$tmp/mlp.model" $((24 / D)) --warmup 3 --turn 2 \
      "$tmp/1f1b-0.json" "$tmp/1f1b-1.json" "$tmp/zb-h2-0.json" "$tmp/zb-h2-1.json" </dev/null |
      sed -n 's|.*"config": "[^"]*/\([^"/]*\)\.json", .*"median_call_ms": \([0-9.]*\).*|\1 \2|p' |
      while read -r c ms; do echo "$ms" >> "$tmp/$c.runs"; done
  done
  for s in 1f1b zb-h2; do
    ms0=$(awk -v c="$(med < "$tmp/$s-0.runs")" -v d="$D" 'BEGIN { printf "%.3f", c / d }')
    ms1=$(awk -v c="$(med < "$tmp/$s-1.runs")" -v d="$D" 'BEGIN { printf "%.3f", c / d }')
    p0=$("$build/repipe" simulate --config "$tmp/$s-0.json" --profile "$tmp/mlp.txt" --cores "$cores" \
         --json - 2>/dev/null | sed -n 's/.*"seconds_per_update":[[:space:]]*\([0-9.e+-]*\).*/\1/p')
    p1=$("$build/repipe" simulate --config "$tmp/$s-1.json" --profile "$tmp/mlp.txt" --cores "$cores" \
         --json - 2>/dev/null | sed -n 's/.*"seconds_per_update":[[:space:]]*\([0-9.e+-]*\).*/\1/p')
    awk -v s="$s" -v d="$D" -v a="$ms0" -v b="$ms1" -v p="$p0" -v q="$p1" 'BEGIN {
      printf "%-4s %3s %2s %-11s %12.3f %12.3f %9.3f %12.3f %9.3f\n", "mlp", 8, d, s, a, b, b / a, q * 1e3, q / p }'
  done
done
