#!/bin/sh
# torchvision's resnet18 for Fashion-MNIST (docs/python.md): exported from PyTorch, profiled,
# planned for 2 servers of 2 workers, trained by repipe on the plan, and its trained weights
# put back into the PyTorch module. PyTorch and torchvision come from the project's
# environment (scripts/python-env makes it once).
# Usage: examples/resnet18.sh [BUILD_DIR] [EPOCHS] (in a scratch directory of your choice:
# it writes its files into the current one)
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
epochs=${2:-1}
repipe=$build/repipe
export PYTHONPATH=$src/python REPIPE_LIBRARY=$build/librepipe.so
py=$(sh "$src/scripts/python-env")
cat > resnet18.py <<'PY'
import sys, torch, torchvision, repipe.torch
def resnet18():
    torch.manual_seed(0)
    m = torchvision.models.resnet18(num_classes=10)
    m.conv1 = torch.nn.Conv2d(1, 64, 7, 2, 3, bias=False)      # one channel in
    return m
if sys.argv[1] == "export":
    repipe.torch.export(resnet18(), torch.zeros(64, 1, 28, 28), model="resnet18.model",
                        weights="resnet18.rpw")
else:                                                          # trained weights back
    m = repipe.torch.load(resnet18(), "trained.rpw")
    print("trained weights loaded into the PyTorch module: fc.bias", m.fc.bias.data[:3].tolist())
PY
"$py" resnet18.py export
"$repipe" profile --model resnet18.model --out resnet18.txt
"$repipe" plan --profile resnet18.txt --machines 2 2 --min-micro-batch 16 \
  --base-config "$src/examples/fmnist-resnet.json" --config-out resnet18.json > plan.txt
"$repipe" train --model resnet18.model --load resnet18.rpw --config resnet18.json \
  --epochs "$epochs" --save trained.rpw
"$py" resnet18.py load
