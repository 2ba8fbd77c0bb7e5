"""Under torchrun, 2 ranks: a GPT (T 64, C 128, 4 blocks of 4 heads, bytes, the head tied)
trained by PyTorch's own Schedule1F1B on two hand-written stages (embeddings and two blocks;
two blocks, the final norm and the head; the tied weight's gradient summed over both) and by rt.Pipeline on the same cut, 1f1b, GA 8,
micro-batches of 4, SGD. They take turns, each first in every other round: ROUNDS rounds of STEPS timed updates each (after 3
that warm up), and rank 0 prints one JSON line: each side's median update in ms and samples/s,
and the median of the rounds' ratios (rt.Pipeline over PyTorch's).

    torchrun --standalone --nproc-per-node 2 bench/torch_pipeline.py [ROUNDS] [STEPS]
"""
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "python"))
sys.path.insert(0, os.path.join(here, "..", "python", "tests"))
import repipe.torch as rt  # noqa: E402
import torch_models  # noqa: E402

B, GA, T, V = 4, 8, 64, 256


def gpt():
    torch.manual_seed(0)
    return torch_models.GPT(vocab=V, seq=T, d=128, heads=4, layers=4)


class First(nn.Module):
    def __init__(self, g):
        super().__init__()
        self.wte, self.wpe, self.h = g.wte, g.wpe, nn.ModuleList(g.h[:2])

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
        for b in self.h:
            x = b(x)
        return x


class Last(nn.Module):
    def __init__(self, g):
        super().__init__()
        self.h, self.ln_f, self.lm_head = nn.ModuleList(g.h[2:]), g.ln_f, g.lm_head

    def forward(self, x):
        for b in self.h:
            x = b(x)
        return self.lm_head(self.ln_f(x)).view(-1, V)


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    g = gpt()
    part = First(g) if rank == 0 else Last(g)
    stage = PipelineStage(part, rank, 2, torch.device("cpu"))
    sched = Schedule1F1B(stage, GA, loss_fn=F.cross_entropy)
    opt = torch.optim.SGD(part.parameters(), lr=0.01)

    tied = part.wte.weight if rank == 0 else part.lm_head.weight

    def theirs(x, y):
        if rank == 0:
            sched.step(x)
        else:
            sched.step(target=y)
        dist.all_reduce(tied.grad)  # the head's weight is the embedding's: one gradient
        opt.step()
        opt.zero_grad()

    pipe = rt.Pipeline(gpt(), {"micro_batch_size": B, "gradient_accumulation_steps": GA,
                               "layers_per_stage": [5, 4], "schedule": "1f1b"},
                       loss_fn=F.cross_entropy,
                       optimizer=lambda ps: torch.optim.SGD(ps, lr=0.01))
    x, y = torch_models.gpt_batch(B * GA, vocab=V, seq=T)
    sides = {"pytorch": theirs, "rt_pipeline": pipe.step}
    times = {k: [] for k in sides}
    ratios = []
    for r in range(rounds):
        per = {}
        order = list(sides.items())
        for name, fn in (order if r % 2 == 0 else order[::-1]):  # each goes first in turn
            for _ in range(3 if r == 0 else 1):
                fn(x, y)
            dist.barrier()
            ts = []
            for _ in range(steps):
                t = time.perf_counter()
                fn(x, y)
                dist.barrier()
                ts.append(time.perf_counter() - t)
            per[name] = statistics.median(ts)
            times[name] += ts
        ratios.append(per["rt_pipeline"] / per["pytorch"])
    if rank == 0:
        out = {k: {"median_update_ms": 1e3 * statistics.median(v),
                   "samples_per_s": B * GA / statistics.median(v)} for k, v in times.items()}
        out["rt_pipeline_over_pytorch"] = statistics.median(ratios)
        out["ratios"] = ratios
        print(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
