#!/usr/bin/env python3
"""PyTorch beside repipe on the example ResNet (examples/fmnist-resnet.model written here in
PyTorch from its spec): the recipe of `repipe train` with examples/fmnist-resnet.json's
plan — SGD, lr 0.01, momentum 0.9, updates of 4 micro-batches of 64 (batchnorm's statistics
per micro-batch, as 4 data-parallel replicas keep them), repipe's sample order — and the test
accuracy after --epochs. Its own initial weights (PyTorch's defaults).

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
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    x, y = repipe.fashion_mnist()
    xt, yt = repipe.fashion_mnist(train=False)
    micro, per_update = 64, 256
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
    print("PyTorch %s: %d updates of %d in %.1f s; test accuracy: %.4f" %
          (torch.__version__, updates, per_update, took, acc))


if __name__ == "__main__":
    main()
