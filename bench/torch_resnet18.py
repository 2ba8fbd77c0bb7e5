#!/usr/bin/env python3
"""torchvision's resnet18 for Fashion-MNIST (its first convolution for 1 channel, 10
classes), or with --arch resnet50 --size 64 torchvision's resnet50 on 3 x 64 x 64 images
(random, 10 classes, as bench_train --synthetic 10 feeds repipe): --export FILE writes it
as a repipe spec (repipe.torch.export); --steps N times PyTorch training it as bench_train
times repipe — --warmup updates (20), then N updates of --batch samples with SGD — and
prints one JSON line."""
import argparse
import json
import os
import tempfile
import time

import numpy as np
import torch
import torchvision

import repipe
import repipe.torch


def model(arch="resnet18"):
    torch.manual_seed(0)
    if arch == "resnet50":
        return torchvision.models.resnet50(num_classes=10)
    m = torchvision.models.resnet18(num_classes=10)
    m.conv1 = torch.nn.Conv2d(1, 64, 7, 2, 3, bias=False)
    return m


def data(arch, size):
    """Fashion-MNIST for resnet18; 4096 random 3-channel images of size x size for resnet50."""
    if arch == "resnet50":
        g = torch.Generator().manual_seed(1)
        return (torch.randn(4096, 3, size, size, generator=g),
                torch.randint(0, 10, (4096,), generator=g))
    x, y = repipe.fashion_mnist()
    return torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--export")
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--arch", choices=("resnet18", "resnet50"), default="resnet18")
    ap.add_argument("--size", type=int, default=28)
    ap.add_argument("--warmup", type=int, default=20)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.export:
        with tempfile.TemporaryDirectory() as tmp:
            shape = (2, 3, a.size, a.size) if a.arch == "resnet50" else (2, 1, 28, 28)
            repipe.torch.export(model(a.arch), torch.zeros(*shape), model=a.export,
                                weights=os.path.join(tmp, "w.rpw"))
    if not a.steps:
        return
    x, y = data(a.arch, a.size)
    m = model(a.arch)
    m.train()
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    B, warmup = a.batch, a.warmup
    for k in range(warmup + a.steps):
        if k == warmup:
            t0 = time.time()
        at = (k * B) % (len(x) - B)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(m(x[at:at + B]), y[at:at + B])
        loss.backward()
        opt.step()
    dt = time.time() - t0
    print(json.dumps({"model": a.arch, "mode": "torch%s" % torch.__version__, "batch": B,
                      "samples_per_s": round(a.steps * B / dt, 1),
                      "final_loss": round(loss.item(), 4)}))


if __name__ == "__main__":
    main()
