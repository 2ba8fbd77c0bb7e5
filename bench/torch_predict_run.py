"""Runs under torchrun for bench/torch_predict.py: rt.Pipeline's time per update on gloo ranks,
case by case, and the point-to-point link between ranks 0 and 1.

    torchrun --nproc-per-node 2 bench/torch_predict_run.py --out r.json --model 8,256,4,128,2048 \\
        --rounds 3 --steps 4 --case '{"name": "1f1b", "plan": {...}}' ...

Every rank computes on one thread. The cases take turns, round after round (each round a
warm-up update, then --steps timed ones, their median); rank 0 writes each case's rounds and the
link's latency and bandwidth (the best of a ping-pong's round trips, small and large messages).
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import repipe.torch as rt  # noqa: E402
from repipe.calibrate import GPT  # noqa: E402


def link(rank, nbytes):
    """(seconds a message, bytes/s) between ranks 0 and 1: the best round trip of a 4-byte
    message, halved, and of an nbytes one."""
    def trip(n, reps):
        t = torch.zeros(max(1, n // 4))
        best = float("inf")
        for _ in range(reps):
            dist.barrier()
            t0 = time.perf_counter()
            if rank == 0:
                dist.send(t, 1)
                dist.recv(t, 1)
            elif rank == 1:
                dist.recv(t, 0)
                dist.send(t, 0)
            best = min(best, time.perf_counter() - t0)
        return best / 2
    latency = trip(4, 50)
    big = trip(nbytes, 20)
    return latency, nbytes / max(big - latency, 1e-9)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", required=True, help="layers,hidden,heads,seq,vocab")
    ap.add_argument("--case", action="append", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    L, H, A, S, V = (int(v) for v in a.model.split(","))
    cases = [json.loads(c) for c in a.case]
    pipes = []
    for c in cases:
        torch.manual_seed(0)
        pipe = rt.Pipeline(GPT(L, H, A, S, V), c["plan"],
                           loss_fn=torch.nn.functional.cross_entropy,
                           optimizer=lambda ps: torch.optim.SGD(ps, lr=1e-3),
                           runner=c.get("runner", "auto"))
        pipes.append(pipe)
    g = torch.Generator().manual_seed(0)

    def batch(pipe):
        n = pipe.B * pipe.GA * pipe.R
        idx = torch.randint(0, V, (n, S + 1), generator=g)
        return idx[:, :-1].contiguous(), idx[:, 1:].reshape(-1).contiguous()

    rounds = {c["name"]: [] for c in cases}
    for r in range(a.rounds):
        for c, pipe in zip(cases, pipes):
            x, y = batch(pipe)
            for _ in range(2 if r == 0 else 1):
                pipe.step(x, y)
            times = []
            for _ in range(a.steps):
                dist.barrier()
                t0 = time.perf_counter()
                pipe.step(x, y)
                times.append(time.perf_counter() - t0)
            rounds[c["name"]].append(statistics.median(times))
    latency, bandwidth = (link(rank, 4 * H * S * cases[0]["plan"]["micro_batch_size"])
                          if dist.get_world_size() > 1 else (0.0, 0.0))
    if rank == 0:
        with open(a.out, "w") as f:
            json.dump({"rounds": rounds, "latency": latency, "bandwidth": bandwidth,
                       "world": dist.get_world_size()}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
