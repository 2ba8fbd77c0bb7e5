"""repipe's runner for rt.Pipeline: each worker plays its list of operations from the C
library's schedule builder (the one repipe's engine runs, checked free of waits first) on
torch.distributed, for plans PyTorch's schedule classes cannot express (a stage on several
workers: PipeDream's [7, 1]). Micro-batch m of a replica runs on stage replica m mod r_s;
activations and gradients go point to point, each tagged by micro-batch, direction and
tensor; a stage's gradients are summed over its workers at the schedule's REDUCE.
"""
import collections
import ctypes

import torch
import torch.distributed as dist

import repipe
from repipe._lib import (BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT, FORWARD, RECV_ACT,
                         RECV_GRAD, REDUCE, SEND_ACT, SEND_GRAD, WAIT_SENDS, _Err, _check,
                         _Workplan, _workplan_build, _workplan_check, _workplan_free)

__all__ = ["worker_ops", "play", "Worker", "Op"]

# A worker of the plan and one of its operations, as rp_workplan holds them.
Worker = collections.namedtuple("Worker", "stage replica stage_replica ops")
Op = collections.namedtuple("Op", "kind mb peer")


class _Held:
    """What a micro-batch keeps on this worker between its operations: the stage's
    inputs, its outputs (the scaled loss on the last stage) and the outputs' gradients."""
    __slots__ = ("ins", "outs", "grads")

    def __init__(self, ins):
        self.ins, self.outs, self.grads = ins, None, None


def worker_ops(cfg):
    """Each worker's operations for one update, [Worker], built and checked by the C
    library."""
    wp, err = ctypes.POINTER(_Workplan)(), _Err()
    _check(_workplan_build(cfg._buf, ctypes.byref(wp), ctypes.byref(err)), err)
    try:
        _check(_workplan_check(wp, None, ctypes.byref(err)), err)
        if wp.contents.devices:
            raise repipe.Error("rt.Pipeline runs chunked schedules (interleaved-1f1b, zb-v, "
                               "dualpipev) "
                               "only where every stage has one worker a pipeline")
        out = []
        for i in range(wp.contents.workers):
            w = wp.contents.w[i]
            out.append(Worker(w.stage, w.replica, w.stage_replica,
                              [Op(w.ops[k].kind, w.ops[k].mb, w.ops[k].peer)
                               for k in range(w.num_ops)]))
        return out
    finally:
        _workplan_free(wp)



def _tag(mb, kind, i):
    """A message's tag: its micro-batch, activation (0) or gradient (1), and tensor."""
    return ((mb * 2 + kind) * 64 + i) % (1 << 30)


def play(pipe, x, y):
    """One update of rt.Pipeline `pipe` on this rank's worker: its operations in order, on its
    share of the batch (x, y); returns the sum of its micro-batches' losses (the last stage's;
    0 elsewhere)."""
    mod = pipe.stage_mods[0]
    scale = 1.0 / (pipe.R * pipe.GA)
    held, pending, total = {}, [], 0.0
    peer = lambda w: pipe.ranks[w]  # noqa: E731
    for kind, mb, w in pipe.my_ops:
        if kind == RECV_ACT:
            ins = []
            for i, (shape, dtype) in enumerate(pipe.recv_meta):
                t = torch.empty(shape, dtype=dtype, device=pipe.device)
                dist.recv(t, peer(w), group=pipe.group, tag=_tag(mb, 0, i))
                ins.append(t.requires_grad_(t.is_floating_point()))
            held[mb] = _Held(ins)
        elif kind == FORWARD:
            if pipe.first:
                held[mb] = _Held([x[mb * pipe.B:(mb + 1) * pipe.B]])
            h = held[mb]
            out = mod(*h.ins)
            if pipe.last:
                k = y.shape[0] // x.shape[0]
                loss = pipe.loss_fn(out, y[mb * pipe.B * k:(mb + 1) * pipe.B * k])
                total += loss.item()
                h.outs = [loss * scale]
            else:
                h.outs = list(out)
        elif kind == SEND_ACT:
            for i, t in enumerate(held[mb].outs):
                pending.append(dist.isend(t.detach(), peer(w), group=pipe.group,
                                          tag=_tag(mb, 0, i)))
        elif kind == RECV_GRAD:
            grads = []
            for i, (shape, dtype) in enumerate(pipe.send_meta):
                if dtype.is_floating_point:
                    t = torch.empty(shape, dtype=dtype, device=pipe.device)
                    dist.recv(t, peer(w), group=pipe.group, tag=_tag(mb, 1, i))
                    grads.append(t)
                else:
                    grads.append(None)
            held[mb].grads = grads
        elif kind in (BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT):
            ins, outs = held[mb].ins, held[mb].outs
            grads = held[mb].grads if not pipe.last else [None]
            pairs = [(o, g) for o, g in zip(outs, grads)
                     if o.requires_grad and (g is not None or pipe.last)]
            if not pairs:
                continue
            o, g = zip(*pairs)
            g = None if pipe.last else list(g)
            if kind == BACKWARD:
                torch.autograd.backward(list(o), g)
            elif kind == BACKWARD_INPUT:  # B: the inputs' gradient only
                wants = [t for t in ins if t.requires_grad]
                got = torch.autograd.grad(list(o), wants, g, retain_graph=True,
                                          allow_unused=True) if wants else []
                for t, gr in zip(wants, got):
                    t.grad = gr
            else:  # W: the weights'
                torch.autograd.backward(list(o), g, inputs=pipe.stage_params)
        elif kind == SEND_GRAD:
            for i, t in enumerate(held[mb].ins):
                if t.is_floating_point():
                    gr = t.grad if t.grad is not None else torch.zeros_like(t)
                    pending.append(dist.isend(gr, peer(w), group=pipe.group,
                                              tag=_tag(mb, 1, i)))
        elif kind == WAIT_SENDS:
            for h in pending:
                h.wait()
            pending = []
            held.clear()
        elif kind == REDUCE:
            g = pipe.reduce[pipe.my_stages[0]]
            for p in mod.parameters():
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            if g is not None:
                pipe._sum_flat("stage", [p.grad for p in mod.parameters()
                                         if not pipe._is_tied(mod, p)], g)
    for h in pending:
        h.wait()
    return total
