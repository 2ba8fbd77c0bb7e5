"""A profiler for PyTorch modules that writes the planner's input (PipeDream's graph.txt).

    import repipe.torch
    repipe.torch.profile(model, torch.randn(64, 3, 224, 224), out="graph.txt")
    plan = repipe.plan("graph.txt", machines=[8, 2], bandwidth=[4e9, 2e9])

The nodes are torch_graph's, over torch.export's graph of the module: a node a call of a unit
(a leaf, a module with parameters of its own or computation outside its children; a
transformer's blocks, its embedding and its head), each with its forward time (hooks around
the call) and backward time (read off the autograd graph), the median of `repeat` runs of the
whole model, its output's bytes and its parameters' bytes. repipe.calibrate measures a device
for `repipe profile --transformer` instead; rt.Pipeline runs a plan of the profile.
"""
import statistics
import time

import torch

from .torch_export import export, load  # noqa: F401 (repipe.torch.export, .load)

__all__ = ["profile", "export", "load", "Pipeline", "HostClock", "CudaClock", "calibrate"]


def __getattr__(name):  # rt.Pipeline: torch.distributed is loaded when it is used
    if name == "Pipeline":
        from .torch_pipeline import Pipeline
        return Pipeline
    if name == "calibrate":  # (repipe.calibrate's, under this name too)
        from .calibrate import calibrate
        return calibrate
    raise AttributeError(name)


from .torch_graph import _val_bytes as _bytes  # noqa: E402 (a value's bytes, as the graph counts)
from .torch_graph import pick_output  # noqa: E402


def _leaves(module):
    return [(name, m) for name, m in module.named_modules() if not list(m.children())]


def _grad_fns(x):
    if isinstance(x, torch.Tensor):
        return [x.grad_fn] if x.grad_fn is not None else []
    if isinstance(x, (tuple, list)):
        return [g for t in x for g in _grad_fns(t)]
    if isinstance(x, dict):
        return [g for t in x.values() for g in _grad_fns(t)]
    return []


class HostClock:
    """The host's clock (time.perf_counter): a CPU module's time. On a CUDA module it would
    time kernel launches, which return before the kernels run."""

    def mark(self):
        return time.perf_counter()

    def sync(self):
        pass

    def seconds(self, a, b):
        return b - a


class CudaClock:
    """CUDA events recorded on the current stream: the device's time between two marks,
    read once the run is done (synchronize), so timing waits for nothing in between."""

    def mark(self):
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def sync(self):
        torch.cuda.synchronize()

    def seconds(self, a, b):
        return a.elapsed_time(b) / 1e3


def _clock_for(module, example_input):
    on_cuda = example_input.is_cuda or any(p.is_cuda for p in module.parameters())
    return CudaClock() if on_cuda else HostClock()


def _time_modules(module, example_input, repeat, clock=None, units=None, kwargs=None,
                  output=None, loss_fn=None):
    """Forward and backward seconds of each call of a leaf module, the median of `repeat` runs,
    and the order of the calls. A call is (module name, k): a module called twice in a pass
    (torchvision's ResNet blocks call one ReLU twice) is timed call by call.

    Forward runs from the module's call to its return. Backward is read off the autograd
    graph, not from module backward hooks, which cannot watch a module that overwrites its
    input (ReLU(inplace=True)): it runs from the moment the node that made the module's output
    starts to the moment the last node its forward created is done. Those nodes are found by
    walking back from the output to the nodes that existed before the call.

    The marks come from `clock` (HostClock, or CudaClock for a module on a GPU) and are read
    after each run, once it has synchronised. With loss_fn (the output to a scalar), the loss
    is timed too: its forward from the model's return, its backward up to the first call's
    backward; under the key None."""
    clock = clock or _clock_for(module, example_input)
    named = dict(module.named_modules())
    leaves = [(u, named[u]) for u in units] if units is not None else _leaves(module)
    fw, bw, out_bytes, order = {}, {}, {}, []
    calls, t_fw, f_end, before, owner = {}, {}, {}, {}, {}
    t_begin, t_end = {}, {}

    def hooks(name):
        def pre(mod, inp):
            key = (name, calls.get(name, 0))
            calls[name] = key[1] + 1
            before[key] = set(_grad_fns(inp))
            t_fw[key] = clock.mark()

        def post(mod, inp, out):
            key = (name, calls[name] - 1)
            f_end[key] = clock.mark()
            out_bytes[key] = _bytes(out)
            if key not in order:
                order.append(key)
            roots = [g for g in _grad_fns(out) if g not in before[key] and g not in owner]
            stack, mine = list(roots), []
            while stack:  # the nodes this call created: back to what existed before it
                g = stack.pop()
                if g in owner or g in before[key] or g.name().endswith("AccumulateGrad"):
                    continue
                owner[g] = key
                mine.append(g)
                stack += [n for n, _ in g.next_functions if n is not None]
            for g in roots:
                g.register_prehook(lambda gout, key=key: begin(key))
            for g in mine:
                g.register_hook(lambda gin, gout, key=key: end(key))

        return pre, post

    def begin(key):  # the first of a call's output nodes starts
        if key not in t_begin:
            t_begin[key] = clock.mark()

    def end(key):  # one of the call's nodes is done
        t_end[key] = clock.mark()

    handles = []
    try:
        for name, m in leaves:
            pre, post = hooks(name)
            handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
        for r in range(repeat + 1):  # the first run warms up
            calls.clear()
            owner.clear()
            t_fw.clear()
            f_end.clear()
            t_begin.clear()
            t_end.clear()
            x = example_input.detach().requires_grad_(example_input.is_floating_point())
            out = pick_output(module(x, **(kwargs or {})), output)
            l_begin = clock.mark()
            loss = loss_fn(out) if loss_fn is not None else out.float().sum()
            l_end = clock.mark()
            loss.backward()
            module.zero_grad(set_to_none=True)
            del out, loss
            clock.sync()
            if r and loss_fn is not None and t_begin:
                fw.setdefault(None, []).append(clock.seconds(l_begin, l_end))
                first = min(t_begin.values(), key=lambda m: clock.seconds(l_end, m))
                bw.setdefault(None, []).append(clock.seconds(l_end, first))
            for key in f_end:
                if r:
                    fw.setdefault(key, []).append(clock.seconds(t_fw[key], f_end[key]))
            for key in t_end:
                if r and key in t_begin:
                    bw.setdefault(key, []).append(clock.seconds(t_begin[key], t_end[key]))
    finally:
        for h in handles:
            h.remove()
    # the median of the runs, as `repipe profile` keeps: a pipeline's steady state runs at a
    # layer's typical time, which the best of the runs understates (by 5 to 10 % on a
    # shared machine, bench/torch_predict.py)
    fw = {k: statistics.median(v) for k, v in fw.items()}
    bw = {k: statistics.median(v) for k, v in bw.items()}
    return fw, bw, out_bytes, order


def profile(module, example_input, *, batch_size=None, repeat=3, out="graph.txt", clock=None,
            output=None, kwargs=None, loss_fn=None, target=None):
    """Profiles module on example_input (a micro-batch) and writes PipeDream's graph.txt to
    `out`. batch_size, when given, is written for the planner (default: the input's first
    dimension). clock: where the times come from (default: CudaClock when the module or
    the input is on a CUDA device, else HostClock). output: what the loss reads of what the
    module returns (a ModelOutput's or dict's key, a tuple's index) [its `logits`, else its
    first tensor]. kwargs: passed to every call [a Hugging Face model's use_cache=False].
    loss_fn, target: the loss rt.Pipeline will compute (loss_fn(output, target), target the
    micro-batch's): its forward and backward are timed into the node that makes the output, as
    the last stage runs it [none: the nodes alone]. Returns the path.

    The nodes are torch_graph's: every parameter and every call of the module is in one
    node, or the call fails naming the module it cannot see into. A Hugging Face model's
    nodes are its embedding, each decoder (or encoder) layer, its final norm and its head."""
    from .torch_graph import Graph
    batch = batch_size or int(example_input.shape[0])
    module.train()
    graph = Graph(module, example_input, output=output, kwargs=kwargs)
    units = sorted({g.unit for g in graph.groups if g.unit is not None})
    if (loss_fn is None) != (target is None):
        raise ValueError("repipe.torch.profile: loss_fn and target go together")
    fw, bw, _, _ = _time_modules(module, example_input, repeat, clock, units, graph.kwargs,
                                 output, None if loss_fn is None else
                                 (lambda o: loss_fn(o, target)))
    # the k-th call of a unit is its k-th node (consecutive calls with nothing between
    # them are one node: their times add up)
    nodes_of = {}
    for i, g in enumerate(graph.groups):
        if g.unit is not None:
            nodes_of.setdefault(g.unit, []).append(i)
    t_fw, t_bw = [0.0] * len(graph.groups), [0.0] * len(graph.groups)
    last = graph.index.get(graph.group_of.get(graph.outputs[0]), len(graph.groups) - 1)
    for times, into in ((fw, t_fw), (bw, t_bw)):
        for key, t in times.items():
            if key is None:  # the loss: where the output is made
                into[last] += t
                continue
            idx = nodes_of[key[0]]
            into[idx[min(key[1], len(idx) - 1)]] += t
    params = graph.parameter_bytes()
    sizes = graph.crossing_bytes()
    unused = graph.unused_parameters()
    lines = ["node0 -- Input0 micro_batch=%d -- forward_compute_time=0.000, "
             "backward_compute_time=0.000, activation_size=%.1f, parameter_size=0.000"
             % (batch, float(_bytes(example_input)))]
    for i, g in enumerate(graph.groups):
        lines.append("node%d -- %s -- forward_compute_time=%.6f, backward_compute_time=%.6f, "
                     "activation_size=%.1f, parameter_size=%.1f"
                     % (i + 1, graph.describe(g), t_fw[i] * 1e3, t_bw[i] * 1e3,
                        float(sizes[i]), float(params[i])))
    edges = graph.edges()
    fed = {j for _, j in edges}
    for i in range(len(graph.groups)):  # what nothing feeds reads the input
        if i not in fed:
            edges.append((-1, i))
    for i, j in sorted(set(edges)):  # -1: the input, node0
        lines.append("\tnode%d -- node%d" % (i + 1, j + 1))
    if unused:
        import warnings
        warnings.warn("repipe.torch.profile: parameters the forward never reads are in no node: "
                      + ", ".join(unused))
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    return out
