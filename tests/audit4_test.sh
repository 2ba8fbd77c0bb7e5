#!/usr/bin/env bash
# What the fourth outside audit found in the commands, each as it now ends: a
# profile of any accepted shape written whole, bounds said and kept, options
# that do not apply refused by name, names that would break a file refused,
# files written all or none, and sizes that cannot be refused as sizes, not
# as memory. Usage: audit4_test.sh REPIPE SOURCE_DIR
. "$(dirname "$0")/lib.sh"
bin=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
src=$(cd "$2" && pwd)

P="$bin profile"
C="$bin plan --cluster dgx-h100"

# 1. the profile of a large shape is written whole (it wrote past its line
# buffer): every layer and every edge, the file's last line the last edge
"$bin" profile --transformer layers=1000,hidden=1048576,heads=1024,seq=16777216,vocab=16777216 \
  --cluster dgx-h100 --out "$tmp/big.txt" >/dev/null 2>&1
if [ "$(grep -c '^node' "$tmp/big.txt" 2>/dev/null)" = 1003 ] &&
   [ "$(grep -c "$(printf '^\t')" "$tmp/big.txt")" = 1002 ] &&
   tail -1 "$tmp/big.txt" | grep -q "node1001 -- node1002"; then ok
else bad "a profile of 1000 layers of the largest widths written whole"; fi
# ...and on a device whose products reach half their efficiency at 1e-300
printf '{"peak_flops": 1e15, "memory_bytes": 8e10, "memory_bandwidth": 3e12, "gemm_half": 1e-300}' \
  > "$tmp/dev.json"
"$bin" profile --transformer layers=4,hidden=64,heads=4,seq=32,vocab=100 --device "$tmp/dev.json" \
  --out "$tmp/dev.txt" >/dev/null 2>&1
if [ "$(grep -c "$(printf '^\t')" "$tmp/dev.txt" 2>/dev/null)" = 6 ]; then ok
else bad "gemm_half 1e-300: the profile's edges"; fi
# a link of 1e-300 bytes/s is refused, naming the key (malloc aborted)
printf '{"device": "h100-80gb", "per_node": 8, "node_bandwidth": 1e-300, "network_bandwidth": 4e10}' \
  > "$tmp/slow.json"
expect_fail "node_bandwidth 1e-300" 1 '"node_bandwidth" must be a number from 1e\+06' -- \
  $bin plan --cluster "$tmp/slow.json" --devices 8 --global-batch 8 --transformer llama3-8b

# 3. the bounds: 2^17 devices and 2^24 sequences, said where passed
expect_fail "devices past the bound" 2 "devices.*131072" -- \
  $C --devices 262144 --global-batch 1024 --transformer llama3-8b
expect_fail "sequences past the bound" 1 "at most 131072 devices and 16777216 sequences" -- \
  $C --devices 64 --global-batch 33554432 --transformer llama3-8b

# 4. widths whose products would overflow an int are refused as too large
expect_fail "hidden 600000000" 2 "hidden is too large, from 1 to 1048576" -- \
  $P --transformer layers=2,hidden=600000000,heads=2,seq=8,vocab=16 --device h100-80gb --out "$tmp/x"
expect_fail "hidden 4294967296" 2 "hidden is too large" -- \
  $P --transformer layers=2,hidden=4294967296,heads=2,seq=8,vocab=16 --device h100-80gb --out "$tmp/x"

# 5. options accepted and ignored are now taken or refused
# --memory-size plans for less memory than the device's
out=$($C --devices 64 --global-batch 128 --transformer llama3-8b --memory-size 40e9 --json - 2>/dev/null)
if python3 -c "import json,sys; a=json.load(sys.stdin); sys.exit(not a['peak_memory_bytes'] <= 40e9)" <<<"$out"
then ok; else bad "--memory-size 40e9 with --cluster: $out"; fi
# --emit torchtitan --emit-out F writes F
$C --devices 64 --global-batch 128 --transformer llama3-8b --emit torchtitan \
  --emit-out "$tmp/titan.args" >/dev/null 2>&1
if grep -q -- "--parallelism.tensor_parallel_degree" "$tmp/titan.args" 2>/dev/null; then ok
else bad "--emit torchtitan --emit-out with --cluster"; fi
for opt in "--speed 1" "--machines 8" "--bandwidth 1e9" "--memory-constraint" "--objective engine"; do
  expect_fail "$opt with --cluster" 2 "does not apply with --cluster" -- \
    $C --devices 8 --global-batch 8 --transformer llama3-8b $opt
done
"$bin" profile --transformer llama3-8b --cluster dgx-h100 --out "$tmp/l8.txt" >/dev/null 2>&1
expect_fail "--profile beside --transformer" 2 "--profile or --transformer, not both" -- \
  $C --devices 8 --global-batch 8 --transformer llama3-8b --profile "$tmp/l8.txt"
expect_fail "--tp without --cluster, no profile of its groups" 1 "--tp 2: give the profiles measured on a rank of a tensor group of 2" -- \
  $bin plan --profile "$tmp/l8.txt" --machines 2 --tp 2
# --device with --cluster prices that device on the cluster's links
expect_grep "--device v100-32gb --cluster dgx-h100" "on v100-32gb of dgx-h100" -- \
  $P --transformer layers=2,hidden=64,heads=4,seq=32,vocab=100 --device v100-32gb \
  --cluster dgx-h100 --out "$tmp/v.txt"
expect_fail "--repeats with --transformer" 2 "--repeats measures a model" -- \
  $P --transformer llama3-8b --device h100-80gb --repeats 3 --out "$tmp/x"
expect_fail "--alone with --transformer" 2 "--alone measures a model" -- \
  $P --transformer llama3-8b --device h100-80gb --alone --out "$tmp/x"
expect_fail "--model beside --transformer" 2 "--model measures a model" -- \
  $P --transformer llama3-8b --device h100-80gb --model "$src/examples/fmnist-mlp.model" --out "$tmp/x"
expect_fail "--sequence-parallel without --transformer" 2 "it needs --transformer" -- \
  $P --model "$src/examples/fmnist-mlp.model" --sequence-parallel on --out "$tmp/x"
expect_fail "a key given twice" 2 "layers is given twice" -- \
  $P --transformer layers=2,hidden=64,heads=4,seq=32,vocab=100,layers=3 --device h100-80gb --out "$tmp/x"
expect_fail "flash=2" 2 "flash is too large, from 0 to 1" -- \
  $P --transformer layers=2,hidden=64,heads=4,seq=32,vocab=100,flash=2 --device h100-80gb --out "$tmp/x"

# 6. names that would break the JSON or the profile are refused
printf '{"name": "my \\"big\\" cluster", "device": "h100-80gb", "per_node": 8, "node_bandwidth": 3e11, "network_bandwidth": 4e10}' \
  > "$tmp/quoted.json"
expect_fail "a quoted cluster name" 1 '"name" must be text of 1 to 31 printable characters' -- \
  $bin plan --cluster "$tmp/quoted.json" --devices 8 --global-batch 8 --transformer llama3-8b --json -
printf '{"name": "a\\nb", "peak_flops": 1e15, "memory_bytes": 8e10, "memory_bandwidth": 3e12}' \
  > "$tmp/nl.json"
expect_fail "a device name with a newline" 1 '"name" must be text' -- \
  $P --transformer layers=2,hidden=64,heads=4,seq=32,vocab=100 --device "$tmp/nl.json" --out "$tmp/x"

# 7. a cut across a graph's edge (the embedding feeding the head) is not
# called the trainer's: refused, with the edge named
cat > "$tmp/branch.txt" <<'EOF'
node0 -- Input0 micro_batch=2 -- forward_compute_time=0, backward_compute_time=0, activation_size=1024, parameter_size=0
node1 -- tok_embeddings: Embedding -- forward_compute_time=1, backward_compute_time=2, activation_size=65536, parameter_size=4000000
node2 -- layers.0: TransformerBlock -- forward_compute_time=5, backward_compute_time=10, activation_size=65536, parameter_size=1000000
node3 -- layers.1: TransformerBlock -- forward_compute_time=5, backward_compute_time=10, activation_size=65536, parameter_size=1000000
node4 -- layers.2: TransformerBlock -- forward_compute_time=5, backward_compute_time=10, activation_size=65536, parameter_size=1000000
node5 -- lm_head: Linear -- forward_compute_time=3, backward_compute_time=6, activation_size=4096, parameter_size=4000000
	node0 -- node1
	node1 -- node2
	node2 -- node3
	node3 -- node4
	node4 -- node5
	node1 -- node5
EOF
out=$("$bin" plan --profile "$tmp/branch.txt" --machines 2 --global-batch 16 --pp 2 --emit torchtitan 2>&1)
if grep -q "cannot run repipe's plan: torchtitan passes one tensor from a stage to the next" <<<"$out" &&
   grep -q "'tok_embeddings' before it also feeds 'lm_head'" <<<"$out" &&
   ! grep -q "runs repipe's plan" <<<"$out" &&
   grep -q "the trainer can begin a stage at 0 of the 5 layers, too few for pipelines of 2 stages" <<<"$out"
then ok; else bad "a cut across the embedding's edge to the head: $out"; fi

# 9. --emit-out's files: all or none, nothing where not asked
cd "$tmp" || exit 1
"$bin" plan --profile "$src/tests/fixtures/trainers/llama30.txt" --machines 4 --global-batch 32 --pp 4 \
  --emit torchtitan >/dev/null 2>&1
if [ ! -e torchtitan.schedule.csv ] && [ ! -e SETTINGS.schedule.csv ]; then ok
else bad "a schedule CSV written where none was asked for"; fi
echo keep > F
echo keep > F.schedule.csv
mkdir F.config.json
expect_fail "--emit-out whose configuration cannot be written" 1 "F.config.json: is a directory \(nothing written\)" -- \
  "$bin" plan --profile "$src/tests/fixtures/trainers/llama30.txt" --machines 4 --global-batch 32 --pp 4 \
  --emit torchtitan --emit-out F
if [ "$(cat F)" = keep ] && [ "$(cat F.schedule.csv)" = keep ]; then ok
else bad "F and F.schedule.csv overwritten though the command failed"; fi
mkdir D
expect_fail "--emit-out a directory" 1 "D: is a directory \(nothing written\)" -- \
  "$bin" plan --profile "$src/tests/fixtures/trainers/llama30.txt" --machines 4 --global-batch 32 --pp 4 \
  --emit torchtitan --emit-out D
if [ ! -e D.schedule.csv ]; then ok; else bad "D.schedule.csv made beside a directory D"; fi
cd - >/dev/null || exit 1

# 10. sizes that cannot be are said as sizes, not as memory
expect_fail "--tp 3" 1 "--tp 3 must divide" -- $C --devices 24 --global-batch 24 --transformer llama3-8b --tp 3
expect_fail "--pp 30 for 24 layers" 1 "--pp 30: the model has 24 layers" -- \
  $C --devices 60 --global-batch 60 --transformer llama3-8b,layers=24 --pp 30
expect_fail "--micro-batch 8 of 4" 1 "micro-batches of 8 do not divide the global batch of 4" -- \
  $C --devices 8 --global-batch 4 --transformer llama3-8b --micro-batch 8
expect_fail "7 devices, --tp 2" 1 "--tp 2 must divide the 7 devices" -- \
  $C --devices 7 --global-batch 7 --transformer llama3-8b --tp 2
expect_grep "--micro-batch 3" "micro-batches of 3 x" -- \
  $C --devices 8 --global-batch 24 --transformer llama3-8b --micro-batch 3
# micro-batches a pipeline fixed (Galvatron's settle_chunk): the plan has that many
expect_grep "--micro-batches 32" "micro-batches of [0-9]* x 32," -- \
  $C --devices 8 --global-batch 64 --transformer llama3-8b --micro-batches 32
expect_fail "--micro-batches 5 of 64" 1 "--micro-batches 5 does not divide the global batch of 64" -- \
  $C --devices 8 --global-batch 64 --transformer llama3-8b --micro-batches 5
printf 'node0 -- Input0 micro_batch=1 -- forward_compute_time=0, backward_compute_time=0, activation_size=4, parameter_size=0\nnode1 -- fc: Linear -- forward_compute_time=1, backward_compute_time=2, activation_size=64, parameter_size=4096\n\tnode0 -- node1\n' \
  > "$tmp/one.txt"
expect_fail "a 1-layer profile with --pp 2" 1 "pipelines of 2 stages need 2 layers or more; the profile has 1" -- \
  "$bin" plan --profile "$tmp/one.txt" --machines 2 --pp 2 --objective engine --global-batch 8
summary
