"""Runs under torchrun: one of rt.Pipeline's faults (test_torch_faults.py), by name.

    torchrun --nproc-per-node 3 torch_faults_run.py CASE[,CASE...] DIR

- stuck: rank 1 stops responding (alive, asleep) before its third step; the process group's
  timeout is 8 s. The other ranks must end on their own, saying their rank and step (at the
  step's check of the batches). stuck-inside: the same with check_batches=False, so that the
  others wait inside the step's point-to-point exchanges.
- batches: rank 1 passes another global batch than the others.
- skipped: rank 1's second batch is one sample short; it catches the error and goes on.
- relu: a stage that holds only a ReLU (no parameters) trains as one process does.
- early: state_dict() before the first step.
Each rank writes what it met in each case (its losses or its error) to DIR/CASE.RANK.json.
Cases named together run one after another in the same process group, each on a Pipeline of
its own (every case but the stuck ones ends with the ranks in step, each refusal raised on all
of them at the same check), so that one launch pays PyTorch's start once.
"""
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import repipe  # noqa: E402
import repipe.torch as rt  # noqa: E402


def mlp():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def batch(k, n=8):
    g = torch.Generator().manual_seed(50 + k)
    return torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g)


def main():
    cases, out = sys.argv[1].split(","), sys.argv[2]
    stuck = cases[0].startswith("stuck")
    if stuck and len(cases) > 1:
        raise SystemExit("torch_faults_run.py: a stuck case runs alone (it ends the launch)")
    # 8 s where a peer is silent on purpose; elsewhere time enough for a loaded machine to
    # make the pipeline's groups (their creation waits within the timeout too)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=8 if stuck else 120))
    rank = dist.get_rank()
    for case in cases:
        met = run_case(case, rank)
        with open(os.path.join(out, "%s.%d.json" % (case, rank)), "w") as f:
            json.dump(met, f)
        dist.barrier()
    if stuck:  # (torchrun then ends the sleeper)
        # torchrun ends every rank once one exits with an error: the first to time out waits
        # for the other's report, whose step may have started a little later
        deadline = time.monotonic() + 30
        while (time.monotonic() < deadline and
               not all(os.path.exists(os.path.join(out, "%s.%d.json" % (cases[0], r)))
                       for r in (0, 2))):
            time.sleep(0.1)
        sys.exit(3)
    dist.destroy_process_group()


def run_case(case, rank):
    """The case on this rank: what it met (its losses, what it caught, the error that ended
    it)."""
    plan = {"micro_batch_size": 2, "gradient_accumulation_steps": 4,
            "layers_per_stage": [1, 1, 1], "schedule": "1f1b"}
    pipe = rt.Pipeline(mlp(), plan, loss_fn=torch.nn.functional.cross_entropy,
                       optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
                       check_batches=case != "stuck-inside")
    met = {"rank": rank, "losses": []}
    try:
        if case == "early":
            pipe.state_dict()
        for k in range(4):
            x, y = batch(k)
            if case.startswith("stuck") and rank == 1 and k == 2:
                time.sleep(600)  # alive, silent
            if case == "batches" and rank == 1:
                x = x + 1
            if case == "skipped" and rank == 1 and k == 1:
                try:
                    pipe.step(x[:-1], y[:-1])
                except repipe.Error as e:  # caught, and on to the next batch
                    met["caught"] = str(e)
                continue
            met["losses"].append(pipe.step(x, y))
        if case == "relu":  # the same updates in one process
            met.update(reference(pipe, rank))
    except repipe.Error as e:
        met["error"] = str(e)
    pipe.close()
    return met


def reference(pipe, rank):
    """The relu case's updates in one process: their losses, and (rank 0) the largest
    relative difference of any weight from the pipeline's."""
    ref = mlp()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    met = {"ref_losses": []}
    for k in range(4):
        x, y = batch(k)
        opt.zero_grad()
        total = 0.0
        for j in range(4):
            loss = torch.nn.functional.cross_entropy(ref(x[2 * j:2 * j + 2]),
                                                     y[2 * j:2 * j + 2]) / 4
            loss.backward()
            total += loss.item()
        opt.step()
        met["ref_losses"].append(total)
    sd = pipe.state_dict()
    if rank == 0:
        met["weights_rel"] = max(float((sd[n] - p).abs().max() / p.abs().max())
                                 for n, p in ref.state_dict().items())
    return met


if __name__ == "__main__":
    main()
