"""A repipe plan run on torch.distributed: rt.Pipeline, inside a torchrun script.

    import repipe.torch as rt
    pipe = rt.Pipeline(module, "plan.json", loss_fn=torch.nn.functional.cross_entropy,
                       optimizer=lambda params: torch.optim.SGD(params, lr=0.1))
    loss = pipe.step(inputs, targets)   # one update on the global batch; its mean loss, everywhere
    pipe.state_dict()                   # the whole module's weights, on rank 0

The plan is an execution configuration (`repipe plan --config-out`, a repipe.Config or a
repipe.Plan) over the nodes of `repipe.torch.profile`'s profile of the same module. Every rank
passes the same global batch, micro_batch_size x gradient_accumulation_steps x
replication_factor samples; replica c takes the c-th run of gradient_accumulation_steps
micro-batches of it, as repipe's engine does. Each rank builds only its stage's part of the
module (torch_graph.Split), on the first step, from the first micro-batch.

Two runners, one result (the gradient of the batch's mean loss, then the optimizer's step):
- every stage on one worker a pipeline (R whole pipelines): PyTorch's own PipelineStage and
  schedule classes (gpipe, 1f1b, interleaved-1f1b; zb-h1, zb-h2, zb-auto, zb-v and dualpipev
  as the CSV repipe writes, through PyTorch's CSV runtime), the R pipelines' gradients averaged;
- a stage on several workers (PipeDream's [7, 1]): each worker plays its list of operations
  from repipe's schedule builder (the C library's, the one its engine runs), micro-batch m of
  a replica on stage replica m mod r_s, activations and gradients sent point to point and each
  stage's gradients summed over its workers.
A parameter that two stages read (an embedding tied to the head) is a copy on each, its
gradient summed over all of them before the step, so the copies stay equal.
"""
import atexit
import datetime
import gc
import os
import sys
import threading
import weakref

import torch
import torch.distributed as dist

import repipe
from .torch_runner import play
from .torch_stages import Building

__all__ = ["Pipeline"]


_LIVE = weakref.WeakSet()


@atexit.register
def _release_all():
    """At the interpreter's exit, before its last collection: every Pipeline's hold on
    torch.distributed let go, and collected, so that gloo's devices (and their loop threads)
    are torn down here and not in the finalizer's collection, where one in six launches of a
    zero-bubble plan aborted ("terminate called without an active exception" in
    pt_gloo_runloop)."""
    for p in list(_LIVE):
        p.close()
    gc.collect()


def _group_timeout(group, device):
    """The process group's timeout in seconds (init_process_group(timeout=)), or PyTorch's
    default where the backend does not say."""
    try:
        t = group._get_backend(torch.device(device)).options._timeout
        return t.total_seconds() if isinstance(t, datetime.timedelta) else float(t)
    except (AttributeError, RuntimeError, TypeError):
        return dist.default_pg_timeout.total_seconds()



_TORCH_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-auto", "zb-v",
                    "dualpipev")


def _config(plan):
    if isinstance(plan, repipe.Config):
        return plan
    if isinstance(plan, repipe.Plan):
        return plan.config()
    if isinstance(plan, dict):
        return repipe.Config(**plan)
    return repipe.Config.load(plan)


class Pipeline(Building):
    """One update a step() on every rank of `group` (default: the whole world), which has
    as many ranks as the plan has workers. `device`: where this rank's stage runs (default:
    the CPU on gloo, cuda:LOCAL_RANK on NCCL). runner="repipe" runs repipe's own operation
    lists where PyTorch's schedule classes would run (the same result: the tests compare
    them).

    check_batches: at every step the ranks compare a fingerprint of their batch (its shape and
    two weighted sums, one small all-gather) and their step count, and refuse, naming the
    ranks, where they differ: ranks passing different batches would each train on their own,
    and a rank that skipped a step would wait for ever. False turns it off.
    timeout: seconds a step may take before this rank ends, saying its rank and step (a peer
    alive but silent would otherwise hold it in PyTorch's point-to-point waits, which do not
    honour the process group's timeout) [the process group's timeout; 0: none].
    example: a micro-batch of inputs to build this rank's stage now (else the first step's).
    output, kwargs: as repipe.torch.profile takes them (what the loss reads of a ModelOutput or
    tuple, what every call takes); a Hugging Face model as it is needs neither."""

    def __init__(self, module, plan, *, loss_fn, optimizer, group=None, device=None,
                 runner="auto", check_batches=True, timeout=None, example=None, output=None,
                 kwargs=None):
        if not dist.is_initialized():
            raise repipe.Error("rt.Pipeline: call torch.distributed.init_process_group first "
                               "(torchrun sets the rank and world size)")
        self.module, self.loss_fn, self.make_optimizer = module, loss_fn, optimizer
        self.output, self.kwargs = output, kwargs
        self.cfg = _config(plan)
        c = self.cfg.to_dict()
        self.B = c["micro_batch_size"]
        self.GA = c["gradient_accumulation_steps"]
        self.R = c["replication_factor"]
        self.schedule = c["schedule"]
        self.v = c.get("virtual_stages", 1) or 1
        if c.get("tensor_parallel", 1) not in (0, 1):
            raise repipe.Error("rt.Pipeline: tensor_parallel is repipe's engine's; run it there")
        if c.get("recompute_layers"):
            raise repipe.Error("rt.Pipeline: recompute_layers (recomputation by layer) is repipe's "
                               "engine's; run it there")
        self.group = group or dist.group.WORLD
        self.ranks = dist.get_process_group_ranks(self.group)
        self.me = dist.get_rank(self.group)
        if self.schedule == "dualpipe":
            raise repipe.Error("rt.Pipeline: schedule dualpipe (two replicas' pipelines over the "
                               "same ranks, in opposite directions) runs on repipe's engine "
                               "('repipe train'), not on torch.distributed")
        reps = c.get("stage_replication") or []
        self.uniform = all(r == 1 for r in reps) and runner != "repipe"
        d = self.cfg.derived
        workers = self.R * d["stages"] // self.v if self.uniform else d["workers"]
        if len(self.ranks) != workers:
            raise repipe.Error("rt.Pipeline: the plan needs %d ranks (replication_factor %d, "
                               "stage_replication %s%s) and the group has %d"
                               % (workers, self.R, c.get("stage_replication") or "all 1",
                                  ", virtual_stages %d" % self.v if self.v > 1 else "",
                                  len(self.ranks)))
        if device is None:
            if dist.get_backend(self.group) == "nccl":
                device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
            else:
                device = torch.device("cpu")
        self.device = torch.device(device)
        if self.uniform and self.schedule not in _TORCH_SCHEDULES:
            raise repipe.Error("rt.Pipeline: schedule %s is not one of %s"
                               % (self.schedule, ", ".join(_TORCH_SCHEDULES)))
        self.built = False
        _LIVE.add(self)
        self.steps = 0
        self.check_batches = check_batches
        self.timeout = _group_timeout(self.group, self.device) if timeout is None else timeout
        if example is not None:
            self._build_and_meet(example[:self.B].to(self.device))

    # ---- one update -----------------------------------------------------------------------

    def _loss(self, out, target):
        return self.loss_fn(out, target)

    def step(self, inputs, targets):
        """One update on the global batch (every rank passes all of it); returns its mean
        loss, on every rank."""
        n = self.B * self.GA * self.R
        if inputs.shape[0] != n or targets.shape[0] % n:
            raise repipe.Error("rt.Pipeline.step: the plan's update takes %d samples "
                               "(micro_batch_size %d x gradient_accumulation_steps %d x "
                               "replication_factor %d); got %d inputs and %d targets"
                               % (n, self.B, self.GA, self.R, inputs.shape[0], targets.shape[0]))
        if getattr(self, "closed", False):
            raise repipe.Error("rt.Pipeline.step: the pipeline was closed")
        if self.check_batches:
            self._check_batch(inputs, targets)
        if not self.built:
            self._build_and_meet(inputs[:self.B].to(self.device))
        watchdog = None
        if self.timeout:
            watchdog = threading.Timer(self.timeout, self._timed_out)
            watchdog.daemon = True
            watchdog.start()
        try:
            k = targets.shape[0] // n  # targets a sample (a GPT's: one a position)
            lo = self.replica * self.B * self.GA
            x = inputs[lo:lo + self.B * self.GA].to(self.device)
            y = targets[lo * k:(lo + self.B * self.GA) * k].to(self.device)
            if self.uniform:
                total = self._step_uniform(x, y)
            else:
                total = self._step_runner(x, y)
            self._reduce_tied()
            if self.optimizer is not None:
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
            t = torch.tensor([total], dtype=torch.float64)
            dist.all_reduce(t, group=self.group)
        finally:
            if watchdog is not None:
                watchdog.cancel()
        self.steps += 1
        return t.item() / (self.R * self.GA)

    def close(self):
        """Lets go of this rank's schedule, stages and process groups (the module's weights
        stay in the stage modules' state_dict until then): after it, step() is refused. Called
        for every Pipeline at the interpreter's exit."""
        for name in ("runner", "dp", "dp_mine", "reduce", "tied"):
            if hasattr(self, name):
                setattr(self, name, None)
        self.closed = True

    def _check_batch(self, inputs, targets):
        """Every rank's step count and a fingerprint of its batch, gathered and compared."""
        def sums(t):
            v = t.detach().reshape(-1).to("cpu", torch.float64)
            w = torch.arange(v.numel(), dtype=torch.float64) % 1009 + 1
            return [float(v.sum()), float((v * w).sum())]
        mine = torch.tensor([self.steps, inputs.numel(), targets.numel()] + sums(inputs) +
                            sums(targets), dtype=torch.float64, device=self.device)
        every = [torch.empty_like(mine) for _ in self.ranks]
        try:
            dist.all_gather(every, mine, group=self.group)
        except RuntimeError as e:  # gloo's and NCCL's own timeout: said in repipe's words
            if "imed out" not in str(e) and "imeout" not in str(e):
                raise
            raise repipe.Error(self._silent_peer()) from e
        every = [e.cpu() for e in every]
        if self.steps != int(every[0][0]) or any(int(e[0]) != self.steps for e in every):
            counts = ", ".join("rank %d: %d" % (self.ranks[r], int(e[0]))
                               for r, e in enumerate(every))
            raise repipe.Error("rt.Pipeline.step: the ranks are at different steps (%s): a rank "
                               "that skipped one cannot meet the others again" % counts)
        differ = [self.ranks[r] for r, e in enumerate(every) if not torch.equal(e, every[0])]
        if differ:
            raise repipe.Error("rt.Pipeline.step %d: ranks %s passed a batch that differs from "
                               "rank %d's: every rank passes the same global batch (its shape "
                               "and values are compared; check_batches=False turns it off)"
                               % (self.steps, ", ".join(map(str, differ)), self.ranks[0]))

    def _timed_out(self):
        """A step took longer than the timeout: a peer alive but silent. The point-to-point
        waits of PyTorch's schedules do not honour the process group's timeout, so this rank
        says where it stood and ends."""
        sys.stderr.write(self._silent_peer() + "; ending this process\n")
        sys.stderr.flush()
        os._exit(1)

    def _silent_peer(self):
        return ("rt.Pipeline: rank %d (global %d): step %d did not finish in %g s (the "
                "timeout): a peer stopped responding" % (self.me, self.ranks[self.me],
                                                         self.steps, self.timeout))

    def _step_uniform(self, x, y):
        losses = []
        args = (x,) if self.first else ()
        kw = {"target": y, "losses": losses} if self.last else {}
        self.runner.step(*args, **kw)
        for p in self.params:  # the micro-batches' mean
            if p.grad is not None:
                p.grad.div_(self.GA)
        if self.dp_mine is not None:  # the pipelines' mean
            grads = [p.grad for p in self.params
                     if p.grad is not None and id(p) not in self.tied_ids]
            self._sum_flat("pipelines", grads, self.dp_mine)
            for g in grads:
                g.div_(self.R)
        return float(sum(l_.item() for l_ in losses))

    def _sum_flat(self, key, grads, group):
        """Sums the gradients over the group in one all-reduce a dtype, through a buffer made
        on the first step: one message rather than one a tensor, whose latencies add up (a
        GPT's hundred tensors on gloo: 0.2 s an update on 2 ranks, against 15 ms for the
        same bytes at once)."""
        flats = self.__dict__.setdefault("_flats", {})
        for dtype in sorted({g.dtype for g in grads}, key=str):
            mine = [g for g in grads if g.dtype == dtype]
            n = sum(g.numel() for g in mine)
            buf = flats.get((key, dtype))
            if buf is None or buf.numel() != n:
                buf = flats[(key, dtype)] = torch.empty(n, dtype=dtype, device=mine[0].device)
            k = 0
            for g in mine:
                buf[k:k + g.numel()].copy_(g.reshape(-1))
                k += g.numel()
            dist.all_reduce(buf, group=group)
            k = 0
            for g in mine:
                g.copy_(buf[k:k + g.numel()].view_as(g))
                k += g.numel()

    def _is_tied(self, mod, p):
        return id(p) in self.tied_ids

    def _reduce_tied(self):
        """A tied parameter's gradient: the sum over its copies, which each hold their
        stage's share (under PyTorch's schedules already a mean over micro-batches, so the
        sum over the R pipelines is divided by R, as the other gradients are)."""
        for p, g in self.tied:  # a rank's chunks share one copy
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, group=g)
            if self.uniform:
                p.grad.div_(self.R)

    # ---- repipe's runner --------------------------------------------------------------------

    def _step_runner(self, x, y):
        return play(self, x, y)

    # ---- the weights ------------------------------------------------------------------------

    def state_dict(self):
        """The whole module's state_dict, its trained parameters and buffers gathered on
        rank 0 of the group (from the first worker of the first stage holding each); other
        ranks get None."""
        if not self.built:
            raise repipe.Error("rt.Pipeline.state_dict: no stage is built yet: the stages are "
                               "made from the first step's micro-batch (or from Pipeline's "
                               "example=), so call step() first; before it the weights are "
                               "the module's own (module.state_dict())")
        owner = {}
        for s in range(self.S):
            for c, _, _ in self.split.params(s):
                owner.setdefault(c, s)
        first = self._stage_ranks()
        mine = {}
        for m, s in zip(self.stage_mods, self.my_stages):
            for c, local, _ in self.split.params(s):
                mine[c] = self._param(m, local)
        out = {}
        names = sorted(owner)
        for n in names:
            src = first[owner[n]][0]
            t = mine.get(n) if self.me == src else None
            if src == 0 and self.me == 0:
                out[n] = t.detach().clone()
                continue
            if self.me == src:
                dist.send(t.detach().contiguous(), self.ranks[0], group=self.group)
            elif self.me == 0:
                ref = self.graph._attr(n)
                buf = torch.empty_like(ref, device=self.device)
                dist.recv(buf, self.ranks[src], group=self.group)
                out[n] = buf
        if self.me != 0:
            return None
        full = {}
        for k, v in self.module.state_dict(keep_vars=True).items():
            hit = next((n for n in names if self.graph._attr(n) is v), None)
            full[k] = out[hit].cpu() if hit is not None else v.detach().clone()
        return full
