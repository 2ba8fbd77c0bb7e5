#!/bin/sh
# Launches a zero-bubble (zb-h2) plan of a GPT of nn.TransformerEncoderLayer under torchrun,
# float64 on gloo, 5 updates, then destroy_process_group(), N times (2 and 3 ranks in turn),
# and counts the launches that failed: one in six aborted at exit ("terminate called without
# an active exception" in gloo's loop thread) until rt.Pipeline let go of its process groups
# at exit (test_torch_faults.py tests that it does).
#   tests/torch_teardown_loop.sh BUILD [N]      (N: 50)
set -u
build=${1:?usage: torch_teardown_loop.sh BUILD [N]}
n=${2:-50}
here=$(cd "$(dirname "$0")/.." && pwd)
py=$(sh "$here/scripts/python-env") || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/run.py" <<PY
import sys, torch, torch.distributed as dist
sys.path.insert(0, "$here/python")
import repipe.torch as rt
class GPT(torch.nn.Module):
    def __init__(s):
        super().__init__()
        s.emb = torch.nn.Embedding(64, 32)
        s.layers = torch.nn.ModuleList([torch.nn.TransformerEncoderLayer(
            32, 4, 64, dropout=0.0, batch_first=True) for _ in range(4)])
        s.head = torch.nn.Linear(32, 64)
    def forward(s, x):
        h = s.emb(x)
        for l in s.layers:
            h = l(h)
        return s.head(h).flatten(0, 1)
dist.init_process_group("gloo")
torch.manual_seed(1)
n = dist.get_world_size()
pipe = rt.Pipeline(GPT().double(), {"micro_batch_size": 2, "gradient_accumulation_steps": 4,
                   "layers_per_stage": [-1] * n, "schedule": "zb-h2"},
                   loss_fn=torch.nn.functional.cross_entropy,
                   optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
g = torch.Generator().manual_seed(0)
for k in range(5):
    pipe.step(torch.randint(0, 64, (8, 16), generator=g), torch.randint(0, 64, (128,), generator=g))
dist.destroy_process_group()
PY
failed=0
i=0
while [ $i -lt "$n" ]; do
  np=$((2 + i % 2))
  if ! REPIPE_LIBRARY="$build/librepipe.so" OMP_NUM_THREADS=1 "$py" -m torch.distributed.run \
       --standalone --nproc-per-node $np "$tmp/run.py" > "$tmp/out" 2>&1; then
    failed=$((failed + 1))
    grep -m1 "terminate\|Error" "$tmp/out"
  fi
  i=$((i + 1))
done
echo "$failed of $n launches failed"
[ $failed -eq 0 ]
