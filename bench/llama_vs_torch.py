#!/usr/bin/env python3
"""repipe beside PyTorch on a LLaMA-family model from the same weights: examples/llama-kjv.model
(4 blocks, C 128, 8 query heads on 2 key/value heads, rotary embeddings, SwiGLU, RMSNorm,
T 64, bytes), and the same model written here in PyTorch from the public architecture (Meta's
LLaMA: rotary pairs as complex numbers, key/value heads repeated for their query heads).
Both start from repipe's initial weights (exported under Meta's names, loaded with
load_state_dict), or with --from-torch from PyTorch's (its state_dict written as safetensors and
imported), and take the same 10 AdamW updates on the same micro-batches of the KJV text; prints
both sides' losses and their largest difference.

    PYTHONPATH=python REPIPE_LIBRARY=build/librepipe.so /usr/bin/python3 bench/llama_vs_torch.py \\
        [--text /usr/share/bible-kjv/...]   (default: the demo's build/kjv-train.txt)
        [--from-torch [--seed S]]
"""
import argparse
import os

import numpy as np
import torch
from torch import nn

import repipe

HERE = os.path.dirname(os.path.abspath(__file__))
T, C, H, K, HS, M, BLOCKS, V = 64, 128, 8, 2, 16, 344, 4, 256


class RMSNorm(nn.Module):
    def __init__(s, d, eps=1e-6):
        super().__init__()
        s.eps, s.weight = eps, nn.Parameter(torch.ones(d))

    def forward(s, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + s.eps) * s.weight


def rope(x, theta=10000.0):  # x: (B, T, heads, hs)
    t = x.shape[1]
    freqs = 1.0 / (theta ** (torch.arange(0, HS, 2, dtype=torch.float64) / HS))
    cis = torch.polar(torch.ones(t, HS // 2, dtype=torch.float64),
                      torch.outer(torch.arange(t, dtype=torch.float64), freqs))
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], HS // 2, 2))
    return torch.view_as_real(z * cis.view(1, t, 1, HS // 2)).flatten(-2).float()


class Attention(nn.Module):
    def __init__(s):
        super().__init__()
        s.wq, s.wk = nn.Linear(C, H * HS, bias=False), nn.Linear(C, K * HS, bias=False)
        s.wv, s.wo = nn.Linear(C, K * HS, bias=False), nn.Linear(H * HS, C, bias=False)

    def forward(s, x):
        B = x.shape[0]
        q, k = rope(s.wq(x).reshape(B, T, H, HS)), rope(s.wk(x).reshape(B, T, K, HS))
        v = s.wv(x).reshape(B, T, K, HS)
        k, v = (a.repeat_interleave(H // K, dim=2) for a in (k, v))
        q, k, v = (a.transpose(1, 2) for a in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / HS ** 0.5
        att = att.masked_fill(torch.tril(torch.ones(T, T)) == 0, float("-inf")).softmax(-1)
        return s.wo((att @ v).transpose(1, 2).reshape(B, T, H * HS))


class FeedForward(nn.Module):
    def __init__(s):
        super().__init__()
        s.w1, s.w2, s.w3 = (nn.Linear(C, M, bias=False), nn.Linear(M, C, bias=False),
                            nn.Linear(C, M, bias=False))

    def forward(s, x):
        return s.w2(nn.functional.silu(s.w1(x)) * s.w3(x))


class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.attention, s.feed_forward = Attention(), FeedForward()
        s.attention_norm, s.ffn_norm = RMSNorm(C), RMSNorm(C)

    def forward(s, x):
        h = x + s.attention(s.attention_norm(x))
        return h + s.feed_forward(s.ffn_norm(h))


class Llama(nn.Module):
    """Meta's module names (llama/model.py), so that its state_dict is Meta's."""

    def __init__(s):
        super().__init__()
        s.tok_embeddings = nn.Embedding(V, C)
        s.layers = nn.ModuleList(Block() for _ in range(BLOCKS))
        s.norm, s.output = RMSNorm(C), nn.Linear(C, V, bias=False)

    def forward(s, x):
        h = s.tok_embeddings(x)
        for layer in s.layers:
            h = layer(h)
        return s.output(s.norm(h))


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
    torch_model = Llama()
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
