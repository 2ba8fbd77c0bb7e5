#!/usr/bin/env python3
"""repipe beside PyTorch on a LLaMA-family model from the same weights: examples/llama-kjv.model
(4 blocks, C 128, 8 query heads on 2 key/value heads, rotary embeddings, SwiGLU, RMSNorm,
T 64, bytes), and the same model in PyTorch (tests/torch/llama_torch.py, Meta's layout,
written from the public architecture).
Both start from repipe's initial weights (exported under Meta's names, loaded with
load_state_dict), or with --from-torch from PyTorch's (its state_dict written as safetensors and
imported), and take the same 10 AdamW updates on the same micro-batches of the KJV text; prints
both sides' losses and their largest difference.

    PYTHONPATH=python REPIPE_LIBRARY=build/librepipe.so /usr/bin/python3 bench/llama_vs_torch.py \\
        [--text /usr/share/bible-kjv/...]   (default: the demo's build/kjv-train.txt)
        [--from-torch [--seed S]] [--speed ROUNDS]
"""
import argparse
import os
import sys

import numpy as np
import torch
from torch import nn

import repipe

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "torch"))
from llama_torch import Shape, Transformer  # noqa: E402 (the references' model)

SHAPE = Shape(V=256, T=64, C=128, H=8, K=2, M=344, blocks=4, eps=1e-6, theta=10000.0)
T, V = SHAPE.T, SHAPE.V


def gemm_bound(B):
    """The step's matrix products alone, as one thread runs them (numpy's matmul on its own
    OpenBLAS, best of 5 each, tokens/s): per block q and o (C x C), k and v (C x K C / H),
    gate and up (C x M), down (M x C), each head's scores and mixing (T x T x C / H); the head
    (C x V). Backward takes two products a forward one (both gradients), but none for the
    embedding's input; causal attention is counted whole, as the engine multiplies it."""
    import time
    Sh = SHAPE
    N, hd = B * Sh.T, Sh.C // Sh.H
    kv = Sh.K * hd
    blocks = [(N, Sh.C, Sh.C)] * 2 + [(N, Sh.C, kv)] * 2 + [(N, Sh.C, Sh.M)] * 2 + \
        [(N, Sh.M, Sh.C)]
    heads = [(Sh.T, hd, Sh.T), (Sh.T, Sh.T, hd)]  # every sample's and head's at once

    def best(m, k, n, batch=()):
        x = np.ones(batch + (m, k), np.float32)
        w = np.ones(batch + (k, n), np.float32)
        t = []
        for _ in range(5):
            t0 = time.perf_counter()
            x @ w
            t.append(time.perf_counter() - t0)
        return min(t)
    step = Sh.blocks * (sum(best(*s) for s in blocks) +
                        sum(best(*s, batch=(B * Sh.H,)) for s in heads)) + best(N, Sh.C, Sh.V)
    return N / (3 * step)


def speed(a, model, opt, xs, ys, torch_model):
    """Tokens per second of both trainers, rounds interleaved so that the machine's drift
    falls on both; the first update of each round is not timed (warm-up)."""
    import time
    import llama_torch
    llama_torch.ROPE_DTYPE = torch.float32
    B, U = a.batch, a.updates
    adam = torch.optim.AdamW(torch_model.parameters(), lr=0.003)
    ours, theirs = [], []
    with repipe.Session(model, repipe.Config(micro_batch_size=B, optimizer=opt)) as s:
        for _ in range(a.speed):
            for u in range(U):
                if u == 1:
                    t0 = time.perf_counter()
                s.run(xs[u * B:(u + 1) * B], ys[u * B:(u + 1) * B])
            ours.append((U - 1) * B * T / (time.perf_counter() - t0))
            for u in range(U):
                if u == 1:
                    t0 = time.perf_counter()
                x = torch.from_numpy(xs[u * B:(u + 1) * B].astype(np.int64))
                y = torch.from_numpy(ys[u * B:(u + 1) * B].astype(np.int64))
                adam.zero_grad()
                nn.functional.cross_entropy(torch_model(x).reshape(-1, V), y.reshape(-1)).backward()
                adam.step()
            theirs.append((U - 1) * B * T / (time.perf_counter() - t0))
    ratios = sorted(r / t for r, t in zip(ours, theirs))
    print("speed, one thread each, B %d, T %d, %d rounds of %d timed updates:" %
          (B, T, a.speed, U - 1))
    print("  repipe  %s tokens/s" % " ".join("%.0f" % v for v in ours))
    print("  PyTorch %s tokens/s" % " ".join("%.0f" % v for v in theirs))
    print("  repipe / PyTorch: median %.3f (range %.3f to %.3f)" %
          (ratios[len(ratios) // 2], ratios[0], ratios[-1]))
    bound = gemm_bound(B)
    best = sorted(ours)[len(ours) // 2]
    print("  bound: the step's matrix products alone %.0f tokens/s; repipe's median at %.2f of it"
          % (bound, best / bound))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--text", default=os.path.join(HERE, "..", "build", "kjv-train.txt"))
    ap.add_argument("--updates", type=int, default=10)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--from-torch", action="store_true",
                    help="start both from PyTorch's initial weights (written as safetensors "
                         "under Meta's names and imported), not repipe's")
    ap.add_argument("--seed", type=int, default=0, help="PyTorch's, for --from-torch [0]")
    ap.add_argument("--dir", default=os.path.join(HERE, "..", "build"),
                    help="where --from-torch writes its safetensors file [build]")
    ap.add_argument("--speed", type=int, metavar="ROUNDS", default=0,
                    help="then time both sides' training, one thread each, ROUNDS interleaved "
                         "rounds of --updates updates (PyTorch's rotary in float32, as Meta's "
                         "code runs it); prints tokens/s and the median ratio")
    ap.add_argument("--write-refs", metavar="FILE",
                    help="also write the windows and PyTorch's losses for tests/test_llama.c")
    a = ap.parse_args()
    torch.set_num_threads(1)
    data = np.frombuffer(open(a.text, "rb").read(), dtype=np.uint8)
    B, U = a.batch, a.updates
    starts = [(u * B + r) * 997 % (len(data) - T - 1) for u in range(U) for r in range(B)]
    xs = np.stack([data[s:s + T] for s in starts]).astype(np.float32)
    ys = np.stack([data[s + 1:s + T + 1] for s in starts]).astype(np.int32)
    opt = {"type": "adamw", "lr": 0.003, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8,
           "weight_decay": 0.0}
    model = repipe.Model.load(os.path.join(HERE, "..", "examples", "llama-kjv.model"))
    torch.manual_seed(a.seed)
    torch_model = Transformer(SHAPE)
    ours = []
    with repipe.Session(model, repipe.Config(micro_batch_size=B, optimizer=opt)) as s:
        if a.from_torch:  # PyTorch's initial weights, through a safetensors file
            path = os.path.join(a.dir, "llama-torch.safetensors")
            repipe.save_weights(path, {k: v.numpy() for k, v in
                                       torch_model.state_dict().items()})
            s.set_weights(repipe.from_llama(model, repipe.load_weights(path)))
            print("both from PyTorch's initial weights (seed %d), through %s" % (a.seed, path))
        else:  # repipe's, under Meta's names
            torch_model.load_state_dict({k: torch.from_numpy(v) for k, v in
                                         repipe.to_llama(model, s.weights()).items()})
            print("both from repipe's initial weights (seed 0)")
        for u in range(U):
            ours.append(float(np.asarray(s.run(xs[u * B:(u + 1) * B],
                                               ys[u * B:(u + 1) * B])).mean()))
    adam = torch.optim.AdamW(torch_model.parameters(), lr=0.003, betas=(0.9, 0.999), eps=1e-8,
                             weight_decay=0.0)
    theirs = []
    for u in range(U):
        x = torch.from_numpy(xs[u * B:(u + 1) * B].astype(np.int64))
        y = torch.from_numpy(ys[u * B:(u + 1) * B].astype(np.int64))
        adam.zero_grad()
        loss = nn.functional.cross_entropy(torch_model(x).reshape(-1, V), y.reshape(-1))
        loss.backward()
        adam.step()
        theirs.append(loss.item())
    print("update  repipe      PyTorch     difference")
    for u, (r, t) in enumerate(zip(ours, theirs)):
        print("%6d  %.7f   %.7f   %.1e" % (u + 1, r, t, abs(r - t)))
    print("largest difference over %d AdamW updates: %.2e" %
          (U, max(abs(r - t) for r, t in zip(ours, theirs))))
    if a.speed:
        speed(a, model, opt, xs, ys, torch_model)
    if a.write_refs:
        with open(a.write_refs, "w") as f:
            f.write("# PyTorch %s (bench/llama_vs_torch.py): examples/llama-kjv.model from "
                    "repipe's initial weights (seed 0), AdamW lr 0.003, %d updates of %d "
                    "windows of the KJV text\n" % (torch.__version__, U, B))
            for x, y in zip(xs, ys):
                f.write("window %s %d\n" % (" ".join(str(int(v)) for v in x), int(y[-1])))
            f.write("losses %s\n" % " ".join("%.9g" % t for t in theirs))


if __name__ == "__main__":
    main()
