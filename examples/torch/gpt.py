"""A GPT written as PyTorch users write one, from profile to a pipeline on torch.distributed.

    python examples/torch/gpt.py profile --out gpt-graph.txt     # repipe.torch.profile
    repipe plan --profile gpt-graph.txt ... --config-out plan.json
    torchrun --standalone --nproc-per-node N examples/torch/gpt.py train --plan plan.json

`train` runs the plan with rt.Pipeline on gloo (CPU) or, where CUDA is there, NCCL (a GPU a
rank), prints each update's mean loss and writes the weights beside the plan. docs/python.md walks through it.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import repipe.torch as rt  # noqa: E402


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        T = x.size(1)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), 1)
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab=256, seq=64, d=128, heads=4, layers=6):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.h = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln_f, self.lm_head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for m in self.modules():  # GPT-2's initialisation
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, idx):
        b, t = idx.size()
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x)).view(b * t, -1)


def batch(n, step, seq=64, vocab=256):
    """n sequences of bytes of this file and their next bytes (a stand-in for your data)."""
    with open(__file__, "rb") as f:
        data = torch.tensor(list(f.read()), dtype=torch.long) % vocab
    g = torch.Generator().manual_seed(step)
    at = torch.randint(0, len(data) - seq - 1, (n,), generator=g)
    rows = torch.stack([data[i:i + seq + 1] for i in at.tolist()])
    return rows[:, :-1].contiguous(), rows[:, 1:].reshape(-1).contiguous()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["profile", "train"])
    ap.add_argument("--out", default="gpt-graph.txt")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--plan", default="plan.json")
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    torch.manual_seed(0)
    model = GPT()
    if a.what == "profile":
        x, _ = batch(a.micro_batch, 0)
        rt.profile(model, x, out=a.out)
        print("profile of %d parameters written to %s"
              % (sum(p.numel() for p in model.parameters()), a.out))
        return
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    pipe = rt.Pipeline(model, a.plan, loss_fn=F.cross_entropy,
                       optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3))
    n = pipe.B * pipe.GA * pipe.R  # the plan's samples per update
    for step in range(a.steps):
        x, y = batch(n, step)
        loss = pipe.step(x, y)
        if dist.get_rank() == 0:
            print("update %d: loss %.4f" % (step, loss))
    weights = pipe.state_dict()
    if dist.get_rank() == 0:  # beside the plan
        path = os.path.join(os.path.dirname(os.path.abspath(a.plan)), "gpt-trained.pt")
        torch.save(weights, path)
        print("weights gathered into " + path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
