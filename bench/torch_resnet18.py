#!/usr/bin/env python3
"""torchvision's resnet18 for Fashion-MNIST (its first convolution for 1 channel, 10
classes): --export FILE writes it as a repipe spec (repipe.torch.export); --steps N times
PyTorch training it as bench_train times repipe — 20 warm-up updates, then N updates of
--batch samples from Fashion-MNIST with SGD — and prints one JSON line."""
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


def model():
    torch.manual_seed(0)
    m = torchvision.models.resnet18(num_classes=10)
    m.conv1 = torch.nn.Conv2d(1, 64, 7, 2, 3, bias=False)
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--export")
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.export:
        with tempfile.TemporaryDirectory() as tmp:
            repipe.torch.export(model(), torch.zeros(2, 1, 28, 28), model=a.export,
                                weights=os.path.join(tmp, "w.rpw"))
    if not a.steps:
        return
    x, y = repipe.fashion_mnist()
    x, y = torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))
    m = model()
    m.train()
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    B, warmup = a.batch, 20
    for k in range(warmup + a.steps):
        if k == warmup:
            t0 = time.time()
        at = (k * B) % (len(x) - B)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(m(x[at:at + B]), y[at:at + B])
        loss.backward()
        opt.step()
    dt = time.time() - t0
    print(json.dumps({"model": "resnet18", "mode": "torch%s" % torch.__version__, "batch": B,
                      "samples_per_s": round(a.steps * B / dt, 1),
                      "final_loss": round(loss.item(), 4)}))


if __name__ == "__main__":
    main()
