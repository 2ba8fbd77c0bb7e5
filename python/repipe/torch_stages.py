"""Building a rank's part of rt.Pipeline: its stages of the module (torch_graph.Split), the
groups it sums over, and the runner that will play them (PyTorch's schedule classes where
every stage has one worker a pipeline, else repipe's operation lists, torch_runner.py).
Pipeline (torch_pipeline.py) takes these methods from Building.
"""
import ctypes
import os
import tempfile

import torch
import torch.distributed as dist

import repipe
from repipe._lib import _Err, _check, _free, _schedule_csv, _stage_layers
from .torch_graph import Graph, Split
from .torch_runner import worker_ops

__all__ = ["Building"]


def _csv(cfg):
    out, err = ctypes.c_void_p(), _Err()
    _check(_schedule_csv(cfg._buf, ctypes.byref(out), ctypes.byref(err)), err)
    text = ctypes.string_at(out.value).decode()
    _free(out)
    return text


class Building:
    """The part of rt.Pipeline that builds this rank's stages, once, from a micro-batch."""

    def _build_and_meet(self, example):
        """Builds this rank's stage, then waits for every rank's (the process group's
        timeout holds): building is a rank's own work (torch.export of a large model takes
        minutes), so the timeout of a step counts its exchanges alone, not a slower peer's
        export."""
        self._build(example)
        try:
            dist.barrier(group=self.group)
        except RuntimeError as e:  # gloo's and NCCL's own timeout: said in repipe's words
            if "imed out" not in str(e) and "imeout" not in str(e):
                raise
            raise repipe.Error(self._silent_peer()) from e

    def _build(self, example):
        self.graph = Graph(self.module, example, output=self.output, kwargs=self.kwargs)
        L, err = len(self.graph.groups), _Err()
        S = self.cfg.derived["stages"]
        counts = (ctypes.c_int * S)()
        _check(_stage_layers(self.cfg._buf, False, L, counts, ctypes.byref(err)), err)
        self.split = Split(self.graph, list(counts))
        self.S = S
        if self.uniform:
            self._build_uniform()
        else:
            self._build_runner()
        self._tie()
        params = []
        for m in self.stage_mods:
            params += [p for p in m.parameters() if all(p is not q for q in params)]
        self.params = params
        # a stage without parameters (a ReLU, rotary tables) has nothing to step: PyTorch's
        # optimizers refuse an empty list
        self.optimizer = self.make_optimizer(params) if params else None
        self.built = True

    def _new_group(self, ranks):
        """A group of these ranks of the pipeline's group. Over the whole world every rank
        makes every group, in one order, as torch.distributed asks; inside a smaller group
        only its members do (use_local_synchronization)."""
        ranks = [self.ranks[r] for r in ranks]
        if len(self.ranks) == dist.get_world_size():
            g = dist.new_group(ranks)
            return g if self.ranks[self.me] in ranks else None
        if self.ranks[self.me] not in ranks:
            return None
        return dist.new_group(ranks, use_local_synchronization=True)

    def _stage_module(self, s):
        return self.split.stage(s).to(self.device)

    def _build_uniform(self):
        from torch.distributed.pipelining import PipelineStage
        P = self.S // self.v  # ranks a pipeline
        self.P = P
        self.replica, r = divmod(self.me, P)
        pp = [self._new_group([c * P + k for k in range(P)]) for c in range(self.R)]
        self.dp = [self._new_group([c * P + k for c in range(self.R)]) for k in range(P)]
        self.dp_mine = self.dp[r] if self.R > 1 else None
        self.my_stages = [s for s in range(self.S) if self._rank_in_pipeline(s) == r]
        self.stage_mods = [self._stage_module(s) for s in self.my_stages]
        pg = pp[self.replica]
        stages = [PipelineStage(m, s, self.S, self.device, group=pg)
                  for m, s in zip(self.stage_mods, self.my_stages)]
        loss = self._loss
        from torch.distributed.pipelining import schedules as sch
        # the gradients are divided by the micro-batches here, once a parameter: PyTorch's
        # scale_grads divides a stage's, twice a weight that two chunks of a rank share
        kw = {"loss_fn": loss, "scale_grads": False}
        if self.schedule == "gpipe":
            self.runner = sch.ScheduleGPipe(stages[0], self.GA, **kw)
        elif self.schedule == "1f1b":
            self.runner = sch.Schedule1F1B(stages[0], self.GA, **kw)
        elif self.schedule == "interleaved-1f1b":
            self.runner = sch.ScheduleInterleaved1F1B(stages, self.GA, **kw)
        else:  # repipe's zero-bubble order, as PyTorch's CSV
            self.runner = sch._PipelineScheduleRuntime(stages, self.GA, **kw)
            fd, path = tempfile.mkstemp(suffix=".csv")
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(_csv(self.cfg.replace(replication_factor=1)))  # one pipeline
                self.runner._load_csv(path, format="compute_only")
            finally:
                os.unlink(path)
        self.first = 0 in self.my_stages
        self.last = self.S - 1 in self.my_stages

    def _build_runner(self):
        ops = worker_ops(self.cfg)
        self.stage_of_worker = [w.stage for w in ops]
        mine = ops[self.me]
        s, self.replica, self.stage_replica = mine.stage, mine.replica, mine.stage_replica
        self.my_ops = mine.ops
        self.my_stages = [s]
        self.stage_mods = [self._stage_module(s)]
        self.reduce = [self._new_group([w for w, o in enumerate(ops) if o.stage == k])
                       for k in range(self.S)]
        self.first, self.last = s == 0, s == self.S - 1
        self.stage_params = [p for p in self.stage_mods[0].parameters() if p.requires_grad]
        self.recv_meta = self.split.values_meta(self.split.recv[s])
        self.send_meta = self.split.values_meta(self.split.send[s])

    def _tie(self):
        """Parameters read by several stages: a group of the ranks holding a copy each."""
        holders = {}
        stage_rank = self._stage_ranks()
        for s in range(self.S):
            names = [c for c, _, t in self.split.params(s) if isinstance(t, torch.nn.Parameter)]
            for n in names:
                holders.setdefault(n, set()).add(s)
        self.tied = []
        for name in sorted(holders):
            stages = holders[name]
            if len(stages) < 2:
                continue
            ranks = sorted({r for s in stages for r in stage_rank[s]})
            if len(ranks) == 1:  # the chunks of one rank: one copy, its gradient summed
                continue
            g = self._new_group(ranks)
            if g is not None:  # the copy this rank holds, under the name its stage reads
                local = next(t for s in self.my_stages for c, t, _ in self.split.params(s)
                             if c == name)
                p = next(self._param(m, local) for m in self.stage_mods
                         if self._param(m, local) is not None)
                self.tied.append((p, g))
        self.tied_ids = {id(p) for p, _ in self.tied}

    def _rank_in_pipeline(self, s):
        """The rank of a pipeline that holds stage s: chunk k of rank r is stage k P + r, or
        under zb-v and dualpipev, r and 2 P - 1 - r (a V)."""
        if self.schedule in ("zb-v", "dualpipev") and s >= self.P:
            return 2 * self.P - 1 - s
        return s % self.P

    def _stage_ranks(self):
        if self.uniform:
            return {s: [c * self.P + self._rank_in_pipeline(s) for c in range(self.R)]
                    for s in range(self.S)}
        out = {}
        for w, s in enumerate(self.stage_of_worker):
            out.setdefault(s, []).append(w)
        return out

    def _param(self, mod, name):
        obj = mod
        for part in name.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                return None
        return obj
