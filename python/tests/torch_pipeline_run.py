"""Runs under torchrun (or fork_ranks.py, which gives each rank torchrun's environment):
trains a model with rt.Pipeline on one or more plans, each on the whole world, and (rank 0)
the same module in one process on the same global batches. Writes, per case, both runs'
losses and the final weights' largest relative difference to --out (JSON).

    torchrun --nproc-per-node 4 torch_pipeline_run.py --out r.json \\
        --case '{"name": "2x2", "model": "gpt", "plan": {...}}' ...

A case's plan is an execution configuration: a dict, or "file:PATH" for one `repipe plan
--config-out` wrote. --mutate NAME plants a fault in the runner (the tests show it is caught).
"""
import argparse
import faulthandler
import copy
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import repipe.torch as rt  # noqa: E402
import repipe.torch_graph as torch_graph  # noqa: E402
import torch_models  # noqa: E402

torch_models.share_exports()


def loss_fn(out, y):
    # a Hugging Face model's logits are (batch, positions, vocabulary), its targets (batch,
    # positions); the other models' are flat already
    return torch.nn.functional.cross_entropy(out.flatten(0, -2), y.flatten())


def optimizer(case, lr):
    """SGD [default], SGD with momentum 0.9, or AdamW (weight decay 0.01)."""
    name = case.get("optimizer", "sgd")
    if name == "sgd":
        return lambda ps: torch.optim.SGD(ps, lr=lr)
    if name == "momentum":
        return lambda ps: torch.optim.SGD(ps, lr=lr, momentum=0.9)
    if name == "adamw":
        return lambda ps: torch.optim.AdamW(ps, lr=lr, weight_decay=0.01)
    raise SystemExit("unknown optimizer " + name)


def mutate(pipe, how):
    """Planted faults, each of which the tests expect to be caught."""
    if how == "wrong-replica":  # each first-stage replica reads its neighbour's micro-batch
        orig = pipe._step_runner

        def step(x, y):
            if not pipe.first:
                return orig(x, y)
            B = pipe.B
            swapped = torch.cat([x[(j ^ 1) * B:((j ^ 1) + 1) * B] for j in range(x.shape[0] // B)])
            return orig(swapped, y)
        pipe._step_runner = step
    elif how == "no-average":  # a stage's gradients left unsummed over its replicas
        pipe.reduce = [None] * len(pipe.reduce)
    elif how == "drop-crossing":  # the gradient of the second crossing tensor dropped
        real = dist.isend

        def isend(t, *a, **kw):
            tag = kw.get("tag", 0)
            if tag % 64 == 1 and (tag // 64) % 2 == 1:
                t = torch.zeros_like(t)
            return real(t, *a, **kw)
        dist.isend = isend
    else:
        raise SystemExit("unknown mutation " + how)


def run_case(case, rank, results):
    """One case: {"name", "model", "plan"; optional "dtype" [float32], "updates" [10], "lr"
    [0.1], "optimizer" [sgd], "runner" [auto], "mutate", "ranks" [all]}. Every rank of the world takes part, or
    with "ranks" k, the first k, in a group of their own."""
    real_isend = dist.isend
    model, dtype = case["model"], getattr(torch, case.get("dtype", "float32"))
    updates, lr = case.get("updates", 10), case.get("lr", 0.1)
    plan = case["plan"]
    if isinstance(plan, str) and plan.startswith("file:"):
        plan = plan[5:]
    group = None
    if case.get("ranks"):  # a pipeline on the first ranks of the world only
        group = dist.new_group(list(range(case["ranks"])))
        if rank >= case["ranks"]:
            dist.barrier()
            return
    module = torch_models.fresh(model, dtype)
    ref = copy.deepcopy(module)
    make_opt = optimizer(case, lr)
    pipe = rt.Pipeline(module, plan, loss_fn=loss_fn, runner=case.get("runner", "auto"),
                       group=group, optimizer=make_opt)
    n = pipe.B * pipe.GA * pipe.R
    ours, theirs = [], []
    opt = make_opt(list(ref.parameters()))
    try:
        for k in range(updates):
            x, y = torch_models.batch(model, n, k)
            if x.is_floating_point():
                x = x.to(dtype)
            if k == 0 and case.get("mutate"):
                pipe._build(x[:pipe.B])
                mutate(pipe, case["mutate"])
            ours.append(pipe.step(x, y))
            if rank == 0:  # one process, the update's micro-batches in turn
                m, total = n // pipe.B, 0.0
                per = y.shape[0] // n
                for j in range(m):
                    xs = x[j * pipe.B:(j + 1) * pipe.B]
                    ys = y[j * pipe.B * per:(j + 1) * pipe.B * per]
                    # the module as one process calls it: a Hugging Face model with the
                    # arguments rt.Pipeline gave it (use_cache=False), its logits
                    out = rt.pick_output(ref(xs, **pipe.graph.kwargs), None)
                    loss = loss_fn(out, ys) / m
                    loss.backward()
                    total += loss.item()
                opt.step()
                opt.zero_grad()
                theirs.append(total)
    finally:
        dist.isend = real_isend
    sd = pipe.state_dict()
    if rank == 0:
        # each tensor's largest difference relative to its largest value, or to 1e-4 of the
        # model's largest where the tensor's is smaller: a key's bias holds rounding alone (the
        # softmax does not see it, so its gradient is zero but for rounding)
        worst, worst_key = 0.0, None
        floor = 1e-4 * max(t.abs().max().item() for t in ref.parameters())
        for key, t in ref.named_parameters(remove_duplicate=False):
            t = t.detach()
            d = (sd[key].to(t.dtype) - t).abs().max().item()
            rel = d / max(t.abs().max().item(), floor, 1e-30)
            if rel > worst:
                worst, worst_key = rel, key
        results[case["name"]] = {"losses": ours, "ref_losses": theirs, "weights_rel": worst,
                                 "worst": worst_key, "schedule": pipe.schedule,
                                 "uniform": pipe.uniform, "stages": pipe.S,
                                 "stage_replication": pipe.cfg.to_dict().get("stage_replication"),
                                 "replication_factor": pipe.R}
    dist.barrier()


def arguments(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", action="append", required=True, help="a case, as JSON")
    ap.add_argument("--out", required=True)
    return ap.parse_args(argv)


def prepare(argv):
    """fork_ranks.py --prepare: each case's model made and exported once, before the ranks
    fork, as each rank's rt.Pipeline will export it (its first micro-batch)."""
    for text in arguments(argv).case:
        case = json.loads(text)
        plan = case["plan"]
        if isinstance(plan, str):
            with open(plan[5:]) as f:
                plan = json.load(f)
        dtype = getattr(torch, case.get("dtype", "float32"))
        module = torch_models.fresh(case["model"], dtype)
        x, _ = torch_models.batch(case["model"], plan.get("micro_batch_size", 1), 0)
        if x.is_floating_point():
            x = x.to(dtype)
        torch_graph._export(module, (x,), torch_graph.call_kwargs(module))


def main():
    a = arguments()
    torch.set_num_threads(1)
    if os.environ.get("REPIPE_TEST_STACKS"):  # a hang's stacks, after that many seconds
        faulthandler.dump_traceback_later(int(os.environ["REPIPE_TEST_STACKS"]), exit=True)
    dist.init_process_group("gloo")
    rank, results = dist.get_rank(), {}
    for text in a.case:
        run_case(json.loads(text), rank, results)
    if rank == 0:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
