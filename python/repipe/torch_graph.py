"""A PyTorch module as the planner's nodes, and the part of it that one stage runs.

torch.export (PyTorch 2) traces the module on an example micro-batch into a graph of ATen
calls, each tagged with the modules it ran inside (`nn_module_stack`). Those calls are grouped
into the planner's nodes:

- a *unit* is a module that is a leaf (no children), holds parameters or buffers of its own
  (nn.MultiheadAttention's in_proj_weight), or computes something outside its children (a GPT
  block's residual additions, a hand-written attention's scaled_dot_product_attention); every
  call under a unit belongs to the unit's node, one node per call;
- a call outside every unit (the model's own `tok + pos`, `torch.flatten`) joins the node of its
  first consumer, or where only the output consumes it, the node of its last input; a call that
  has neither is a node of its own.

- a *constant* is a call that reads neither the model's input (but for its shape:
  `new_ones(input_ids, ...)`) nor a parameter: a Hugging Face model's position ids, causal
  mask and rotary tables. It is in no node: every stage that reads one computes it again from
  the buffers it needs (as torch.export lets its calls be placed anywhere), rather than
  receiving it from the stage before;
- a *trunk* is a module that holds a list of blocks (an nn.ModuleList: GPT2Model's `h`,
  LlamaModel's `layers`, BertEncoder's `layer`); it is opened, not a unit, even where it
  computes between its children (GPT-2's `tok + pos`), so that its blocks, its embedding and
  its final norm are nodes of their own and its calls join their consumers.

So every parameter and every computation of the module is in exactly one node (or, a
constant, computed where it is read), and the nodes stay in an order in which every node's
inputs come from nodes before it. A tied parameter (an embedding shared with the head) is used
by two nodes and counted at the first.

The model's output is its first tensor (a Hugging Face ModelOutput's `logits`), unless
`output=` names another (a key of the ModelOutput or dict, an index of the tuple); the rest of
what it returns is left out. `kwargs` are passed to every call (a Hugging Face model's
`use_cache=False` by default, which it takes: its cache is no activation to pipeline).

The same grouping cuts the module into stages (`Split`): a stage is a run of nodes, and its
graph takes, in order, every value that an earlier stage made and it or a later stage uses
(values that cross several stages pass through each one, as repipe's engine passes them).
"""
import contextlib
import logging
import operator
import warnings

import torch
import torch.fx

__all__ = ["Graph", "Split", "export_graph"]

# calls that read only their input's shape, dtype or device: a value made by them from the
# model's input is still a constant
_SHAPE_ONLY = {"new_ones", "new_zeros", "new_full", "new_empty", "zeros_like", "ones_like",
               "full_like", "empty_like", "sym_size", "size", "_assert_tensor_metadata"}

# calls that only look at their input another way: they make no node of their own
_FREE = {"view", "reshape", "transpose", "permute", "getitem", "split", "unsqueeze", "squeeze",
         "flatten", "contiguous", "expand", "select", "slice", "t", "unflatten", "chunk",
         "detach", "alias", "size", "sym_size", "_assert_tensor_metadata", "unbind", "lift_fresh_copy"}


def _opname(n):
    if n.target is operator.getitem:
        return "getitem"
    name = getattr(n.target, "__name__", str(n.target))
    return name.split(".")[0]


def _path(n):
    stack = n.meta.get("nn_module_stack")
    return [v[0] for v in stack.values() if v[0]] if stack else []


def _val_bytes(v):
    if isinstance(v, torch.Tensor):
        return v.numel() * v.element_size()
    if isinstance(v, (tuple, list)):
        return sum(_val_bytes(t) for t in v)
    return 0


class _Group:
    """One node of the planner: the graph's calls it holds and what they use."""

    def __init__(self, unit, anchor):
        self.unit = unit          # the module's name, or None for a call outside every unit
        self.anchor = anchor      # position of its first call of the unit (its order)
        self.nodes = []           # fx nodes, in graph order
        self.name = unit

    def __repr__(self):
        return "<node %s: %d calls>" % (self.name, len(self.nodes))


class _Refusal(Exception):
    pass


@contextlib.contextmanager
def _quiet():
    """torch.export logs what it cannot trace at length; the error says it once."""
    log = logging.getLogger("torch")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        log.setLevel(level)


def _export(module, example, kwargs):
    with _quiet():
        return _export_loud(module, example, kwargs)


def call_kwargs(module, kwargs=None):
    """What every call of the module takes beside its input: `kwargs`, or for a Hugging Face
    model (its config has use_cache) use_cache=False, which its forward takes."""
    if kwargs is not None:
        return dict(kwargs)
    cfg = getattr(module, "config", None)
    return {"use_cache": False} if getattr(cfg, "use_cache", None) is not None else {}


def pick_output(out, output=None):
    """The tensor the loss reads from what the module returned: `output` (a key of a
    ModelOutput or dict, an index of a tuple), else a ModelOutput's or dict's `logits` or
    first tensor, a tuple's first."""
    if isinstance(out, torch.Tensor) and output is None:
        return out
    if output is not None:
        return out[output]
    if isinstance(out, dict):  # (transformers' ModelOutput is an OrderedDict)
        if "logits" in out and isinstance(out["logits"], torch.Tensor):
            return out["logits"]
        return next(v for v in out.values() if isinstance(v, torch.Tensor))
    if isinstance(out, (tuple, list)):
        return next(v for v in out if isinstance(v, torch.Tensor))
    raise ValueError("repipe.torch: the module returned %s, not a tensor, a tuple or a "
                     "ModelOutput: give output= to say which value the loss reads"
                     % type(out).__name__)


def _export_loud(module, example, kwargs):
    """torch.export's graph of the module, or an error that names the module it cannot see
    into: the deepest module whose own export fails on the input it was called with."""
    args = example if isinstance(example, tuple) else (example,)
    try:
        return torch.export.export(module, args, kwargs=kwargs, strict=False).module()
    except Exception as top:  # noqa: BLE001 - the reason is reported, by module
        inputs = {}
        handles = []
        for name, m in module.named_modules():
            if name:
                handles.append(m.register_forward_pre_hook(
                    lambda mod, a, kw, name=name: inputs.setdefault(name, (a, kw)),
                    with_kwargs=True))
        try:
            with torch.no_grad():
                module(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - not torch.export's doing: say so
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ValueError("repipe.torch: the model fails on the example input when called "
                             "as it is, not only under torch.export: %s" % first) from e
        finally:
            for h in handles:
                h.remove()
        worst = ("", module, top)
        named = dict(module.named_modules())
        for name in sorted(inputs, key=lambda n: -n.count(".")):  # deepest first
            a, kw = inputs[name]
            try:
                torch.export.export(named[name], tuple(a), kwargs=dict(kw), strict=False)
            except Exception as e:  # noqa: BLE001
                worst = (name, named[name], e)
                break
        name, m, e = worst
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError("repipe.torch: cannot see into module '%s' (%s): torch.export failed: %s"
                         % (name or "the model", type(m).__name__, first)) from top


class Graph:
    """The module as the planner's nodes (`groups`, in order), over torch.export's graph `gm`
    traced on `example`."""

    def __init__(self, module, example, output=None, kwargs=None):
        if not hasattr(torch, "export"):
            raise ValueError("repipe.torch needs PyTorch 2 (torch.export; tested with 2.15); "
                             "this is %s" % torch.__version__)
        self.module = module
        self.example = example if isinstance(example, tuple) else (example,)
        self.kwargs = call_kwargs(module, kwargs)
        self.gm = _export(module, self.example, self.kwargs)
        self._choose_output(output)
        self._group()

    def _choose_output(self, output):
        """The graph's output made the one value the loss reads (torch.export flattens a
        ModelOutput to its tensors in order: the index of the chosen one is found by calling
        the module once), and what only the rest needed removed."""
        out = next(n for n in self.gm.graph.nodes if n.op == "output")
        flat = out.args[0]
        if not isinstance(flat, (tuple, list)):
            return
        flat = list(flat)
        if len(flat) > 1 or output is not None:
            with torch.no_grad():
                ret = self.module(*self.example, **self.kwargs)
            chosen = pick_output(ret, output)
            leaves = [t for t in torch.utils._pytree.tree_leaves(ret) if isinstance(t, torch.Tensor)]
            k = next((i for i, t in enumerate(leaves) if t is chosen), 0)
        else:
            k = 0
        out.args = (flat[k],)
        self.gm.graph.eliminate_dead_code()
        self.gm.recompile()

    def _compute_nodes(self):
        """The graph's calls; torch.export's assertions of a value's metadata left out (they
        compute nothing, and in a stage that does not hold the value would fail)."""
        return [n for n in self.gm.graph.nodes
                if (n.op in ("call_function", "call_method")
                    and _opname(n) != "_assert_tensor_metadata")
                or (n.op == "call_module" and n.target != "_guards_fn")]

    def _constants(self, compute):
        """The calls that read neither the model's input (but for its shape) nor a
        parameter, transitively."""
        params = {id(p) for p in self.module.parameters()}
        const = set()
        for n in self.gm.graph.nodes:  # (graph order: a call's inputs come before it)
            if n.op not in ("call_function", "call_method"):
                continue
            ok = True
            for a in n.all_input_nodes:
                if a.op == "get_attr":
                    ok = id(self._attr(a.target)) not in params
                elif a.op == "placeholder":
                    ok = _opname(n) in _SHAPE_ONLY
                else:
                    ok = a in const
                if not ok:
                    break
            if ok:
                const.add(n)
        return const

    def _group(self):
        modules = dict(self.module.named_modules())
        self.const = self._constants(self._compute_nodes())
        compute = [n for n in self._compute_nodes() if n not in self.const]
        self.position = {n: i for i, n in enumerate(self.gm.graph.nodes)}
        selfish = set()  # modules with a computing call of their own
        for n in compute:
            p = _path(n)
            if p and _opname(n) not in _FREE:
                selfish.add(p[-1])

        def is_trunk(m):
            return any(isinstance(c, torch.nn.ModuleList) and len(c) > 0 for c in m.children())

        # the entries of a list of blocks are blocks, whatever they compute themselves
        blocks = {"%s%s%s.%d" % (name, "." if name else "", k, i)
                  for name, m in modules.items() for k, c in m.named_children()
                  if isinstance(c, torch.nn.ModuleList) for i in range(len(c))}

        def is_unit(name):
            m = modules.get(name)
            if m is None or name in blocks:
                return True
            if is_trunk(m) and not any(True for _ in m.parameters(recurse=False)):
                return False
            return (name in selfish or not list(m.children())
                    or any(True for _ in m.parameters(recurse=False))
                    or any(True for _ in m.buffers(recurse=False)))

        unit_of = {}
        for n in compute:
            unit_of[n] = next((p for p in _path(n) if is_unit(p)), None)
        group_of, groups, last = {}, [], None
        for n in compute:  # a unit's calls, one group per call (a run of its nodes)
            u = unit_of[n]
            if u is None:
                last = None
                continue
            if last is None or last.unit != u:
                last = _Group(u, self.position[n])
                groups.append(last)
            last.nodes.append(n)
            group_of[n] = last
        for n in reversed(compute):  # calls outside every unit join their first consumer
            if unit_of[n] is not None:
                continue
            users = [group_of[u] for u in n.users if u in group_of]
            if users:
                g = min(users, key=lambda g: g.anchor)
                g.nodes.append(n)
                group_of[n] = g
        for n in compute:  # ... or, with none, their last input's node
            if n in group_of:
                continue
            ins = [group_of[a] for a in n.all_input_nodes if a in group_of]
            if ins:
                g = max(ins, key=lambda g: g.anchor)
            else:
                g = _Group(None, self.position[n])
                g.name = _opname(n)
                groups.append(g)
            g.nodes.append(n)
            group_of[n] = g
        groups.sort(key=lambda g: g.anchor)
        seen = {}
        for g in groups:
            g.nodes.sort(key=lambda n: self.position[n])
            k = seen.get(g.name, 0)
            seen[g.name] = k + 1
            if k:  # a module called again: its k-th call
                g.name = "%s#%d" % (g.name, k)
        self.groups = groups
        self.group_of = group_of
        self.index = {g: i for i, g in enumerate(groups)}
        # the example's tensors come first; kwargs follow, each a constant of the trace
        # (use_cache=False) that no call reads, as a stage cannot be given one
        holders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        self.inputs = holders[:len(self.example)]
        for n in holders[len(self.example):]:
            if any(u.op != "call_module" or u.target != "_guards_fn" for u in n.users):
                raise ValueError("repipe.torch: the model computes with its keyword argument "
                                 "'%s'; a stage takes only the input: give kwargs= without "
                                 "tensors" % n.name)
        out = next(n for n in self.gm.graph.nodes if n.op == "output")
        flat = out.args[0]
        flat = list(flat) if isinstance(flat, (tuple, list)) else [flat]
        self.outputs = flat

    # ---- what the planner reads ----------------------------------------------------------

    def params_of(self, g):
        """The parameters and buffers a node reads: [(name, tensor)], in graph order."""
        out = []
        for n in g.nodes:
            for a in n.all_input_nodes:
                if a.op == "get_attr" and a.target not in [t for t, _ in out]:
                    out.append((a.target, self._attr(a.target)))
        return out

    def _attr(self, target):
        obj = self.gm
        for part in target.split("."):
            obj = getattr(obj, part)
        return obj

    def canonical(self, target):
        if not hasattr(self, "_canon"):
            self._canon = {}
            first = {}
            for n in self.gm.graph.nodes:
                if n.op == "get_attr":
                    self._canon[n.target] = first.setdefault(id(self._attr(n.target)), n.target)
        return self._canon[target]

    def parameter_bytes(self):
        """Each node's parameters' bytes, a tensor counted at the first node that uses it."""
        counted, out = set(), []
        for g in self.groups:
            b = 0
            for _, t in self.params_of(g):
                if isinstance(t, torch.nn.Parameter) and id(t) not in counted:
                    counted.add(id(t))
                    b += t.numel() * t.element_size()
            out.append(b)
        return out

    def unused_parameters(self):
        used = {id(t) for g in self.groups for _, t in self.params_of(g)}
        return [name for name, p in self.module.named_parameters() if id(p) not in used]

    def crossing_bytes(self):
        """Each node's output: the bytes of the values it makes that another node (or the
        model's output) reads."""
        out = []
        for g in self.groups:
            mine = set(g.nodes)
            b = 0
            for n in g.nodes:
                if any(u not in mine for u in n.users):
                    b += _val_bytes(n.meta.get("val"))
            out.append(b)
        return out

    def edges(self):
        """(i, j): node j reads a value node i made; i is -1 for the model's input."""
        edges = set()
        for j, g in enumerate(self.groups):
            for n in g.nodes:
                for a in n.all_input_nodes:
                    if a.op == "placeholder":
                        edges.add((-1, j))
                    elif a in self.group_of and self.group_of[a] is not g:
                        edges.add((self.index[self.group_of[a]], j))
        return sorted(edges)

    def describe(self, g):
        if g.unit is None:
            return "%s(function)" % g.name
        m = dict(self.module.named_modules()).get(g.unit)
        return "%s: %s" % (g.name, type(m).__name__ if m is not None else "module")


class Split:
    """The graph cut into stages: `counts[s]` nodes each, in order. stage(s) is an
    nn.Module that takes the values in `recv[s]` (stage 0: the model's inputs) and returns
    those in `send[s]` as a tuple (the last stage: the model's output)."""

    def __init__(self, graph, counts):
        if sum(counts) != len(graph.groups):
            raise ValueError("the plan has %d layers in its stages and the model %d nodes: was "
                             "the profile made from this module and input?"
                             % (sum(counts), len(graph.groups)))
        self.graph, self.counts = graph, list(counts)
        P = len(counts)
        stage_of, k = {}, 0
        for s, c in enumerate(counts):
            for g in graph.groups[k:k + c]:
                for n in g.nodes:
                    stage_of[n] = s
            k += c
        self.stage_of = stage_of
        pos = graph.position
        # a value made at stage p (the inputs: 0) and read at stage t > p crosses p+1..t
        last_use = {}
        for n, t in stage_of.items():
            for a in n.all_input_nodes:
                if a.op == "get_attr" or a in graph.const:  # (each stage computes its own)
                    continue
                p = 0 if a.op == "placeholder" else stage_of[a]
                if t > p:
                    last_use[a] = max(last_use.get(a, 0), t)
        for o in graph.outputs:  # the output, made before the last stage, crosses to it
            if isinstance(o, torch.fx.Node) and stage_of.get(o, 0) < P - 1:
                last_use[o] = P - 1
        self.recv = [list(graph.inputs)] + [[] for _ in range(P - 1)]
        for a, t in sorted(last_use.items(), key=lambda kv: pos[kv[0]]):
            p = 0 if a.op == "placeholder" else stage_of[a]
            for s in range(p + 1, t + 1):
                self.recv[s].append(a)
        self.send = [self.recv[s + 1] for s in range(P - 1)] + [list(graph.outputs)]

    def stage(self, s):
        g = torch.fx.Graph()
        env = {}
        for a in self.recv[s]:
            env[a] = g.placeholder(a.name)
        mine = [n for n in self.graph.gm.graph.nodes if self.stage_of.get(n) == s]
        # the constants the stage reads, computed again here, and what they read
        consts, todo = set(), [a for n in mine for a in n.all_input_nodes if a in self.graph.const]
        while todo:
            c = todo.pop()
            if c not in consts:
                consts.add(c)
                todo += [a for a in c.all_input_nodes if a in self.graph.const]
        reads = mine + list(consts)
        attrs = {a for n in reads for a in n.all_input_nodes if a.op == "get_attr"}
        def stand_in(a):
            """A constant reads the model's input for its shape alone (new_ones(input_ids,
            ...)): a stage without the input reads an empty tensor of that shape instead."""
            v = a.meta["val"]
            env[a] = g.call_function(torch.empty, (tuple(v.shape),),
                                     {"dtype": v.dtype, "device": v.device})
            return env[a]

        for n in self.graph.gm.graph.nodes:
            if n in attrs or n in consts or self.stage_of.get(n) == s:
                env[n] = g.node_copy(n, lambda a: env[a] if a in env else stand_in(a))
        outs = [env[o] for o in self.send[s]]
        last = s == len(self.counts) - 1
        g.output(outs[0] if last and len(outs) == 1 else tuple(outs))
        g.lint()
        return torch.fx.GraphModule(self.graph.gm, g)

    def params(self, s):
        """The parameters and buffers stage s reads: [(canonical name, name in the stage's
        module, tensor)]. A tensor known by several names (a tied weight) has one canonical
        name, its first in the graph."""
        out, seen = [], set()
        for n in self.graph.gm.graph.nodes:
            if self.stage_of.get(n) != s:
                continue
            for a in n.all_input_nodes:
                if a.op == "get_attr" and a.target not in seen:
                    seen.add(a.target)
                    out.append((self.graph.canonical(a.target), a.target,
                                self.graph._attr(a.target)))
        return out

    def values_meta(self, values):
        """(shape, dtype) of each value, as traced on the example micro-batch."""
        out = []
        for a in values:
            v = a.meta.get("val")
            out.append((tuple(v.shape), v.dtype))
        return out


def export_graph(module, example, output=None, kwargs=None):
    return Graph(module, example, output, kwargs)
