#!/usr/bin/env python3
"""Writes tests/torch/MODEL.model and tests/torch/MODEL_losses.txt for two models:
torchvision's resnet18 (its first convolution for 1 channel, 10 classes) and a small
DenseNet-style network written here (BN-ReLU-conv layers whose outputs are concatenated to
their inputs, a transition between two blocks), each as repipe.torch.export writes it, and
PyTorch's first 10 losses training it with SGD and momentum, for tests/test_resnet.c to
compare against (the test needs no torch). Run from the repository with Debian's
python3-torch and python3-torchvision, the library built:

    REPIPE_LIBRARY=build/librepipe.so PYTHONPATH=python \\
        /usr/bin/python3 tests/torch/make_resnet_refs.py tests/torch

Every parameter and batchnorm statistic, every input and label comes from the integer
formula value() that the C test computes identically (initial()), so the files hold no
weights. Two
recipes, each 10 updates of 16 samples: one micro-batch of 16 per update; and micro-batches
of 4, four per update, accumulated (batch statistics per micro-batch), as 2 replicas x 2
accumulation steps run them, replica-major. Beside PyTorch's float64 and float32 losses, each
recipe's float32_spread: per loss, the furthest that float32 runs came from float64, the plain
one and NUDGED from starts one float32 step away (every value moved up, down or not): resnet18
at 28 x 28 normalises 1 x 1 planes over a micro-batch, so rounding alone moves its second loss
by 2e-2 from some such starts, and no single float32 run bounds another's.
"""
import math
import os
import sys

import torch
import torchvision

import repipe
import repipe.torch as rtorch
from repipe.torch_export import _convert

torch.set_default_dtype(torch.float32)
torch.set_num_threads(1)

UPDATES, PER_UPDATE, LR, MOMENTUM = 10, 16, 0.01, 0.9
NUDGED = 8  # float32 runs from nudged starts, for each loss's float32 spread


def value(i, salt, scale):
    return (((i * 7919 + salt * 104729) % 2003) / 2003.0 - 0.5) * scale


def tensor(n, salt, scale, shape, first=0):
    return torch.tensor([value(first + i, salt, scale) for i in range(n)],
                        dtype=torch.float64).float().reshape(shape)


def initial(v, shape, suffix):
    """repipe's variable v: weights uniform in +-0.5 / sqrt(fan_in), a batchnorm's weight
    and running variance around 1, biases and running means around 0 (salt 100 + v)."""
    n = 1
    for d in shape:
        n *= d
    if len(shape) >= 2:
        return tensor(n, 100 + v, 1.0 / math.sqrt(n // shape[0]), shape)
    x = tensor(n, 100 + v, 0.2, shape)
    return x + 1 if suffix in ("weight", "running_var") else x


class DenseLayer(torch.nn.Module):
    def __init__(s, cin, growth):
        super().__init__()
        s.bn = torch.nn.BatchNorm2d(cin)
        s.conv = torch.nn.Conv2d(cin, growth, 3, padding=1, bias=False)

    def forward(s, x):
        return torch.cat([x, s.conv(torch.relu(s.bn(x)))], dim=1)


class DenseNet(torch.nn.Module):
    def __init__(s):
        super().__init__()
        nn = torch.nn
        s.stem = nn.Conv2d(1, 8, 3, padding=1, bias=False)
        s.block1 = nn.Sequential(DenseLayer(8, 4), DenseLayer(12, 4))
        s.transition = nn.Sequential(nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 8, 1, bias=False),
                                     nn.AvgPool2d(2))
        s.block2 = nn.Sequential(DenseLayer(8, 4), DenseLayer(12, 4))
        s.head = nn.Sequential(nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                               nn.Flatten(), nn.Linear(16, 10))

    def forward(s, x):
        return s.head(s.block2(s.transition(s.block1(s.stem(x)))))


def model(name="resnet18"):
    if name == "resnet18":
        m = torchvision.models.resnet18(num_classes=10)
        m.conv1 = torch.nn.Conv2d(1, 64, 7, 2, 3, bias=False)
    else:
        m = DenseNet()
    _, _, variables = _convert(m)
    state = m.state_dict()
    v = 0
    with torch.no_grad():
        for var in variables:
            for suffix, key in var:
                t = state[key]
                t.copy_(initial(v, tuple(t.shape), suffix))
                v += 1
    return m


DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fmnist160")
_images = None


def batch(u):
    """Update u's 16 samples: Fashion-MNIST's training images 16 u to 16 u + 15 (the first
    160 of them are in fmnist160/), scaled to [0, 1] as repipe reads them."""
    global _images
    if _images is None:
        _images = repipe.fashion_mnist(DATA)
    x, y = _images
    k = slice(u * PER_UPDATE, (u + 1) * PER_UPDATE)
    return torch.from_numpy(x[k].copy()), torch.from_numpy(y[k].astype("int64"))


def nudge(m, seed):
    """Moves each parameter and statistic of m one float32 step up or down, or leaves it
    (a third each, from seed's stream): an equally good float32 start."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in m.state_dict().values():
            if not t.is_floating_point():
                continue
            step = torch.randint(0, 3, t.shape, generator=g) - 1
            moved = torch.nextafter(t, torch.where(step > 0, torch.full_like(t, math.inf),
                                                   torch.full_like(t, -math.inf)))
            t.copy_(torch.where(step == 0, t, moved))


def train(micro, dtype=torch.float64, name="resnet18", seed=0):
    m = model(name).to(dtype)
    if seed:
        nudge(m, seed)
    m.train()
    opt = torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM)
    losses = []
    for u in range(UPDATES):
        x, y = batch(u)
        x = x.to(dtype)
        opt.zero_grad()
        for k in range(0, PER_UPDATE, micro):
            loss = torch.nn.functional.cross_entropy(m(x[k:k + micro]), y[k:k + micro])
            (loss * micro / PER_UPDATE).backward()
            losses.append(loss.item())
        opt.step()
    return losses


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    for name in ("resnet18", "densenet"):
        unused = os.path.join(out, name + "-unused.rpw")
        rtorch.export(model(name), torch.zeros(2, 1, 28, 28),
                      model=os.path.join(out, name + ".model"), weights=unused)
        os.remove(unused)
        with open(os.path.join(out, name + "_losses.txt"), "w") as f:
            f.write("# PyTorch %s, torchvision %s: make_resnet_refs.py\n" %
                    (torch.__version__, torchvision.__version__))
            for micro in (16, 4):  # PyTorch in float64, then its float32 run beside it
                runs = {}
                for kind, dtype in (("float64", torch.float64), ("float32", torch.float32)):
                    runs[kind] = train(micro, dtype, name)
                    f.write("micro_batch %d %s %s\n" % (micro, kind, " ".join(
                        "%.9g" % v for v in runs[kind])))
                # how far float32 rounding alone takes each loss: the float32 run and
                # NUDGED more from starts one float32 step away, against float64
                spread = [abs(a - b) for a, b in zip(runs["float32"], runs["float64"])]
                for seed in range(1, NUDGED + 1):
                    spread = [max(d, abs(a - b)) for d, a, b in
                              zip(spread, train(micro, torch.float32, name, seed),
                                  runs["float64"])]
                f.write("micro_batch %d float32_spread %s\n" % (micro, " ".join(
                    "%.3g" % v for v in spread)))


if __name__ == "__main__":
    main()
