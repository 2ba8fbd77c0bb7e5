#!/usr/bin/env python3
"""PyTorch beside repipe on a ResNet: the example (examples/fmnist-resnet.model written here
in PyTorch from its spec) or torchvision's resnet18 for Fashion-MNIST (--model resnet18), with
the recipe of `repipe train` on examples/fmnist-resnet.json's plan — SGD, lr 0.01, momentum
0.9, 256 samples an update in micro-batches of --micro (batchnorm's statistics per
micro-batch, as the plan's workers keep them), repipe's sample order — and the test accuracy
after --epochs. PyTorch's own initial weights.

    PYTHONPATH=python REPIPE_LIBRARY=build/librepipe.so /usr/bin/python3 bench/torch_resnet.py
"""
import argparse
import time

import numpy as np
import torch
from torch import nn

import repipe


class Block(nn.Module):
    def __init__(s, cin, cout, stride):
        super().__init__()
        s.c1, s.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        s.c2, s.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        s.skip = None
        if stride != 1 or cin != cout:
            s.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                   nn.BatchNorm2d(cout))

    def forward(s, x):
        y = s.b2(s.c2(torch.relu(s.b1(s.c1(x)))))
        return torch.relu(y + (x if s.skip is None else s.skip(x)))


def resnet():
    return nn.Sequential(nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                         Block(16, 16, 1), Block(16, 32, 2), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(32, 10))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--model", choices=("example", "resnet18"), default="example")
    ap.add_argument("--micro", type=int, default=64)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    x, y = repipe.fashion_mnist()
    xt, yt = repipe.fashion_mnist(train=False)
    micro, per_update = a.micro, 256
    if a.model == "resnet18":
        import torchvision
        model = torchvision.models.resnet18(num_classes=10)
        model.conv1 = nn.Conv2d(1, 64, 7, 2, 3, bias=False)
    else:
        model = resnet()
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    stream = repipe.Stream(a.seed, len(x), per_update)
    updates = a.epochs * (len(x) // per_update)
    start = time.time()
    model.train()
    for u in range(updates):
        ids = stream.update(u)
        opt.zero_grad()
        for k in range(0, per_update, micro):
            rows = ids[k:k + micro]
            loss = nn.functional.cross_entropy(model(torch.from_numpy(x[rows])),
                                               torch.from_numpy(y[rows].astype(np.int64)))
            (loss * micro / per_update).backward()
        opt.step()
    took = time.time() - start
    model.eval()
    with torch.no_grad():
        pred = torch.cat([model(torch.from_numpy(xt[k:k + 1000])).argmax(1)
                          for k in range(0, len(xt), 1000)])
    acc = (pred.numpy() == yt).mean()
    print("PyTorch %s, %s: %d updates of %d in micro-batches of %d, %.1f s; test accuracy: "
          "%.4f" % (torch.__version__, a.model, updates, per_update, micro, took, acc))


if __name__ == "__main__":
    main()
