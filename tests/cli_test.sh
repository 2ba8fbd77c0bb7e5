#!/usr/bin/env bash
# End-to-end checks of the repipe command: exact outputs, exit codes and
# messages. Usage: cli_test.sh REPIPE SOURCE_DIR
. "$(dirname "$0")/lib.sh"
bin=$1
src=$2


# expect_out NAME EXPECTED -- CMD...: stdout must equal EXPECTED, exit 0.
expect_out() {
  local name=$1 want=$2; shift 3
  local got; got=$("$@" 2>"$tmp/err"); local rc=$?
  if [ $rc -ne 0 ] || [ "$got" != "$want" ]; then
    bad "$name (exit $rc)"; diff <(echo "$want") <(echo "$got") >&2; cat "$tmp/err" >&2
  else ok; fi
}

# The seed's three tables.
expect_out "groups g=4 s=1" "Group  Replicas
0      0, 1, 2, 3
1      4, 5, 6, 7
2      8, 9, 10, 11
3      12, 13, 14, 15" -- "$bin" groups --replicas 16 --group-size 4 --stride 1
expect_out "groups g=4 s=4" "Group  Replicas
0      0, 4, 8, 12
1      1, 5, 9, 13
2      2, 6, 10, 14
3      3, 7, 11, 15" -- "$bin" groups --replicas 16 --group-size 4 --stride 4
want="Group  Replicas"; for r in $(seq 0 15); do want+=$'\n'"$(printf '%-5d  %d' $r $r)"; done
expect_out "groups g=1" "$want" -- "$bin" groups --replicas 16 --group-size 1
expect_out "groups json" '{"replicas":8,"group_size":2,"stride":2,"num_groups":4,"groups":[[0,2],[1,3],[4,6],[5,7]]}' \
  -- "$bin" groups -r 8 -g 2 -s 2 --json
expect_out "groups default" '{"replicas":4,"group_size":4,"stride":1,"num_groups":1,"groups":[[0,1,2,3]]}' \
  -- "$bin" groups --replicas 4 --json
expect_fail "groups invalid" 1 "8 replicas, group_size=3 \(stride not given: 1\): the number of replicas must be a multiple of stride x group size" \
  -- "$bin" groups --replicas 8 --group-size 3
expect_fail "groups zero stride" 1 "stride=0 group_size=2: the stride must be at least 1" -- "$bin" groups --replicas 8 --group-size 2 --stride 0
# as PopXL: a stride alone groups replicas / stride; a group size of 0 is refused as given
expect_grep "groups stride alone" "1 +1, 3, 5, 7" -- "$bin" groups --replicas 8 --stride 2
expect_fail "groups zero size" 1 "group_size=0 \(stride not given: 1\): the group size must be at least 1" -- "$bin" groups --replicas 8 --group-size 0
expect_grep "groups transpose without a stride" "1 +2, 3, 6, 7" -- "$bin" groups --replicas 8 --stride 2 --group-size 2 --transpose
expect_fail "groups missing" 2 "--replicas is required" -- "$bin" groups
expect_fail "groups bad number" 2 "'x' is not a whole number" -- "$bin" groups --replicas x
expect_fail "unknown option" 2 "unknown option '--bogus'" -- "$bin" groups --bogus
expect_fail "unknown command" 2 "unknown command 'frobnicate'" -- "$bin" frobnicate

# Help comes from the option tables.
expect_grep "help" "groups +print which replicas" -- "$bin" --help
expect_grep "groups help" "--group-size G +replicas per group" -- "$bin" groups --help
expect_grep "config help" "--layers L" -- "$bin" help config

# Configurations.
expect_grep "config show features" "^    fp16 activations and gradients between stages$" -- "$bin" config show "$src/examples/fmnist-fp16.json"
expect_grep "config show workers" "workers needed +4" -- "$bin" config show "$src/examples/pipeline-2x2.json"
expect_grep "config show update" "samples per update +512" -- "$bin" config show "$src/examples/pipeline-2x2.json"
expect_grep "config show wildcard note" "pass --layers L" -- "$bin" config show "$src/examples/pipeline-2x2.json"
printf '{"layers_per_stage": [-1, -1, -1, -1], "schedule": "zb-v", "virtual_stages": 2, "tensor_parallel": 2}\n' > "$tmp/zbv-tp.json"
expect_grep "config show chunked tensor groups" "tensor groups +replicas=4 group_size=2 stride=1 \(2 groups\) over the 4 workers, each the same rank of its chunks' groups" -- "$bin" config show "$tmp/zbv-tp.json"
printf '{"layers_per_stage": [-1, -1, -1, -1], "replication_factor": 2, "gradient_accumulation_steps": 4, "schedule": "dualpipe"}\n' > "$tmp/dualpipe.json"
expect_grep "config show dualpipe" "workers needed +4  \(each holds stage s of one replica and 3 - s of its pair's: dualpipe\)" -- "$bin" config show "$tmp/dualpipe.json"
expect_grep "plan --schedules dualpipe" "two chunks a worker +4 +4 +32 +8 dualpipe " -- "$bin" plan -f "$src/tests/fixtures/pipedream/profiles/alexnet/graph.txt" -n 4 --objective engine --profile-batch 64 --global-batch 512 --schedules 1f1b,dualpipe
# the engine objective in another planner's space: no stage replicated inside a pipeline
# (--straight; unconstrained, the first stage takes three workers), the optimizer state never
# sharded (--sharding none; at this memory the plan shards it)
expect_grep "plan engine replicated stage" "stage_replication \[3, 1\]" -- "$bin" plan -f "$src/tests/fixtures/pipedream/profiles/alexnet/graph.txt" -n 4 --objective engine --profile-batch 64 --global-batch 512
expect_grep "plan engine --straight" "stage_replication \[1, 1, 1, 1\]" -- "$bin" plan -f "$src/tests/fixtures/pipedream/profiles/alexnet/graph.txt" -n 4 --objective engine --profile-batch 64 --global-batch 512 --straight
printf '{"micro_batch_size": 64, "optimizer": {"type": "adam", "lr": 0.001}}\n' > "$tmp/adam.json"
expect_grep "plan engine shards where short" "replicated_tensor_sharding true" -- "$bin" plan -f "$src/tests/fixtures/pipedream/profiles/alexnet/graph.txt" -n 4 --objective engine --global-batch 512 --memory-size 6e8 --base-config "$tmp/adam.json"
expect_fail "plan engine --sharding none" 1 "even with recomputation, the optimizer state whole \(no sharding asked\)" -- "$bin" plan -f "$src/tests/fixtures/pipedream/profiles/alexnet/graph.txt" -n 4 --objective engine --global-batch 512 --memory-size 6e8 --base-config "$tmp/adam.json" --sharding none
expect_grep "plan engine --micro-batch" "replication_factor 2, micro_batch_size 32, gradient_accumulation_steps 8" -- "$bin" plan -f "$src/tests/fixtures/pipedream/profiles/alexnet/graph.txt" -n 4 --objective engine --profile-batch 64 --global-batch 512 --micro-batch 32 --straight --schedules 1f1b
# an exact micro-batch makes its own accumulation, past the 64 the planner otherwise tries
expect_grep "plan engine --micro-batch past 64" "replication_factor 4, micro_batch_size 1, gradient_accumulation_steps 128" -- "$bin" plan -f "$src/tests/fixtures/pipedream/profiles/alexnet/graph.txt" -n 4 --objective engine --profile-batch 64 --global-batch 512 --micro-batch 1 --straight --schedules 1f1b
expect_fail "plan engine --micro-batch none splits" 1 "any accumulation, micro-batches of 7 samples\)" -- "$bin" plan -f "$src/tests/fixtures/pipedream/profiles/alexnet/graph.txt" -n 4 --objective engine --profile-batch 64 --global-batch 512 --micro-batch 7
# where memory is short, recomputation by layer before recomputing every layer (VGG-16 in 1 GB a
# worker: its first stage's cheapest activations made again, 15 layers), and --recompute full
# for the old way; the list reaches --config-out, which config check reads
expect_grep "plan engine recompute by layer" "layers_per_stage \[29, 11\], stage_replication \[3, 1\], recompute_checkpoint_every_layer false, replicated_tensor_sharding false, recompute_layers: 15 layers" -- "$bin" plan -f "$src/tests/fixtures/pipedream/profiles/vgg16/graph.txt" -n 4 --objective engine --profile-batch 64 --global-batch 256 --memory-size 1e9 --sharding none --config-out "$tmp/vgg-layers.json"
if grep -q '"recompute_layers":\[0,1,3,4,6,8,9,11,13,15,16,18,20,22,27\]' <(tr -d ' \n\t' < "$tmp/vgg-layers.json") &&
   "$bin" config check "$tmp/vgg-layers.json" --layers 40 >/dev/null 2>&1 &&
   "$bin" config show "$tmp/vgg-layers.json" | grep -q "the outputs of 15 layers recomputed in backward: 0 1 3 4 6 8 9 11 13 15 16 18 20 22 27$"
then ok; else bad "plan --config-out recompute_layers: $(cat "$tmp/vgg-layers.json")"; fi
expect_grep "plan engine recompute by layer: not rt.Pipeline" "not with PyTorch's rt.Pipeline: it runs neither recompute_layers nor tensor_parallel" -- "$bin" plan -f "$src/tests/fixtures/pipedream/profiles/vgg16/graph.txt" -n 4 --objective engine --profile-batch 64 --global-batch 256 --memory-size 1e9 --sharding none --config-out "$tmp/vgg-layers2.json"
expect_grep "plan engine --recompute full" "layers_per_stage \[29, 11\], stage_replication \[2, 1\], recompute_checkpoint_every_layer true, replicated_tensor_sharding false\$" -- "$bin" plan -f "$src/tests/fixtures/pipedream/profiles/vgg16/graph.txt" -n 4 --objective engine --profile-batch 64 --global-batch 256 --memory-size 1e9 --sharding none --recompute full
# profiles measured on a rank of a tensor group (tensor_parallel= in the Input's description):
# two layers of 4e9 parameter bytes fit 6e9 a worker only split over groups of 2; the plan's
# tensor group is priced from the rank's profile as it is, and repipe simulate agrees
chain2() { # FILE INPUT_WORDS FORWARD_MS BACKWARD_MS PARAMETER_BYTES
  printf 'node0 -- Input0 micro_batch=16%s -- forward_compute_time=0, backward_compute_time=0, activation_size=1000, parameter_size=0\n' "$2" > "$1"
  for l in 1 2; do printf 'node%d -- layer%d -- forward_compute_time=%s, backward_compute_time=%s, activation_size=1e6, parameter_size=%s\n' $l $l "$3" "$4" "$5" >> "$1"; done
  printf '\tnode0 -- node1\n\tnode1 -- node2\n' >> "$1"
}
chain2 "$tmp/t1.txt" "" 10 20 4e9
chain2 "$tmp/t2.txt" " tensor_parallel=2" 6 12 2e9
expect_grep "plan engine tensor groups from a rank's profile" "layers_per_stage \[1, 1\], stage_replication \[1, 1\], recompute_checkpoint_every_layer false, replicated_tensor_sharding false, tensor_parallel 2\$" -- "$bin" plan -f "$tmp/t1.txt" -f "$tmp/t2.txt" -n 4 -b 1e10 --objective engine --global-batch 64 --memory-size 6e9 --config-out "$tmp/tp-measured.json"
expect_grep "simulate a rank's profile" "predicted time per update   275.280 ms" -- "$bin" simulate --profile "$tmp/t2.txt" --config "$tmp/tp-measured.json" --machines 4 --bandwidth 1e10
expect_fail "plan engine --tp 1: nothing fits whole" 1 "no configuration of 4 workers fits 6000000000 bytes per worker" -- "$bin" plan -f "$tmp/t1.txt" -f "$tmp/t2.txt" -n 4 -b 1e10 --objective engine --global-batch 64 --memory-size 6e9 --tp 1
expect_fail "simulate a rank's profile at another tensor size" 1 "the profile was measured on a rank of a tensor group of 2 \(tensor_parallel= in its Input's description\): the configuration's tensor_parallel is 1" -- "$bin" simulate --profile "$tmp/t2.txt" --config "$tmp/adam.json" --machines 4 --bandwidth 1e10
expect_fail "plan: the first profile one worker's" 1 "the first --profile must be measured on one worker" -- "$bin" plan -f "$tmp/t2.txt" -f "$tmp/t1.txt" -n 4 -b 1e10 --objective engine --global-batch 64
expect_fail "plan profile --recompute selective" 2 "--recompute selective with a profile: layers .* or full .*; none, selective and blocks need --cluster" -- "$bin" plan -f "$src/tests/fixtures/pipedream/profiles/vgg16/graph.txt" -n 4 --objective engine --global-batch 256 --recompute selective
expect_fail "plan profile --sharding fsdp" 2 "--sharding fsdp with a profile: none .* or optimizer .*; fsdp needs --cluster" -- "$bin" plan -f "$src/tests/fixtures/pipedream/profiles/alexnet/graph.txt" -n 4 --objective engine --global-batch 512 --sharding fsdp
expect_fail "plan --cluster --schedules dualpipe" 2 "1f1b, interleaved-1f1b and dualpipev" -- "$bin" plan --cluster dgx-a100 --devices 64 --global-batch 512 --transformer layers=32,hidden=4096,heads=32,seq=2048,vocab=51200 --schedules dualpipe
expect_grep "config show layers" "stage 1 +layers 3-6 \(4 layers\)" -- "$bin" config show "$src/examples/pipeline-2x2.json" --layers 7
expect_grep "config show hybrid" "workers needed +16" -- "$bin" config show "$src/examples/hybrid-7-1.json"
expect_grep "config json" '"training":\{"stages":2,"replication_factor":2,"workers":4,"samples_per_micro_batch":1,"samples_per_update":32,"samples_per_host_call":64' \
  -- "$bin" config show "$src/examples/ipu_config.json" --json
# the IPUConfig example against a real model: its layers fit the MLP's
expect_grep "config check --model" "ipu_config.json: ok" -- "$bin" config check "$src/examples/ipu_config.json" \
  --model "$src/examples/fmnist-mlp.model"
printf '{"ipus_per_replica": 4, "layers_per_ipu": [0, 3, 2, 2]}\n' > "$tmp/empty-stage.json"
expect_fail "config check --model empty stage" 1 "with .*fmnist-mlp.model: layers_per_stage: stage 0 has no layers" \
  -- "$bin" config check "$tmp/empty-stage.json" --model "$src/examples/fmnist-mlp.model"
"$bin" config check "$src/examples/ipu_config.json" >/dev/null 2>"$tmp/warn"
if grep -q "'parallelize_kwargs': keyword arguments of a PyTorch model's parallelize()" "$tmp/warn" &&
   grep -q "'enable_half_partials': fp16 partial sums" "$tmp/warn" && [ "$(wc -l < "$tmp/warn")" = 2 ]; then
  ok; else bad "ipu warnings: $(cat "$tmp/warn")"; fi
echo '{"replication_factor": 2, "layers_per_stage": [2, 3]}' > "$tmp/c.json"
expect_fail "config check sum" 1 "hold 5 layers in all but the model has 7" -- "$bin" config check "$tmp/c.json" --layers 7
# PipeDream's -n/-a: the profile's file name for a local graph.txt, or --arch's
cp "$src/tests/fixtures/pipedream/profiles/vgg16/graph.txt" "$tmp/graph.txt"
expect_grep "plan -a from the file" "-n GraphPartitioned -a graph " -- env --chdir="$tmp" "$bin" plan --profile graph.txt --machines 2
expect_grep "plan --arch" "-n Vgg16Partitioned -a vgg16 " -- "$bin" plan --profile "$tmp/graph.txt" --machines 2 --arch vgg16
# --emit: a trainer it knows, --emit-out only with it, schedules by repipe's names, --pp 1 to 8
expect_fail "plan --emit unknown" 2 "--emit: 'deepspeed' is not 'torchtitan' or 'megatron'" -- "$bin" plan --profile "$tmp/graph.txt" --machines 2 --emit deepspeed
expect_fail "plan --emit-out alone" 2 "--emit-out needs --emit torchtitan\|megatron" -- "$bin" plan --profile "$tmp/graph.txt" --machines 2 --emit-out "$tmp/x.args"
expect_fail "plan --schedules unknown" 2 "--schedules: '1F1B' is not one of 1f1b" -- "$bin" plan --profile "$tmp/graph.txt" --machines 2 --schedules zb-h1,1F1B
expect_fail "plan --pp 9" 2 "--pp 9: the engine objective plans pipelines of at most 8 stages" -- "$bin" plan --profile "$tmp/graph.txt" --machines 2 --pp 9
# docs/planner.md's first command prints the tables the page shows under it
out=$(cd "$src" && "$bin" plan --profile tests/fixtures/pipedream/profiles/vgg16/graph.txt \
        --machines 8 2 --bandwidth 4294967296 2147483648 --activation-compression 1 2>&1 |
      sed 's/[[:space:]]*$//')
shown=$(sed -n '/^The command above prints:/,/^- `states a-b`/p' "$src/docs/planner.md" |
        grep -E '^      (stage|[0-9])' | sed 's/^    //')
missing=$(while IFS= read -r line; do
            grep -qxF -- "$line" <<<"$out" || echo "$line"
          done <<<"$shown")
if [ -n "$shown" ] && [ -z "$missing" ]; then ok
else bad "docs/planner.md's first output is not what its command prints: $missing"; fi
# docs/simulate.md's memory example prints the numbers the page shows (bytes,
# whatever the machine's speed)
shown=$(tr '\n' ' ' <"$src/docs/simulate.md" | grep -o 'lays it out): [0-9. ]*`' | tr -d '`')
echo '{"micro_batch_size": 4, "gradient_accumulation_steps": 4, "layers_per_stage": [4, -1],
       "optimizer": {"type": "adamw", "lr": 0.001}}' > "$tmp/mem.json"
"$bin" profile --model "$src/examples/gpt-kjv.model" --micro-batch 4 --out "$tmp/gptmem.txt" >/dev/null 2>&1
printed=$("$bin" simulate --profile "$tmp/gptmem.txt" --config "$tmp/mem.json" 2>&1 | grep -o 'lays it out): [0-9. ]*')
totals=$(cd "$src" && "$bin" train --model examples/gpt-kjv.model --config "$tmp/mem.json" --text README.md \
           --updates 1 2>&1 | awk '$1 ~ /^[01]$/ && NF == 7 { printf "`%s` ", $7 }')
if [ -n "$shown" ] && [ "$(echo $shown)" = "$(echo $printed)" ] &&
   grep -qF "totals of $(echo $totals | sed 's/ / and /')" <(tr '\n' ' ' <"$src/docs/simulate.md")
then ok; else bad "docs/simulate.md's memory example: page '$shown', printed '$printed', train's totals $totals"; fi
# dualpipe from the command: 1f1b's weights with the same two replicas, bit for
# bit, and a trace whose tracks name each device's stage of each replica
for s in 1f1b dualpipe; do
  printf '{"micro_batch_size": 2, "gradient_accumulation_steps": 4, "replication_factor": 2, "layers_per_stage": [-1, -1, -1, -1], "schedule": "%s"}\n' $s > "$tmp/dp-$s.json"
  (cd "$src" && "$bin" train --model examples/gpt-kjv.model --config "$tmp/dp-$s.json" --text README.md \
     --updates 2 --save "$tmp/dp-$s.rpw" --trace "$tmp/dp-$s.trace" >"$tmp/dp-$s.out" 2>&1)
done
if cmp -s "$tmp/dp-1f1b.rpw" "$tmp/dp-dualpipe.rpw" &&
   grep -q '"worker 1: stages 1 of replica 0, 2 of replica 1 (dualpipe)"' "$tmp/dp-dualpipe.trace"
then ok; else bad "dualpipe train: $(cat "$tmp/dp-dualpipe.out")"; fi
# a profile with batch normalisation plans micro-batches of 2 or more: one sample
# a micro-batch has no variance where a plane is one value, and train refuses it
"$bin" plan --profile "$src/tests/fixtures/pipedream/profiles/resnet18/graph.txt" --machines 2 2 \
  --profile-batch 1 --global-batch 4 --config-out "$tmp/bn.json" > "$tmp/bn.out" 2>&1
if grep -q "normalises by a micro-batch's statistics" "$tmp/bn.out" &&
   grep -q '"micro_batch_size":[[:space:]]*[2-9]' "$tmp/bn.json"; then ok
else bad "a batchnorm profile planned micro-batches of 1: $(cat "$tmp/bn.out")"; fi
# The command links no MPI library (plan and config start light); the MPI
# backend is a module it loads for --backend mpi, and a copy of the command
# without it says where it looked
if command -v ldd >/dev/null; then
  if ! ldd "$bin" | grep -q libmpi; then ok; else bad "the command links libmpi: $(ldd "$bin")"; fi
  # nor cJSON: the library opens it when a command first reads or writes JSON
  if ! ldd "$bin" | grep -q libcjson; then ok; else bad "the command links libcjson: $(ldd "$bin")"; fi
fi
expect_fail "no cJSON library" 1 "cannot load the cJSON library $tmp/none.so" -- \
  env REPIPE_CJSON_LIBRARY="$tmp/none.so" "$bin" config show "$src/examples/fmnist.json"
cp "$bin" "$tmp/repipe-alone"
expect_fail "no MPI module" 1 "the MPI backend librepipe_mpi.so is not at $tmp/librepipe_mpi.so" -- \
  "$tmp/repipe-alone" train --model "$src/examples/fmnist-mlp.model" --config "$src/examples/fmnist.json" \
  --data "$tmp/fm160" --backend mpi --updates 1
# every example model and torchvision's resnet18 as repipe.torch exported it
# (batch normalisation throughout): profiled, planned by the engine objective,
# and the plan trained, on 160 Fashion-MNIST images (tests/torch/fmnist160,
# its own test set here); a plan that train refuses is a planner's defect
mkdir -p "$tmp/fm160"
for k in images-idx3 labels-idx1; do
  for set in train t10k; do ln -sf "$src/tests/torch/fmnist160/train-$k-ubyte.gz" "$tmp/fm160/$set-$k-ubyte.gz"; done
done
examples=(examples/fmnist-mlp examples/fmnist-cnn examples/fmnist-resnet examples/gpt-kjv
          examples/llama-kjv tests/torch/resnet18)
[ "${REPIPE_CLI_EXAMPLES:-1}" = 0 ] && examples=(examples/fmnist-mlp)
for m in "${examples[@]}"; do
  data=(--data "$tmp/fm160"); case $m in *gpt-*|*llama-*) data=(--text "$src/README.md");; esac
  if "$bin" profile --model "$src/$m.model" --micro-batch 4 --repeats 1 --out "$tmp/ex.txt" >/dev/null 2>&1 &&
     "$bin" plan --profile "$tmp/ex.txt" --machines 2 2 --objective engine --global-batch 16 \
       --config-out "$tmp/ex.json" >"$tmp/ex.out" 2>&1 &&
     "$bin" train --model "$src/$m.model" --config "$tmp/ex.json" "${data[@]}" --updates 1 >"$tmp/ex.out" 2>&1
  then ok; else bad "$m: profile, plan, train: $(tail -3 "$tmp/ex.out")"; fi
done
# docs/planner.md's two V100s and an A100 (devices of several kinds): with two
# stages the plan replicates the first on the V100s, and says what it gains
# over the plan for equal devices
T=layers=48,hidden=1600,heads=25,seq=1024,vocab=50257
"$bin" profile --transformer $T --device v100-32gb --micro-batch 1 --out "$tmp/v100.txt" >/dev/null 2>&1
out=$("$bin" plan --profile "$tmp/v100.txt" --machines 3 --bandwidth 1.25e9 --speed 1 1 2.41 \
        --memory-size 32e9 32e9 80e9 --global-batch 64 --pp 2 2>&1)
if grep -q "layers_per_stage \[15, 35\], stage_replication \[2, 1\]" <<<"$out" &&
   grep -q "predicted 1.18x as fast as the plan for devices all alike (5.3222 s against 6.2538 s" <<<"$out" &&
   grep -qF "(\`stage_replication [2, 1]\`, zb-auto, micro-batches of 1, GA 64): 5.32 s" "$src/docs/planner.md"
then ok; else bad "docs/planner.md's V100s and A100: $out"; fi
expect_fail "speed count" 2 "--speed: 2 values for 3 machines" -- "$bin" plan --profile "$tmp/v100.txt" \
  --machines 3 --speed 1 2
# DualPipeV in the plan at scale, where asked for (not a Megatron-LM schedule):
# a 39B GPT on 128 GPUs plans its V, which beats the default's plan (one stage of
# 32 replicas, attention's core recomputed)
out=$("$bin" plan --cluster dgx-a100 --devices 128 --global-batch 512 \
        --transformer layers=48,hidden=8192,heads=64,seq=2048,vocab=51200 \
        --schedules 1f1b,interleaved-1f1b,dualpipev 2>&1)
if grep -q "4 pipeline ranks of 2 chunks each (dualpipev), 8 replicas" <<<"$out" &&
   grep -q "predicted 10.455 s an update" <<<"$out" && grep -q "Megatron-LM has no DualPipeV" <<<"$out" &&
   "$bin" plan --cluster dgx-a100 --devices 128 --global-batch 512 \
     --transformer layers=48,hidden=8192,heads=64,seq=2048,vocab=51200 2>&1 |
     grep -q "1 pipeline rank (1f1b), 32 replicas.*predicted 10.594 s" -z
then ok; else bad "dualpipev at scale: $out"; fi
# OpenBLAS is opened on first use: plan never loads it, train does, and a
# BLAS that cannot be loaded is an error naming it, before any work
if LD_DEBUG=files "$bin" plan --profile "$tmp/ex.txt" --machines 2 2 2>&1 >/dev/null | grep -q openblas
then bad "plan loaded OpenBLAS"; else ok; fi
if LD_DEBUG=files "$bin" train --model "$src/examples/fmnist-mlp.model" --config "$src/examples/fmnist.json" \
     --data "$tmp/fm160" --updates 1 2>&1 >/dev/null | grep -q 'openblas.*dynamically loaded by'
then ok; else bad "train did not load OpenBLAS on use"; fi
REPIPE_BLAS_LIBRARY="$tmp/no-blas.so" expect_fail "no BLAS" 1 \
  "cannot load the BLAS library $tmp/no-blas.so: .*REPIPE_BLAS_LIBRARY" -- \
  "$bin" train --model "$src/examples/fmnist-mlp.model" --config "$src/examples/fmnist.json" \
  --data "$tmp/fm160" --updates 1
# Optimum Graphcore's BERT-base file on a transformer of its 12 blocks: the
# embeddings alone on stage 0, four blocks on each other stage, the head on the
# last; on the 4-block LLaMA, BERT-large's list leaves a stage empty, and says
# that it counts blocks
{ echo "input 16"; echo "embedding 64 16"; echo position_embedding
  for i in $(seq 12); do echo "transformer_block heads=2"; done
  echo layernorm; echo "linear 64 bias=false"; echo softmax_cross_entropy; } > "$tmp/gpt12.model"
hub="$src/tests/fixtures/optimum-graphcore/hub"
out=$("$bin" config show "$hub/Graphcore_bert-base-uncased_ipu_config.json" --model "$tmp/gpt12.model" 2>/dev/null)
if grep -q "stage 0   layers 0-1 (2 layers)" <<<"$out" && grep -q "stage 1   layers 2-5 (4 layers)" <<<"$out" &&
   grep -q "stage 3   layers 10-16 (7 layers)" <<<"$out"; then ok; else bad "hub BERT-base on 12 blocks: $out"; fi
expect_fail "hub BERT-large on 4 blocks" 1 "stage 2 has no layers.*count the model's 4 blocks" -- \
  "$bin" config check "$hub/Graphcore_bert-large-uncased_ipu_config.json" --model "$src/examples/llama-kjv.model"
# what train refuses without the model, config check and show refuse by the same
# rule: 4 stages are no whole number of workers at 3 chunks each, and 10^9 chunks
for v in 3 1000000000; do
  printf '{"layers_per_stage": [1, 2, 2, 2], "schedule": "interleaved-1f1b", "virtual_stages": %s, "gradient_accumulation_steps": 4}' \
    "$v" > "$tmp/il.json"
  expect_fail "config check interleaved v $v" 1 "virtual_stages" -- "$bin" config check "$tmp/il.json" --layers 7
  expect_fail "config show interleaved v $v" 1 "virtual_stages" -- "$bin" config show "$tmp/il.json" --layers 7
done
echo '{"replicaton_factor": 2}' > "$tmp/typo.json"
expect_fail "config typo" 1 "unknown key 'replicaton_factor' \(did you mean 'replication_factor'\?\)" -- "$bin" config check "$tmp/typo.json"
expect_fail "config missing" 1 "cannot open" -- "$bin" config show "$tmp/none.json"
expect_fail "config usage" 2 "expected 'show FILE'" -- "$bin" config frob x

# The planner on the seed case.
vgg="$src/tests/fixtures/pipedream/profiles/vgg16/graph.txt"
out=$("$bin" plan --profile "$vgg" --machines 8 2 --bandwidth 4294967296 2147483648 \
      --activation-compression 1 --json "$tmp/plan.json" --graph-out "$tmp/g.txt" \
      --pipedream-conf "$tmp/conf.json")
if grep -q "stage 0: 14 workers — ranks 0–6 and 8–14" <<<"$out" &&
   grep -q "stage 1: 2 workers — ranks 7 and 15" <<<"$out" &&
   grep -q -- "--stage_to_num_ranks_map 0:14,1:2" <<<"$out"; then ok; else bad "plan seed text: $out"; fi
if grep -q '"stage_to_num_ranks":	\[14, 2\]' "$tmp/plan.json" &&
   grep -q '"module_to_stage_map":	\[0, 1, 1\]' "$tmp/conf.json" &&
   grep -q 'node26 -- .* -- stage_id=1$' "$tmp/g.txt" && grep -q 'node1 -- Input.* -- stage_id=0$' "$tmp/g.txt"
then ok; else bad "plan seed files"; fi
# the written profile plans to the same result
"$bin" plan --profile "$tmp/g.txt" --machines 8 2 --bandwidth 4294967296 2147483648 \
  --activation-compression 1 --json "$tmp/plan2.json" >/dev/null
if cmp -s "$tmp/plan.json" "$tmp/plan2.json"; then ok; else bad "plan of the written profile differs"; fi
printf 'a -- A -- forward_compute_time=1, backward_compute_time=1, activation_size=1, parameter_size=1\n\ta -- zz\n' > "$tmp/bad.txt"
expect_fail "plan bad profile" 1 "bad.txt:2: the edge names an unknown node 'zz'" -- "$bin" plan --profile "$tmp/bad.txt" --machines 2
expect_fail "plan bandwidth count" 2 "--bandwidth has 1 value but --machines has 2 levels" -- "$bin" plan --profile "$tmp/bad.txt" --machines 2 2 --bandwidth 1e9
expect_fail "plan needs profile" 2 "--profile and --machines are required" -- "$bin" plan --machines 2
expect_grep "plan help" "--fewer-machines +allow plans" -- "$bin" plan --help

# Training, weight files (skipped without Fashion-MNIST).
if [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  out=$("$bin" train --model "$src/examples/fmnist-mlp.model" --config "$src/examples/fmnist.json" \
        --updates 30 --log-every 10 --save "$tmp/a.rpw" --json-log "$tmp/log.jsonl" 2>&1)
  if grep -q "^update 30/30" <<<"$out" && grep -qE "^test accuracy: 0\.[0-9]{4}$" <<<"$out"; then ok; else bad "train: $out"; fi
  if [ "$(grep -c '"update"' "$tmp/log.jsonl")" = 3 ] && grep -q '"eval":"test","samples":10000,"accuracy"' "$tmp/log.jsonl"; then ok; else bad "json log: $(cat "$tmp/log.jsonl")"; fi
  "$bin" train --model "$src/examples/fmnist-mlp.model" --config "$src/examples/fmnist.json" \
        --updates 30 --save "$tmp/b.rpw" >/dev/null 2>&1
  expect_grep "weights compare same" "^same: 0 tensors outside rtol" -- "$bin" weights compare "$tmp/a.rpw" "$tmp/b.rpw"
  "$bin" train --model "$src/examples/fmnist-mlp.model" --config "$src/examples/fmnist.json" \
        --updates 31 --save "$tmp/c.rpw" >/dev/null 2>&1
  "$bin" weights compare "$tmp/a.rpw" "$tmp/c.rpw" > "$tmp/cmp.txt"; rc=$?
  if [ $rc = 1 ] && grep -q "DIFFERENT: 6 tensors outside rtol" "$tmp/cmp.txt"; then ok; else bad "compare (exit $rc): $(cat "$tmp/cmp.txt")"; fi
  expect_grep "weights show" "^1.weight +512x784 +1 +401408" -- "$bin" weights show "$tmp/a.rpw"
  # resuming from saved weights starts where the file left off
  out=$("$bin" train --model "$src/examples/fmnist-mlp.model" --config "$src/examples/fmnist.json" \
        --updates 1 --load "$tmp/a.rpw" 2>&1)
  if grep -q "test accuracy" <<<"$out"; then ok; else bad "train --load: $out"; fi
  head -c 100 "$tmp/a.rpw" > "$tmp/cut.rpw"
  expect_fail "weights truncated" 1 "cut.rpw: checksum mismatch" -- "$bin" weights show "$tmp/cut.rpw"
  expect_fail "train bad model" 1 "bad.model:2: unknown layer 'lineer' \(did you mean 'linear'\?\)" \
    -- bash -c "printf 'input 784\nlineer 10\n' > '$tmp/bad.model'; '$bin' train --model '$tmp/bad.model' --config '$src/examples/fmnist.json'"
  # loss scaling is logged, on the terminal's lines and in the JSON log
  out=$("$bin" train --model "$src/examples/fmnist-mlp.model" --config "$src/examples/fmnist-fp16.json" \
        --updates 20 --log-every 10 --json-log "$tmp/ls.jsonl" 2>&1)
  if grep -q "^update 20/20 .* loss scale 65536 (0 skipped)  lr 0.05$" <<<"$out" &&
     grep -q "^loss scaling: 0 updates skipped (gradients not finite); the scale is now 65536$" <<<"$out" &&
     grep -q '"loss_scale":65536,"skipped_updates":0,"lr":0.05}' "$tmp/ls.jsonl"; then ok; else bad "loss scale log: $out"; fi
  # the learning rate of a schedule, and the norm clipping saw
  printf '{"micro_batch_size": 64, "gradient_clipping": 1, "lr_schedule": {"type": "step", "step_updates": 5, "gamma": 0.5}}\n' > "$tmp/sched.json"
  out=$("$bin" train --model "$src/examples/fmnist-mlp.model" --config "$tmp/sched.json" --updates 12 --log-every 6 2>&1)
  if grep -q "^update 12/12 .*  lr 0.0125  grad norm [0-9.]*$" <<<"$out"; then ok; else bad "schedule log: $out"; fi
  # executable cache: stored on the first start, reused on the second, also under MPI
  printf '{"micro_batch_size": 64, "layers_per_stage": [-1, -1], "executable_cache_dir": "%s"}' \
    "$tmp/cache" > "$tmp/cached.json"
  expect_grep "cache stored" "^executable cache: stored $tmp/cache/[0-9a-f]{16}\.rpx$" -- "$bin" train \
    --model "$src/examples/fmnist-mlp.model" --config "$tmp/cached.json" --updates 2
  expect_grep "cache reused" "^executable cache: reused the schedule and memory plan in $tmp/cache/" \
    -- "$bin" train --model "$src/examples/fmnist-mlp.model" --config "$tmp/cached.json" --updates 2
  printf 'input 10 10\nflatten\nlinear 10\nsoftmax_cross_entropy\n' > "$tmp/small.model"
  expect_fail "train input mismatch" 1 "the training set of .*: its samples are 1x28x28 but the model's input is 10x10" \
    -- "$bin" train --model "$tmp/small.model" --config "$src/examples/fmnist.json" --updates 1
else
  echo "SKIP: training checks (no Fashion-MNIST)"
fi

# Test images of another size than the training images: refused before any
# work (they were read past their end).
mkdir -p "$tmp/idx"
byte() { printf "\\x$(printf %02x "$1")"; }
u32() { printf '\x00\x00\x00'; byte "$1"; }
idx() { # FILE NDIM N [ROWS COLS]: an IDX file of zeros
  { printf '\x00\x00\x08'; byte "$2"; u32 "$3"
    n=$3; if [ $# -gt 3 ]; then u32 "$4"; u32 "$5"; n=$(($3 * $4 * $5)); fi
    head -c "$n" /dev/zero; } > "$tmp/idx/$1"
}
idx train-images-idx3-ubyte 3 4 4 4; idx train-labels-idx1-ubyte 1 4
idx t10k-images-idx3-ubyte 3 4 5 5; idx t10k-labels-idx1-ubyte 1 4
printf 'input 4 4\nflatten\nlinear 2\nsoftmax_cross_entropy\n' > "$tmp/tiny.model"
printf '{"micro_batch_size": 2}\n' > "$tmp/tiny.json"
expect_fail "train test-set shape" 1 "the test set of $tmp/idx: its samples are 1x5x5 but the model's input is 4x4" \
  -- "$bin" train --model "$tmp/tiny.model" --config "$tmp/tiny.json" --data "$tmp/idx" --updates 1

expect_fail "option did you mean" 2 "unknown option '--bandwith': did you mean '--bandwidth'\\?" -- \
  "$bin" plan --profile "$vgg" --machines 2 --bandwith 1e9
expect_fail "mpirun without --backend mpi" 1 "started by mpirun as one of 4 processes, but with the local backend" \
  -- env OMPI_COMM_WORLD_SIZE=4 "$bin" train --model "$tmp/tiny.model" --config "$tmp/tiny.json" --data "$tmp/idx" --updates 1
# A gzip bomb: a header of 4 images and 64 MiB of zeros behind it is read only
# as far as its header declares.
mkdir -p "$tmp/bomb"
cp "$tmp/idx/"*labels* "$tmp/idx/t10k-images-idx3-ubyte" "$tmp/bomb/"
{ printf '\x00\x00\x08\x03'; u32 4; u32 4; u32 4; head -c 67108864 /dev/zero; } | gzip -1 > "$tmp/bomb/train-images-idx3-ubyte.gz"
expect_fail "idx gzip bomb" 1 "train-images-idx3-ubyte.gz: more data than the 64 values its header declares" \
  -- "$bin" train --model "$tmp/tiny.model" --config "$tmp/tiny.json" --data "$tmp/bomb" --updates 1
expect_fail "weights rtol negative" 2 "--rtol: '-1' is not a relative difference >= 0" -- \
  "$bin" weights compare a b --rtol -1

# A diverging run stops with the update, and saves nothing: white images,
# labels 0 1 0 1, and a learning rate of 1e38.
idx t10k-images-idx3-ubyte 3 4 4 4
{ printf '\x00\x00\x08\x03'; u32 4; u32 4; u32 4; head -c 64 /dev/zero | tr '\0' '\377'; } \
  > "$tmp/idx/train-images-idx3-ubyte"
{ printf '\x00\x00\x08\x01'; u32 4; printf '\x00\x01\x00\x01'; } > "$tmp/idx/train-labels-idx1-ubyte"
printf '{"micro_batch_size": 2, "optimizer": {"type": "sgd", "lr": 1e38}}\n' > "$tmp/diverge.json"
expect_fail "train diverges" 1 "update [0-9]+: the loss is (nan|inf|-nan), training diverged; nothing is saved" \
  -- "$bin" train --model "$tmp/tiny.model" --config "$tmp/diverge.json" --data "$tmp/idx" --updates 20 \
  --save "$tmp/diverged.rpw"
if [ ! -e "$tmp/diverged.rpw" ]; then ok; else bad "a diverged run saved its weights"; fi
# The logged loss is the update's mean, whatever the layout: two replicas of
# one micro-batch log what one replica of two micro-batches logs.
for lay in '"replication_factor": 2' '"gradient_accumulation_steps": 2'; do
  printf '{"micro_batch_size": 1, %s, "output_mode": "final"}\n' "$lay" > "$tmp/lay.json"
  "$bin" train --model "$tmp/tiny.model" --config "$tmp/lay.json" --data "$tmp/idx" --updates 1 \
    --json-log "$tmp/lay-$(echo "$lay" | cut -c2)".log >/dev/null 2>&1
done
l1=$(sed -n 's/.*"loss":\([0-9.]*\).*/\1/p' "$tmp/lay-r.log"); l2=$(sed -n 's/.*"loss":\([0-9.]*\).*/\1/p' "$tmp/lay-g.log")
if [ -n "$l1" ] && [ "$l1" = "$l2" ]; then ok; else bad "logged loss by layout: $l1 against $l2"; fi

# A trace past a worker's 65536 events says what it left out.
printf '{"micro_batch_size": 1, "gradient_accumulation_steps": 4}\n' > "$tmp/long.json"
out=$("$bin" train --model "$tmp/tiny.model" --config "$tmp/long.json" --data "$tmp/idx" --updates 8000 \
      --trace "$tmp/long-trace.json" --log-every 100000 2>&1)
if grep -qE "warning: .*long-trace.json: [0-9]+ operations were not recorded: a worker keeps its first 65536" <<<"$out" &&
   grep -q "later operations not recorded" "$tmp/long-trace.json"; then ok; else bad "trace cap: $out"; fi
expect_fail "train batch beyond the data" 1 "an update takes 1000000000 samples .* but the training set of $tmp/idx has 4" \
  -- "$bin" train --model "$tmp/tiny.model" --config <(printf '{"micro_batch_size": 1000000000}') --data "$tmp/idx" --updates 1

# Two replicas on threads, then the same under MPI: the same weights.
if [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  out=$("$bin" train --model "$src/examples/fmnist-mlp.model" --config "$src/examples/fmnist-r2.json" \
        --updates 20 --save "$tmp/r2.rpw" 2>&1)
  if grep -q "^2 workers (local backend)" <<<"$out" && grep -q "^test accuracy" <<<"$out"; then ok; else bad "train R=2: $out"; fi
  # the IPUConfig example trains the MLP: 2 replicas of 2 stages
  out=$("$bin" train --model "$src/examples/fmnist-mlp.model" --config "$src/examples/ipu_config.json" --updates 4 2>&1)
  if grep -q "^4 workers (local backend), 2 stages" <<<"$out" && grep -q "^test accuracy" <<<"$out"; then ok; else bad "train ipu_config: $out"; fi
  expect_grep "eval" "^test accuracy: 0\.[0-9]{4}$" -- "$bin" eval --model "$src/examples/fmnist-mlp.model" \
    --config "$src/examples/fmnist-r2.json" --load "$tmp/r2.rpw" --out "$tmp/pred.csv"
  if [ "$(wc -l < "$tmp/pred.csv")" = 10001 ] && head -2 "$tmp/pred.csv" | grep -q "^0,[0-9],9$"; then ok; else bad "predictions csv"; fi
  if command -v mpirun >/dev/null; then
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe --bind-to none \
      --mca btl self,vader -np 2 "$bin" train --model "$src/examples/fmnist-mlp.model" \
      --config "$src/examples/fmnist-r2.json" --updates 20 --backend mpi --save "$tmp/r2mpi.rpw" >/dev/null 2>&1
    expect_grep "local == mpi" "^same: 0 tensors" -- "$bin" weights compare "$tmp/r2.rpw" "$tmp/r2mpi.rpw" --rtol 1e-6
    # eval on two ranks, each predicting every other micro-batch: the same predictions
    printf '{"micro_batch_size": 64, "replication_factor": 2, "inference_replication_factor": 2}' > "$tmp/inf2.json"
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe --bind-to none \
      --mca btl self,vader -np 2 "$bin" eval --model "$src/examples/fmnist-mlp.model" \
      --config "$tmp/inf2.json" --load "$tmp/r2.rpw" --out "$tmp/pred-mpi.csv" --backend mpi > "$tmp/evmpi.txt" 2>&1
    if [ "$(grep -c '^test accuracy' "$tmp/evmpi.txt")" = 1 ] && cmp -s "$tmp/pred.csv" "$tmp/pred-mpi.csv"; then ok; else bad "eval under MPI: $(cat "$tmp/evmpi.txt")"; fi
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe --bind-to none \
      --mca btl self,vader -np 3 "$bin" train --model "$src/examples/fmnist-mlp.model" \
      --config "$src/examples/fmnist-r2.json" --updates 2 --backend mpi > "$tmp/np3.txt" 2>&1
    if grep -q "needs 2 workers (replication_factor 2 x 1 per replica) but 3 MPI ranks were started" "$tmp/np3.txt"; then ok; else bad "np 3: $(head -5 "$tmp/np3.txt")"; fi
  fi
fi

# A token model on text: the bytes of a file, 2 replicas of 2 stages; the
# validation loss falls well below a uniform guess's ln 256 = 5.55.
for i in $(seq 300); do printf 'the quick brown fox jumps over the lazy dog. '; done > "$tmp/text.txt"
printf 'input 16\nembedding 256 16\nposition_embedding\ngelu\nlinear 256\nsoftmax_cross_entropy\n' > "$tmp/lm.model"
printf '{"micro_batch_size": 8, "replication_factor": 2, "layers_per_stage": [2, -1], "optimizer": {"type": "adam", "lr": 0.01}}\n' > "$tmp/lm.json"
out=$("$bin" train --model "$tmp/lm.model" --config "$tmp/lm.json" --text "$tmp/text.txt" --updates 120 \
      --log-every 1000 --eval-every 60 --json-log "$tmp/lm.jsonl" --save "$tmp/lm.rpw" 2>&1)
vl=$(sed -n 's/^validation loss: \([0-9.]*\) (nats per token; [0-9.]* bits)$/\1/p' <<<"$out")
if [ -n "$vl" ] && awk -v v="$vl" 'BEGIN { exit !(v < 2.5) }' && grep -q "^update 60  validation loss " <<<"$out" &&
   grep -q '"eval":"validation","samples":[0-9]*,"loss":' "$tmp/lm.jsonl"; then ok; else bad "text: $out"; fi
# validation on the first N held-out samples (the whole tenth of a large
# token file took ten times the run), said
vm=$("$bin" train --model "$tmp/lm.model" --config "$tmp/lm.json" --text "$tmp/text.txt" --updates 4 \
     --val-max 2 --json-log "$tmp/v2.jsonl" 2>&1)
if grep -q "^note: validating on the first 2 of the [0-9]* held-out samples (--val-max N; 0 takes all)" <<<"$vm" &&
   grep -q "evaluation of 2 samples" <<<"$vm" && grep -q '"eval":"validation","samples":2,' "$tmp/v2.jsonl"
then ok; else bad "--val-max: $vm"; fi
# the same tokens as llm.c writes them: a 256 x int32 header [20240520, 1, count], uint16 tokens
perl -e 'binmode STDOUT; local $/; my $t = <>; print pack("l<l<l<", 20240520, 1, length $t), "\0" x 1012, pack("S<*", unpack("C*", $t));' \
  "$tmp/text.txt" > "$tmp/text.bin"
out2=$("$bin" train --model "$tmp/lm.model" --config "$tmp/lm.json" --tokens "$tmp/text.bin" --updates 120 --log-every 1000 2>&1)
if [ "$(grep '^validation loss' <<<"$out2")" = "$(grep '^validation loss' <<<"$out")" ]; then ok; else bad "llm.c tokens: $out2"; fi
# a token model profiles (its loss takes a label per token) and plans
printf 'input 16\nembedding 256 16\nposition_embedding\ntransformer_block heads=2\nlayernorm\nlinear 256\nsoftmax_cross_entropy\n' > "$tmp/gpt.model"
if "$bin" profile --model "$tmp/gpt.model" --out "$tmp/gpt.txt" -b 2 -r 1 > /dev/null 2>&1 &&
   grep -q "transformer_block (layer 2, line 4)" "$tmp/gpt.txt" &&
   "$bin" plan --profile "$tmp/gpt.txt" --machines 2 --bandwidth 1e9 > /dev/null 2>&1; then ok; else bad "profile a GPT"; fi
# a graph profiles with its real edges (the skips of both residual blocks),
# and plans to a configuration of all its layers: its stages start at layer 0
# and end at 22, one stage or several (which the measured times decide: a
# profile taken on a loaded machine made a 2-stage plan, layers 0-6 and 7-22)
if "$bin" profile --model "$src/examples/fmnist-resnet.model" --out "$tmp/res.txt" -b 2 -r 1 > /dev/null 2>&1 &&
   grep -qx $'\tnode3 -- node9' "$tmp/res.txt" && grep -qx $'\tnode10 -- node16' "$tmp/res.txt" &&
   [ "$(grep -c $'^\t' "$tmp/res.txt")" = 25 ] &&
   "$bin" plan --profile "$tmp/res.txt" --machines 2 2 --config-out "$tmp/res.json" > /dev/null 2>&1 &&
   shown=$("$bin" config show "$tmp/res.json" --model "$src/examples/fmnist-resnet.model") &&
   grep -q "stage 0 *layers 0-" <<<"$shown" && grep -Eq "layers [0-9]+-22 " <<<"$shown"
then ok; else bad "profile a graph: $(cat "$tmp/res.txt") $shown"; fi
# config show says what a graph's stage receives
printf '{"layers_per_stage": [4, 9, -1]}\n' > "$tmp/cut.json"
expect_grep "config show cut" "^            receives 2 tensors \(layer 9, layer 12\), 18816 floats a sample$" -- \
  "$bin" config show "$tmp/cut.json" --model "$src/examples/fmnist-resnet.model"
# its samples: the prompt, then 40 bytes of the text's alphabet; a seed gives the same text
g1=$("$bin" generate --model "$tmp/lm.model" --load "$tmp/lm.rpw" --prompt "the " --tokens 40 --seed 5 2>&1)
g2=$("$bin" generate --model "$tmp/lm.model" --load "$tmp/lm.rpw" --prompt "the " --tokens 40 --seed 5 2>&1)
if [ "$g1" = "$g2" ] && [ "${#g1}" -eq 44 ] && [ "${g1#the }" != "$g1" ] &&
   [ -z "$(tr -d 'a-z .' <<<"$g1")" ]; then ok; else bad "generate: '$g1' '$g2'"; fi
# a temperature near 0 draws the likeliest token, as 0 does (p^(1/T)
# underflowed for every token, and the draw took the last, byte 0xff)
g0=$("$bin" generate --model "$tmp/lm.model" --load "$tmp/lm.rpw" --prompt "the " --tokens 40 --temperature 0 --top-k 0 2>&1)
gs=$("$bin" generate --model "$tmp/lm.model" --load "$tmp/lm.rpw" --prompt "the " --tokens 40 --temperature 1e-4 --top-k 0 2>&1)
if [ "$g0" = "$gs" ] && [ "${#g0}" -eq 44 ]; then ok; else bad "temperature 1e-4: '$gs' against '$g0'"; fi
# NaN weights are refused, not sampled into garbage
"$bin" weights show "$tmp/lm.rpw" > /dev/null
perl -MCompress::Zlib -e 'binmode STDIN; binmode STDOUT; local $/; my $d = <STDIN>;
  substr($d, length($d) - 400, 4) = pack("f<", 9**9**9 / 9**9**9); substr($d, -4) = pack("L<", crc32(substr($d, 0, -4)));
  print $d;' < "$tmp/lm.rpw" > "$tmp/nan.rpw"
expect_fail "generate from NaN weights" 1 "NaN" -- "$bin" generate --model "$tmp/lm.model" --load "$tmp/nan.rpw" --tokens 5
expect_fail "generate from an image model" 1 "generate needs a token model" -- "$bin" generate \
  --model "$src/examples/fmnist-mlp.model" --load "$tmp/lm.rpw"
# llm.c's GPT-2, imported: the first 10 losses of llm.c and PyTorch from the same
# checkpoint and batches (tests/fixtures/llmc/reference.txt), on one worker and on 2
# replicas of 2 stages with the tied head on the other stage; exported, the same bytes
fx="$src/tests/fixtures/llmc"
"$bin" weights import-llmc "$fx/gpt-l2.bin" --model "$fx/gpt-l2.model" --out "$tmp/l2.rpw" > /dev/null
"$bin" weights export-llmc "$tmp/l2.rpw" --model "$fx/gpt-l2.model" --out "$tmp/l2.bin" > /dev/null
if cmp -s "$fx/gpt-l2.bin" "$tmp/l2.bin"; then ok; else bad "export-llmc does not give back llm.c's file"; fi
for layout in '"micro_batch_size": 4' \
  '"micro_batch_size": 1, "gradient_accumulation_steps": 2, "replication_factor": 2, "layers_per_stage": [3, -1]'; do
  printf '{%s, "data_order": "sequential", "optimizer": {"type": "adamw", "lr": 0.001, "weight_decay": 0}}\n' \
    "$layout" > "$tmp/l2.json"
  "$bin" train --model "$fx/gpt-l2.model" --config "$tmp/l2.json" --tokens "$fx/tokens.bin" --load "$tmp/l2.rpw" \
    --updates 10 --log-every 1 --json-log "$tmp/l2.jsonl" > /dev/null 2>&1
  worst=$(grep -o '"update":[0-9]*,"epoch":[0-9.]*,"loss":[0-9.]*' "$tmp/l2.jsonl" | sed 's/.*"loss"://' |
    paste - <(grep -v '^#' "$fx/reference.txt") |
    awk '{ for (k = 2; k <= 3; k++) { d = $1 - $k; d = d < 0 ? -d : d; if (d > w) w = d }; n++ }
         END { print (n == 10 ? w : 1) }')
  if awk -v w="$worst" 'BEGIN { exit !(w <= 1e-4) }'; then ok; else bad "llm.c losses ($layout): off by $worst"; fi
done
# PyTorch's LLaMA state_dict (safetensors, Meta's names) into a repipe model and back: the
# same bytes as the file PyTorch's side wrote; under repipe's names it loads directly
fx="$src/tests/fixtures/llama"
"$bin" weights import-safetensors "$fx/tiny.safetensors" --model "$fx/tiny.model" --out "$tmp/tiny.rpw" > /dev/null
"$bin" weights export-safetensors "$tmp/tiny.rpw" --model "$fx/tiny.model" --out "$tmp/tiny.safetensors" \
  --names meta > /dev/null
if cmp -s "$fx/tiny.safetensors" "$tmp/tiny.safetensors"; then ok; else bad "export-safetensors --names meta does not give back the file"; fi
"$bin" weights import-safetensors "$fx/tiny_hf.safetensors" --model "$fx/tiny.model" --out "$tmp/tiny-hf.rpw" > /dev/null
expect_grep "Hugging Face's names give Meta's weights" "^same: 0 tensors outside" -- "$bin" weights compare \
  "$tmp/tiny.rpw" "$tmp/tiny-hf.rpw" --rtol 0
"$bin" weights export-safetensors "$tmp/tiny.rpw" --model "$fx/tiny.model" --out "$tmp/tiny_hf.safetensors" \
  --names hf > /dev/null
if cmp -s "$fx/tiny_hf.safetensors" "$tmp/tiny_hf.safetensors"; then ok; else bad "export-safetensors --names hf does not give back the file"; fi
"$bin" weights export-safetensors "$tmp/tiny.rpw" --model "$fx/tiny.model" --out "$tmp/tiny-rp.safetensors" > /dev/null
expect_grep "compare a weight file with its safetensors" "^same: 0 tensors outside" -- "$bin" weights compare \
  "$tmp/tiny.rpw" "$tmp/tiny-rp.safetensors" --rtol 0
expect_fail "Meta's names into a GPT" 1 "not a LLaMA-family model in repipe's graph" -- "$bin" weights \
  import-safetensors "$fx/tiny.safetensors" --model "$tmp/lm.model" --out "$tmp/no.rpw"
expect_fail "an integer tensor" 1 "tensor 'B' is U8; repipe reads F32, F16, BF16 and F64" -- "$bin" weights \
  show "$src/tests/fixtures/safetensors/overall.safetensors"
if [ ! -e "$tmp/no.rpw" ]; then ok; else bad "a refused import wrote its --out"; fi
# the same model in llama_block lines: Hugging Face's file in, Meta's out, PyTorch's bytes
printf 'input 8\nembedding 32 16\nllama_block heads=2 kv_heads=1 mlp=40 eps=1e-5\nllama_block heads=2 kv_heads=1 mlp=40 eps=1e-5\nrmsnorm eps=1e-5\nlinear 32 bias=false\nsoftmax_cross_entropy\n' \
  > "$tmp/tiny-lb.model"
"$bin" weights import-safetensors "$fx/tiny_hf.safetensors" --model "$tmp/tiny-lb.model" --out "$tmp/tiny-lb.rpw" > /dev/null
"$bin" weights export-safetensors "$tmp/tiny-lb.rpw" --model "$tmp/tiny-lb.model" --names meta \
  --out "$tmp/tiny-lb.safetensors" > /dev/null
if cmp -s "$fx/tiny.safetensors" "$tmp/tiny-lb.safetensors"; then ok; else bad "llama_block lines do not map as the graph does"; fi
# --load takes a LLaMA-family state_dict under Hugging Face's names as it is
printf '{"micro_batch_size": 2, "optimizer": {"type": "adamw", "lr": 0.003}}\n' > "$tmp/lk.json"
"$bin" train --model "$src/examples/llama-kjv.model" --config "$tmp/lk.json" --text "$tmp/text.txt" \
  --updates 1 --save "$tmp/lk.rpw" > /dev/null 2>&1
"$bin" weights export-safetensors "$tmp/lk.rpw" --model "$src/examples/llama-kjv.model" --names hf \
  --out "$tmp/lk_hf.safetensors" > /dev/null
g_rp=$("$bin" generate --model "$src/examples/llama-kjv.model" --load "$tmp/lk.rpw" --prompt "the " --tokens 20 --temperature 0 2>&1)
g_hf=$("$bin" generate --model "$src/examples/llama-kjv.model" --load "$tmp/lk_hf.safetensors" --prompt "the " --tokens 20 --temperature 0 2>&1)
if [ "$g_rp" = "$g_hf" ] && [ "${#g_rp}" -ge 20 ]; then ok; else bad "generate from Hugging Face's names: '$g_hf' against '$g_rp'"; fi

# zb-auto from the command line: 1f1b's weights bit for bit, and the plan line says its keys
for sched in '"1f1b"' '"zb-auto", "zb_pass_times": [1, 3, 1], "zb_max_in_flight": 6'; do
  printf '{"micro_batch_size": 8, "gradient_accumulation_steps": 4, "layers_per_stage": [2, 2, -1], "schedule": %s}\n' \
    "$sched" > "$tmp/zba.json"
  "$bin" train --model "$src/examples/fmnist-mlp.model" --config "$tmp/zba.json" --updates 3 \
    --save "$tmp/zba-${sched:1:4}.rpw" > /dev/null 2>&1
done
expect_grep "zb-auto is 1f1b's bits" "^same: 0 tensors outside" -- "$bin" weights compare "$tmp/zba-1f1b.rpw" \
  "$tmp/zba-zb-a.rpw" --rtol 0
# the planner orders a pipeline by its own pass times where that pays: four stages whose input
# gradient takes three forwards, large weights on a slow link (a profile written here)
{
  echo "node0 -- Input0 micro_batch=16 -- forward_compute_time=0.000, backward_compute_time=0.000, activation_size=64.000, parameter_size=0.000"
  for i in 1 2 3 4; do
    echo "node$i -- linear (layer $((i - 1)), line $((i + 1))) backward_input_time=3.000 backward_weight_time=1.000 -- forward_compute_time=1.000, backward_compute_time=4.000, activation_size=64.000, parameter_size=400000000.000"
  done
  for i in 0 1 2 3; do printf '\tnode%d -- node%d\n' "$i" "$((i + 1))"; done
} > "$tmp/zb-graph.txt"
expect_grep "plan picks zb-auto" "schedule zb-auto, .*zb_pass_times \[1, 3, 1\], zb_max_in_flight 12" -- "$bin" plan \
  --profile "$tmp/zb-graph.txt" --machines 4 --bandwidth 1e9 --objective engine --global-batch 256 --memory-size 1e12
# PipeDream's schedules: the memory table says what its parameters hold; vertical sync
# belongs to pipedream
printf '{"micro_batch_size": 8, "gradient_accumulation_steps": 4, "layers_per_stage": [3, -1], "schedule": "pipedream", "pipedream_vertical_sync": true}\n' > "$tmp/pd.json"
out=$("$bin" train --model "$src/examples/fmnist-mlp.model" --config "$tmp/pd.json" --updates 3 2>&1)
if grep -q "parameters count the weight versions pipedream keeps" <<<"$out" &&
   grep -q "^test accuracy: 0\." <<<"$out"; then ok; else bad "pipedream train: $out"; fi
printf '{"layers_per_stage": [3, -1], "pipedream_vertical_sync": true}\n' > "$tmp/pd1.json"
expect_fail "vertical sync without pipedream" 1 'pipedream_vertical_sync goes with schedule "pipedream", not "1f1b"' -- \
  "$bin" train --model "$src/examples/fmnist-mlp.model" --config "$tmp/pd1.json" --updates 1
expect_fail "text on an image model" 1 "need a token model: an input of T token ids" -- "$bin" train \
  --model "$src/examples/fmnist-mlp.model" --config "$src/examples/fmnist.json" --text "$tmp/text.txt" --updates 1
expect_fail "not llm.c tokens" 1 "not an llm.c token file \(magic" -- "$bin" train --model "$tmp/lm.model" \
  --config "$tmp/lm.json" --tokens "$tmp/text.txt" --updates 1

# Workflow: profile a repipe model, plan it, turn the plan into a configuration.
# (linear 1 at 8 rows: its 512 outputs a row, 8 x 512 x 4 bytes kept and
# stashed for W; scratch two 784-wide rows of gradients, 2 x 8 x 784 x 4)
"$bin" profile --model "$src/examples/fmnist-mlp.model" --micro-batch 8 --repeats 3 --out "$tmp/mlp.txt" >/dev/null 2>&1
if [ "$(grep -c ' -- ' "$tmp/mlp.txt")" -ge 15 ] && grep -q "^node0 -- Input0 micro_batch=8 timed_in=whole_passes -- " "$tmp/mlp.txt" &&
   grep -q "^node2 -- linear (layer 1, line 4) backward_input_time=[0-9.]* backward_weight_time=[0-9.]* saved_bytes=16384 checkpoint_bytes=0 wstash_bytes=16384 scratch_bytes=50176 grad_bytes=0 -- .*parameter_size=1607680.000$" "$tmp/mlp.txt"; then ok; else bad "profile: $(head -3 "$tmp/mlp.txt")"; fi
# --alone times each layer on its own: the same nodes, sizes and edges, another Input note
"$bin" profile --model "$src/examples/fmnist-mlp.model" --micro-batch 8 --repeats 3 --alone --out "$tmp/mlp-alone.txt" >/dev/null 2>&1
untimed() { sed -e 's/[a-z_]*_time=[0-9.]*//g' -e 's/ timed_in=[a-z_]*//' "$1"; }
if grep -q "^node0 -- Input0 micro_batch=8 timed_in=layers_alone -- " "$tmp/mlp-alone.txt" &&
   [ "$(untimed "$tmp/mlp.txt")" = "$(untimed "$tmp/mlp-alone.txt")" ] &&
   grep -q "^node2 -- linear (layer 1, line 4) backward_input_time=[0-9.]* backward_weight_time=[0-9.]* saved_bytes=" "$tmp/mlp-alone.txt"
then ok; else bad "profile --alone: $(diff "$tmp/mlp.txt" "$tmp/mlp-alone.txt")"; fi
out=$("$bin" plan --profile "$tmp/mlp.txt" --machines 2 --straight --config-out "$tmp/mlp-plan.json" \
      --base-config "$src/examples/fmnist.json" 2>&1)
# --config-out plans for the engine by default and keeps the base's samples per update
if grep -q "execution configuration written to .*the engine's plan; it sets:" <<<"$out" &&
   "$bin" config check "$tmp/mlp-plan.json" --layers 7 >/dev/null 2>&1 &&
   "$bin" config show "$tmp/mlp-plan.json" | grep -qE "samples per update +64 "; then ok; else bad "plan --config-out: $out"; fi
# The launch line plan prints: on two servers of 2 slots each, rank r lands on
# server r / 2, as the plan assumed (shown without launching); then the same
# options, for real, on this one machine.
if command -v mpirun >/dev/null && [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  out=$("$bin" plan --profile "$tmp/mlp.txt" --machines 2 2 --objective engine --global-batch 64 \
        --config-out "$tmp/mlp22.json" 2>&1)
  line=$(grep "^  mpirun " <<<"$out")
  np=$(sed -n 's/.*-np \([0-9]*\) .*/\1/p' <<<"$line")
  if grep -q -- "--hostfile HOSTS --map-by ppr:2:node --bind-to core repipe train --model MODEL --config $tmp/mlp22.json --backend mpi" <<<"$line" &&
     [ -n "$np" ]; then ok; else bad "plan launch line: $out"; fi
  printf 'server1 slots=2\nserver2 slots=2\n' > "$tmp/hosts"
  map=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 30 mpirun -np "$np" \
        --hostfile "$tmp/hosts" --map-by ppr:2:node --display-map --do-not-launch true 2>&1)
  placed=$(awk '/Data for node:/ { node = $4 }
                match($0, /Process rank: [0-9]+/) { print substr($0, RSTART + 14, RLENGTH - 14), node }' <<<"$map" |
           sort -n | awk '{ printf "%s:%s ", $1, $2 }')
  want=""; for r in $(seq 0 $((np - 1))); do want+="$r:server$((r / 2 + 1)) "; done
  if [ "$placed" = "$want" ]; then ok; else bad "rank placement: $placed, want $want: $map"; fi
  printf 'localhost slots=%d\n' "$np" > "$tmp/localhost"
  # (Open MPI keeps allocations until exit: LeakSanitizer would fail the sanitizer build on them)
  if ASAN_OPTIONS=detect_leaks=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np "$np" --hostfile "$tmp/localhost" \
       --map-by "ppr:$np:node" --bind-to none --mca btl self,vader "$bin" train \
       --model "$src/examples/fmnist-mlp.model" --config "$tmp/mlp22.json" --backend mpi --updates 2 \
       > "$tmp/launch.txt" 2>&1 && grep -q "^test accuracy" "$tmp/launch.txt"; then ok; else bad "launch: $(tail -5 "$tmp/launch.txt")"; fi
fi
# PipeDream's objective on request: its stages, with every stage replica fed
out=$("$bin" plan --profile "$vgg" --machines 8 2 --bandwidth 4294967296 2147483648 \
      --activation-compression 1 --objective pipedream --profile-batch 64 --global-batch 896 \
      --config-out "$tmp/vgg.json" 2>&1)
if grep -q "replication_factor 2, layers_per_stage \[24, 16\], stage_replication \[7, 1\]" <<<"$out"; then ok; else bad "seed config: $out"; fi
expect_grep "seed config workers" "workers needed +16" -- "$bin" config show "$tmp/vgg.json"
if "$bin" config show "$tmp/vgg.json" | grep -qE "samples per update +896 " &&
   awk '/"gradient_accumulation_steps"/ { ga = $2 + 0 } END { exit !(ga >= 7) }' "$tmp/vgg.json"; then ok; else bad "seed config batch: $(cat "$tmp/vgg.json")"; fi
# The engine objective on the seed case: never slower than data parallelism
# or PipeDream's plan run synchronously
out=$("$bin" plan --profile "$vgg" --machines 8 2 --bandwidth 4294967296 2147483648 \
      --activation-compression 1 --objective engine --profile-batch 64 --global-batch 1024 2>&1)
rate() { sed -n "s/^  $1 .* s  *\([0-9]*\)\(  [a-z].*\)\{0,1\}$/\1/p" <<<"$out"; } # (the reductions' keys after)
dp=$(rate "data parallel"); pd=$(rate "PipeDream's plan, synchronous"); best=$(rate "fastest for the engine")
if [ -n "$best" ] && [ -n "$dp" ] && [ -n "$pd" ] && [ "$best" -ge "$dp" ] && [ "$best" -ge "$pd" ] &&
   grep -q "^  stage 0: layers 0-" <<<"$out"; then ok; else bad "engine objective: $out"; fi
# With --json -, standard output is the JSON alone: the plan with the engine's rows
out=$("$bin" plan --profile "$vgg" --machines 8 2 --bandwidth 4294967296 2147483648 \
      --activation-compression 1 --objective engine --profile-batch 64 --global-batch 1024 \
      --json - 2>/dev/null)
if [ "$(head -c 1 <<<"$out")" = "{" ] && [ "$(tail -n 1 <<<"$out")" = "}" ] &&
   grep -q '"engine":' <<<"$out" && grep -q '"samples_per_second":' <<<"$out" &&
   grep -q '"stage_to_rank_map":' <<<"$out" && ! grep -q "repipe's engine" <<<"$out"; then ok
else bad "engine objective --json -: $out"; fi

# Two chunks a worker on 2 pipeline workers, the first of 2 devices (test_autoplan.c's
# eight layers, parameters on layers 3 and 7): 3 machines in the words, the row and the
# JSON, and the launch line's ranks.
{
  echo "node0 -- Input0 -- forward_compute_time=0, backward_compute_time=0, activation_size=1000, parameter_size=0"
  l=0
  for f in 1 2 3 2 3 1 1 2; do
    case $l in 3|7) par=4e6 ;; *) par=0 ;; esac
    echo "node$((l + 1)) -- layer$l backward_input_time=$(awk -v f=$f 'BEGIN { print 1.8 * f }') backward_weight_time=$(awk -v f=$f 'BEGIN { print 0.2 * f }') -- forward_compute_time=$f, backward_compute_time=$((2 * f)), activation_size=1000, parameter_size=$par"
    l=$((l + 1))
  done
  for l in $(seq 0 7); do printf '\tnode%d -- node%d\n' "$l" $((l + 1)); done
} > "$tmp/chunks8.txt"
out=$("$bin" plan --profile "$tmp/chunks8.txt" --machines 3 --bandwidth 1e8 --objective engine \
      --global-batch 12 --profile-batch 16 --json "$tmp/chunks8.json" \
      --config-out "$tmp/chunks8.cfg.json" 2>&1)
if grep -q "a pipeline of 4 chunks, 2 on each of its 2 workers (interleaved-1f1b) on 3 of the 3 machines" <<<"$out" &&
   grep -q "chunk 2: layers 4-5 (layer4 ... layer5) on worker 0 of each replica, a worker of 2 devices" <<<"$out" &&
   grep -q "mpirun -np 3 " <<<"$out" &&
   [ "$(grep -A3 '"best":' "$tmp/chunks8.json" | tr -d ' \t\n')" = '"best":{"found":true,"workers":3,"stages":4,' ]
then ok; else bad "plan: replicated chunks: $out"; fi
# at 8 samples data parallelism on the 3 has no configuration: the words give no ratio to
# it, and the legend under the table says why a row can have none
out=$("$bin" plan --profile "$tmp/chunks8.txt" --machines 3 --bandwidth 1e8 --objective engine \
      --global-batch 8 --profile-batch 16 2>&1)
if grep -q "^  data parallel  *none (below)" <<<"$out" &&
   grep -q "^  none: no configuration of that kind runs here: .* split 8 samples an update evenly" <<<"$out" &&
   grep -q "^a pipeline of 3 stages on 3 of the 3 workers, 1 replica of it, is predicted fastest$" <<<"$out"
then ok; else bad "plan: no data parallelism: $out"; fi

# Simulation of a 2-stage pipeline from a profile: a time and a timeline.
printf '{"micro_batch_size": 8, "gradient_accumulation_steps": 4, "layers_per_stage": [3, -1]}\n' > "$tmp/p2.json"
out=$("$bin" simulate --config "$tmp/p2.json" --profile "$tmp/mlp.txt" --svg "$tmp/t.svg" 2>&1)
if grep -qE "^predicted time per update +[0-9.]+ ms" <<<"$out" && grep -q "<svg" "$tmp/t.svg" &&
   [ "$(grep -c 'fill="#4e79a7"' "$tmp/t.svg")" = 8 ]; then ok; else bad "simulate: $out"; fi
# Updates that overlap: the Zero Bubble paper's 6.2B model on 8 stages, 24 micro-batches
# (tests/fixtures/zero-bubble): zb-h2's update under way, its Table 5's 0.0698; 1f1b's
# updates do not overlap and get no such line.
{ echo "node0 -- Input0 -- forward_compute_time=0, backward_compute_time=0, activation_size=0, parameter_size=0"
  for i in 1 2 3 4 5 6 7 8; do
    echo "node$i -- s backward_input_time=29.444 backward_weight_time=19.927 -- forward_compute_time=29.718, backward_compute_time=49.371, activation_size=0, parameter_size=0"
  done
  for i in 0 1 2 3 4 5 6 7; do printf '\tnode%d -- node%d\n' "$i" $((i + 1)); done; } > "$tmp/zb8.txt"
printf '{"micro_batch_size": 1, "gradient_accumulation_steps": 24, "schedule": "zb-h2", "layers_per_stage": [1, 1, 1, 1, 1, 1, 1, 1]}\n' > "$tmp/zb8.json"
out=$("$bin" simulate --config "$tmp/zb8.json" --profile "$tmp/zb8.txt" --machines 8 --bandwidth 1e15 --latency 527e-6 --json "$tmp/zb8.out" 2>&1)
if grep -q "^under way, an update adds 2040.6[0-9]* ms to a call (bubble 7.0 %)" <<<"$out" &&
   grep -q '"steady_bubble_fraction":[[:space:]]*0.069[78]' "$tmp/zb8.out"; then ok; else bad "simulate under way: $out"; fi
sed -i 's/zb-h2/1f1b/' "$tmp/zb8.json"
out=$("$bin" simulate --config "$tmp/zb8.json" --profile "$tmp/zb8.txt" --machines 8 --bandwidth 1e15 --latency 527e-6 2>&1)
if grep -q "^predicted time per update" <<<"$out" && ! grep -q "under way" <<<"$out"; then ok; else bad "simulate 1f1b under way: $out"; fi
# A chunked schedule's worker is replicated as a whole: simulate refuses what the engine
# would, naming the stages, before it builds the plan.
printf '{"micro_batch_size": 8, "gradient_accumulation_steps": 4, "schedule": "interleaved-1f1b", "virtual_stages": 2, "layers_per_stage": [1, 1, 1, -1], "stage_replication": [2, 1, 1, 1]}\n' > "$tmp/chunks.json"
out=$("$bin" simulate --config "$tmp/chunks.json" --profile "$tmp/mlp.txt" 2>&1)
if [ $? -ne 0 ] && grep -q "stages 0 and 2 are chunks of pipeline worker 0, which is replicated as a whole" <<<"$out"
then ok; else bad "simulate: chunk replication: $out"; fi

# The drawing's title is the configuration's name, escaped: a name with '&' or '<' in
# it still makes a drawing an XML reader takes.
cp "$tmp/p2.json" "$tmp/a&b<c.json"
out=$("$bin" simulate --config "$tmp/a&b<c.json" --profile "$tmp/mlp.txt" --svg "$tmp/t2.svg" 2>&1)
if grep -q 'a&amp;b&lt;c.json: ' "$tmp/t2.svg" && ! grep -q 'a&b' "$tmp/t2.svg" &&
   [ "$(tail -n 1 "$tmp/t2.svg")" = "</svg>" ]; then ok; else bad "simulate: title: $out"; fi

# The simulation knows the memory features: recomputation adds a forward pass to every
# backward, fp16 exchange halves the bytes between workers.
printf '{"micro_batch_size": 8, "gradient_accumulation_steps": 4, "layers_per_stage": [3, -1], "recompute_checkpoint_every_layer": true}\n' > "$tmp/p2rc.json"
printf '{"micro_batch_size": 8, "gradient_accumulation_steps": 4, "layers_per_stage": [3, -1], "fp16_exchange": true}\n' > "$tmp/p2h.json"
simt() { "$bin" simulate --config "$1" --profile "$tmp/mlp.txt" --cores 8 2>&1 | sed -n 's/^predicted time per update *\([0-9.]*\) ms.*/\1/p'; }
t0=$(simt "$tmp/p2.json"); trc=$(simt "$tmp/p2rc.json"); th=$(simt "$tmp/p2h.json")
if [ -n "$t0" ] && awk -v a="$t0" -v r="$trc" -v h="$th" 'BEGIN { exit !(r > a && h <= a && h != "") }'; then ok; else bad "simulate features: $t0 $trc $th"; fi

# A plan file runs directly: train and simulate take its stages and replication.
"$bin" plan --profile "$tmp/mlp.txt" --machines 2 --straight --json "$tmp/mlp-plan.json" >/dev/null 2>&1
if grep -q '"execution_config"' "$tmp/mlp-plan.json"; then ok; else bad "plan json has no execution_config"; fi
expect_grep "simulate --plan" "^predicted time per update" -- "$bin" simulate --plan "$tmp/mlp-plan.json" \
  --config "$src/examples/fmnist.json" --profile "$tmp/mlp.txt"
expect_fail "plan over device memory" 1 "more than --device-memory" -- "$bin" plan --profile "$tmp/mlp.txt" \
  --machines 2 --straight --schedule gpipe --micro-batches 8 --device-memory 1000
if [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  expect_grep "train --plan" "^2 workers \(local backend\), 2 stages" -- "$bin" train --model "$src/examples/fmnist-mlp.model" \
    --config "$src/examples/fmnist.json" --plan "$tmp/mlp-plan.json" --updates 5
  # out of memory: the error, then an exit (OpenBLAS's idle threads hung it).
  # Sanitizer builds cannot start under a memory limit; they skip it, saying so.
  if (ulimit -v 200000; "$bin" --version) >/dev/null 2>&1; then
    (ulimit -v 80000; timeout 60 "$bin" train --model "$src/examples/fmnist-cnn.model" \
       --config "$src/examples/pipeline-2x2.json" --updates 2) >/dev/null 2>"$tmp/oom.err"; rc=$?
    if [ $rc = 1 ] && grep -q "out of memory" "$tmp/oom.err"; then ok; else bad "out of memory: exit $rc: $(cat "$tmp/oom.err")"; fi
  else
    echo "note: out-of-memory exit not checked: this build cannot start under ulimit -v"
  fi
  # what the plan replaces is said
  printf '{"micro_batch_size": 16, "replication_factor": 4, "replica_grouping": {"group_size": 2}}\n' > "$tmp/r4.json"
  out=$("$bin" train --model "$src/examples/fmnist-mlp.model" --config "$tmp/r4.json" \
        --plan "$tmp/mlp-plan.json" --updates 1 2>&1)
  if grep -q "mlp-plan.json: replication_factor 1 (the configuration's 4)" <<<"$out" &&
     grep -q "group_size 2, stride 1 is dropped" <<<"$out"; then ok; else bad "train --plan overrides: $out"; fi
fi

# Simulation on a cluster: the seed plan on 2 servers of 8, JSON out, the
# machines taken from a plan, and the errors that name what is wrong.
printf '{"micro_batch_size": 64, "replication_factor": 2, "gradient_accumulation_steps": 28, "layers_per_stage": [24, 16], "stage_replication": [7, 1]}\n' > "$tmp/seed28.json"
out=$("$bin" simulate --config "$tmp/seed28.json" --profile "$vgg" --machines 8 2 \
      --bandwidth 4294967296 2147483648 --json "$tmp/sim.json" --svg "$tmp/seed.svg" 2>&1)
if grep -q "^machines 8 x 2 (innermost level first" <<<"$out" &&
   grep -q '"seconds_per_update"' "$tmp/sim.json" && grep -q '"in_flight":	2' "$tmp/sim.json" &&
   grep -q "micro-batches in flight" "$tmp/seed.svg"; then ok; else bad "simulate cluster: $out"; fi
out=$("$bin" simulate --plan "$tmp/plan.json" --config "$tmp/seed28.json" --profile "$vgg" 2>&1)
if grep -q "^machines 8 x 2" <<<"$out"; then ok; else bad "simulate --plan machines: $out"; fi
expect_fail "simulate too few machines" 1 "needs 16 workers but the machines hold 8" -- "$bin" simulate \
  --config "$tmp/seed28.json" --profile "$vgg" --machines 8
expect_fail "simulate bandwidth count" 2 "--bandwidth has 1 value but --machines has 2 levels" -- \
  "$bin" simulate --config "$tmp/seed28.json" --profile "$vgg" --machines 8 2 --bandwidth 1e9

# What a new user met: the messages name the user's own words.
expect_fail "plan straight, more machines than states" 1 \
  "--straight gives each of the 64 machines a stage of its own, and the profile has 40 states" -- \
  "$bin" plan --profile "$vgg" --machines 64 --straight
printf 'n1 -- Input -- forward_compute_time=0, backward_compute_time=0, activation_size=0, parameter_size=0\nn2 -- Linear -- forward_compute_time=0, backward_compute_time=0, activation_size=0, parameter_size=0\n\tn1 -- n2\n' > "$tmp/zero.txt"
out=$("$bin" plan --profile "$tmp/zero.txt" --machines 4 2>&1)
if ! grep -qi nan <<<"$out" && grep -q "the profile's times are all zero" <<<"$out"; then ok; else bad "zero-cost plan: $out"; fi
printf '{"ipus_per_replica": 4, "layers_per_ipu": [2, 2, 2, 2]}\n' > "$tmp/l8.json"
"$bin" config show "$tmp/l8.json" --layers 9 --json > "$tmp/show.out" 2> "$tmp/show.err"; rc=$?
if [ $rc = 1 ] && [ ! -s "$tmp/show.out" ] &&
   grep -q "layers_per_ipu: the list places 8 layers but the model has 9" "$tmp/show.err"; then ok
else bad "config show --json, layers that do not fit: exit $rc, $(cat "$tmp/show.out" "$tmp/show.err")"; fi
# PipeDream's profile has no micro-batch: its stages alone are written, and
# simulate says what it takes the profile's micro-batch to be
out=$("$bin" plan --profile "$vgg" --machines 8 2 --bandwidth 4294967296 2147483648 \
      --objective pipedream --config-out "$tmp/pd-stages.json" 2>&1); rc=$?
if [ $rc = 0 ] && grep -q "with PipeDream's stages and micro_batch_size 1" <<<"$out" &&
   "$bin" config show "$tmp/pd-stages.json" | grep -qE "workers needed +16"; then ok
else bad "plan --objective pipedream --config-out: exit $rc: $out"; fi
expect_grep "simulate says the micro-batch it assumes" \
  "note: .*vgg16/graph.txt does not say the micro-batch it was measured on; taken to be the configuration's 64" -- \
  "$bin" simulate --config "$tmp/seed28.json" --profile "$vgg" --machines 8 2 --bandwidth 4294967296 2147483648
out=$("$bin" simulate --config "$tmp/seed28.json" --profile "$vgg" --profile-batch 64 --machines 8 2 \
      --bandwidth 4294967296 2147483648 2>&1)
if ! grep -q "does not say the micro-batch" <<<"$out"; then ok; else bad "simulate --profile-batch still notes: $out"; fi
# A profile too wide for the antichain DAG plans on PipeDream's compression,
# and one too wide even so is refused at once
incep="$src/tests/fixtures/pipedream/profiles/inception_v3/graph.txt"
expect_grep "plan inception_v3 uncompressed" \
  "\(326 nodes; with PipeDream's branch compression 92 nodes, 1646 states\)" -- \
  "$bin" plan --profile "$incep" --machines 4
expect_fail "plan nasnetamobile refused" 1 \
  "more than 20000 states .* 921 nodes to 290\); PipeDream's optimizer would not finish either" -- \
  "$bin" plan --profile "$src/tests/fixtures/pipedream/profiles/nasnetamobile/graph.txt" --machines 4

summary
