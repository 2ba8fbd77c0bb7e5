"""A PyTorch module as a repipe model: its spec and its weights, and trained weights back.

    import repipe.torch
    repipe.torch.export(net, torch.randn(8, 1, 28, 28), model="m.model", weights="m.rpw")
    # repipe train --model m.model --load m.rpw --config exec.json --save trained.rpw
    repipe.torch.load(net, "trained.rpw")

torch.fx traces the module; each call of a module or function becomes a line of the spec, in
the order the trace runs them (a topological order, as the spec needs), named after the
trace's node and reading its inputs by name where they are not the line above. A transformer
torch.fx cannot read (a GPT's forward) is read from torch.export's graph, a node of the
profiler's grouping a line (_convert_graph). What has no repipe layer is refused with the
module's name and type, never approximated.
"""
import operator

import numpy as np
import torch
from torch import nn

import repipe
from .torch_graph import _opname as _op  # an ATen call's name, as the grouping reads it

__all__ = ["export", "load"]


def _pair(v, what, where):
    """An int, or a square pair of ints (kernel, stride, padding), as one int."""
    if isinstance(v, int):
        return v
    if isinstance(v, (tuple, list)) and len(v) == 2 and v[0] == v[1]:
        return int(v[0])
    raise repipe.Error("%s: %s %r is not square; repipe's layers take one size" % (where, what, v))


def _refuse(where, why):
    raise repipe.Error("%s: %s" % (where, why))


def _module_line(name, m):
    """(spec words, [(variable suffix, state_dict key)]) of a module call."""
    where = "module '%s' (%s)" % (name, type(m).__name__)
    t = type(m)
    if t is nn.Linear:
        return ("linear %d%s" % (m.out_features, "" if m.bias is not None else " bias=false"),
                [("weight", "weight")] + ([("bias", "bias")] if m.bias is not None else []))
    if t is nn.Conv2d:
        if m.padding_mode != "zeros" or _pair(m.dilation, "dilation", where) != 1:
            _refuse(where, "only zero padding and dilation 1 have a repipe conv2d")
        if isinstance(m.padding, str):
            _refuse(where, "padding=%r: give the padding as a number" % m.padding)
        words = "conv2d %d kernel=%d stride=%d pad=%d" % (
            m.out_channels, _pair(m.kernel_size, "kernel", where),
            _pair(m.stride, "stride", where), _pair(m.padding, "padding", where))
        if m.groups != 1:
            words += " groups=%d" % m.groups
        if m.bias is None:
            words += " bias=false"
        return words, [("weight", "weight")] + ([("bias", "bias")] if m.bias is not None else [])
    if t in (nn.BatchNorm1d, nn.BatchNorm2d):
        if not m.affine or not m.track_running_stats or m.momentum is None:
            _refuse(where, "repipe's batchnorm has a weight and bias and running statistics "
                           "with a momentum (affine, track_running_stats, momentum not None)")
        kind = "batchnorm2d" if t is nn.BatchNorm2d else "batchnorm1d"
        return ("%s eps=%.9g momentum=%.9g" % (kind, m.eps, m.momentum),
                [(k, k) for k in ("weight", "bias", "running_mean", "running_var")])
    if t is nn.LayerNorm:
        if len(m.normalized_shape) != 1 or not m.elementwise_affine:
            _refuse(where, "repipe's layernorm normalises the last dimension, with a weight "
                           "and a bias")
        return "layernorm eps=%.9g" % m.eps, [("weight", "weight"), ("bias", "bias")]
    if t is nn.Embedding:
        if m.padding_idx is not None or m.max_norm is not None:
            _refuse(where, "padding_idx and max_norm have no repipe embedding")
        return "embedding %d %d" % (m.num_embeddings, m.embedding_dim), [("weight", "weight")]
    if t is nn.MaxPool2d or t is nn.AvgPool2d:
        if m.ceil_mode:
            _refuse(where, "ceil_mode=True has no repipe pooling")
        if t is nn.MaxPool2d and _pair(m.dilation, "dilation", where) != 1:
            _refuse(where, "dilation has no repipe pooling")
        if t is nn.AvgPool2d and (not m.count_include_pad or m.divisor_override is not None):
            _refuse(where, "repipe's avgpool2d counts the padding (count_include_pad=True)")
        k = _pair(m.kernel_size, "kernel", where)
        s = _pair(m.stride if m.stride is not None else k, "stride", where)
        return ("%s %d stride=%d pad=%d" % ("maxpool2d" if t is nn.MaxPool2d else "avgpool2d", k,
                                            s, _pair(m.padding, "padding", where)), [])
    if t is nn.AdaptiveAvgPool2d:
        return "adaptive_avgpool2d %d" % _pair(m.output_size, "output size", where), []
    if t is nn.Flatten:
        if m.start_dim != 1 or m.end_dim != -1:
            _refuse(where, "repipe's flatten keeps the batch and flattens the rest")
        return "flatten", []
    if t is nn.Dropout:
        return "dropout %.9g" % m.p, []
    if t is nn.GELU:
        if m.approximate != "none":
            _refuse(where, "GELU(approximate='tanh') has no repipe layer of its own "
                           "(repipe's gelu is the erf form)")
        return "gelu", []
    words = {nn.ReLU: "relu", nn.Sigmoid: "sigmoid", nn.Tanh: "tanh", nn.SiLU: "silu"}.get(t)
    if words:
        return words, []
    _refuse(where, "has no repipe layer")


def _function_line(node):
    """Spec words of a function or method call, and the nodes it reads."""
    f, args, kw = node.target, list(node.args), dict(node.kwargs)
    where = "'%s' (%s)" % (node.name, getattr(f, "__name__", f))
    if node.op == "call_function" and f in (operator.add, torch.add) or \
            node.op == "call_method" and f == "add":
        if len(args) != 2 or kw or not all(isinstance(a, torch.fx.Node) for a in args):
            _refuse(where, "an addition of two tensors is a repipe add; this one is not")
        return "add", args
    if node.op == "call_function" and f in (operator.mul, torch.mul) or \
            node.op == "call_method" and f == "mul":
        if len(args) != 2 or kw or not all(isinstance(a, torch.fx.Node) for a in args):
            _refuse(where, "a product of two tensors is a repipe mul; this one is not")
        return "mul", args
    if node.op == "call_function" and f is torch.cat:
        dim = args[1] if len(args) > 1 else kw.get("dim", 0)
        if dim != 1:
            _refuse(where, "torch.cat along dim %r: repipe's concat joins channels (dim 1)" % dim)
        return "concat", list(args[0])
    if node.op == "call_function" and f is torch.flatten or \
            node.op == "call_method" and f == "flatten":
        start = args[1] if len(args) > 1 else kw.get("start_dim", 0)
        end = args[2] if len(args) > 2 else kw.get("end_dim", -1)
        if start != 1 or end != -1:
            _refuse(where, "repipe's flatten keeps the batch and flattens the rest "
                           "(start_dim=1)")
        return "flatten", args[:1]
    simple = {torch.relu: "relu", torch.nn.functional.relu: "relu", torch.sigmoid: "sigmoid",
              torch.tanh: "tanh", torch.nn.functional.silu: "silu", "relu": "relu",
              "sigmoid": "sigmoid", "tanh": "tanh"}
    if f in simple:
        return simple[f], args[:1]
    _refuse(where, "has no repipe layer")


def _convert(module):
    """The traced module as (lines, inputs, variables): each line's words and the fx nodes it
    reads, and per line the (variable suffix, state_dict key) pairs of its parameters."""
    graph = torch.fx.symbolic_trace(module).graph
    lines, variables, inputs = [], [], []
    placeholder, result = None, None
    for node in graph.nodes:
        if node.op == "placeholder":
            if placeholder is not None:
                _refuse("the module", "takes more than one input")
            placeholder = node
        elif node.op == "call_module":
            m = module.get_submodule(node.target)
            if type(m) is nn.Identity:  # a name for its input
                node.meta["repipe_alias"] = node.args[0]
                continue
            words, var = _module_line(node.target, m)
            lines.append((node, words, list(node.args)))
            variables.append([(s, node.target + "." + k) for s, k in var])
        elif node.op in ("call_function", "call_method"):
            words, args = _function_line(node)
            lines.append((node, words, args))
            variables.append([])
        elif node.op == "output":
            result = node.args[0]
        else:
            _refuse("'%s'" % node.name, "a %s has no repipe layer" % node.op)
    while isinstance(result, torch.fx.Node) and "repipe_alias" in result.meta:
        result = result.meta["repipe_alias"]
    if not lines or result is not lines[-1][0]:
        _refuse("the module", "its output must be its last operation's")
    return placeholder, lines, variables


# ---- transformers, from torch.export's graph ------------------------------------------------
#
# A GPT's forward (`b, t = idx.size()`, positions from torch.arange) does not trace with
# torch.fx, and its blocks are no chain of modules. Such a module is read from torch.export's
# graph, a node of repipe.torch.profile's grouping a line (torch_graph.Graph): an Embedding of
# tokens, an Embedding of torch.arange's positions added to it (position_embedding), GPT-2
# blocks (transformer_block: LayerNorm, the fused q, k, v Linear, causal attention by
# F.scaled_dot_product_attention or nn.MultiheadAttention, the output Linear, the residual;
# LayerNorm, Linear, GELU, Linear, the residual), LayerNorm, Dropout, and a Linear head, tied
# to the embedding or not. Anything else is refused with the node's name.

_VIEWS = {"view", "reshape", "transpose", "permute", "getitem", "split", "unsqueeze", "squeeze",
          "contiguous", "expand", "select", "slice", "t", "unflatten", "chunk", "detach", "alias",
          "_assert_tensor_metadata", "unbind", "clone"}


def _of_input(graph):
    """The graph's nodes that depend on the model's input (the others make constants: a causal
    mask, positions)."""
    dep = set(graph.inputs)
    for n in graph.gm.graph.nodes:
        if any(a in dep for a in n.all_input_nodes):
            dep.add(n)
    return dep


def _block(graph, g, where, dep):
    """A GPT-2 block's line and variables, or a refusal saying what differs."""
    ops = [n for n in g.nodes if n in dep and _op(n) not in _VIEWS]
    names = [_op(n) for n in ops]
    want = ["layer_norm", "linear", "scaled_dot_product_attention", "linear", "add",
            "layer_norm", "linear", "gelu", "linear", "add"]
    if names != want:
        _refuse(where, "is no GPT-2 block repipe's transformer_block computes: its calls are %s"
                % ", ".join(names))
    ln1, qkv, sdpa, proj, _, ln2, fc, gelu, mproj, _ = ops
    causal = sdpa.kwargs.get("is_causal", len(sdpa.args) > 5 and sdpa.args[5])
    mask = sdpa.kwargs.get("attn_mask", sdpa.args[3] if len(sdpa.args) > 3 else None)
    if mask is not None:  # nn.MultiheadAttention's: triu(ones(T, T), 1) as -inf above
        made = set()
        stack = [mask]
        while stack:
            m = stack.pop()
            if isinstance(m, torch.fx.Node) and m not in made:
                made.add(m)
                stack += m.all_input_nodes
        causal = any(_op(m) == "triu" and (m.args[1:] or [0])[0] == 1 for m in made)
    if not causal:
        _refuse(where, "its attention is not causal; repipe's attention is")
    for ln in (ln1, ln2):
        eps = ln.args[4] if len(ln.args) > 4 else 1e-5
        if abs(eps - 1e-5) > 1e-12:
            _refuse(where, "LayerNorm eps %g: repipe's transformer_block normalises with 1e-5"
                    % eps)
    q = sdpa.args[0].meta["val"]
    heads, C = int(q.shape[1]), int(ln1.meta["val"].shape[-1])
    M = int(fc.meta["val"].shape[-1]) // C
    approx = gelu.kwargs.get("approximate", gelu.args[1] if len(gelu.args) > 1 else "none")
    words = "transformer_block heads=%d mlp=%d gelu=%s" % (heads, M,
                                                          "erf" if approx == "none" else "tanh")
    var = []
    for part, node, w, b in (("ln1", ln1, 2, 3), ("attn.qkv", qkv, 1, 2),
                             ("attn.proj", proj, 1, 2), ("ln2", ln2, 2, 3),
                             ("mlp.fc", fc, 1, 2), ("mlp.proj", mproj, 1, 2)):
        for suffix, i in (("weight", w), ("bias", b)):
            a = node.args[i] if len(node.args) > i else None
            if not isinstance(a, torch.fx.Node) or a.op != "get_attr":
                _refuse(where, "%s has no %s; repipe's transformer_block has one" % (part, suffix))
            var.append(("%s.%s" % (part, suffix), a.target))
    return words, var


def _convert_graph(module, example_input):
    """(lines, variables) of a transformer from torch.export's graph: lines are (name,
    words); variables per line are (variable suffix, the graph's parameter name)."""
    from .torch_graph import Graph
    graph = Graph(module, example_input)
    named = dict(module.named_modules())
    dep = _of_input(graph)
    lines, variables, emb = [], [], {}
    for g in graph.groups:
        where = "node '%s'" % g.name
        m = named.get(g.unit) if g.unit else None
        ops = [n for n in g.nodes if n in dep and _op(n) not in _VIEWS]
        if isinstance(m, nn.Embedding):
            call = next(n for n in g.nodes if _op(n) == "embedding")
            table = call.args[0].target
            if call.args[1] in dep:  # tokens
                if m.padding_idx is not None or m.max_norm is not None:
                    _refuse(where, "padding_idx and max_norm have no repipe embedding")
                emb[call] = len(lines)
                lines.append((g.name, "embedding %d %d" % (m.num_embeddings, m.embedding_dim)))
                variables.append([("weight", table)])
            else:  # positions: torch.arange's, added to the tokens' rows next
                T = int(call.meta["val"].shape[0])
                if T != m.num_embeddings:
                    _refuse(where, "a table of %d positions for %d: repipe's position_embedding "
                            "has one row a position" % (m.num_embeddings, T))
                lines.append((g.name, "position_embedding"))
                variables.append([("weight", table)])
                emb[call] = None
            continue
        ops = [n for n in ops if not (_op(n) == "add" and all(a in emb for a in n.args))]
        names = [_op(n) for n in ops]
        if m is not None and not list(m.children()) and names in ([], ["dropout"]) and \
                isinstance(m, (nn.Dropout, nn.Identity)):
            if isinstance(m, nn.Dropout) and m.p:
                lines.append((g.name, "dropout %.9g" % m.p))
                variables.append([])
            continue
        if isinstance(m, nn.LayerNorm) and names == ["layer_norm"]:
            words, var = _module_line(g.unit, m)
            lines.append((g.name, words))
            variables.append([(s, g.unit + "." + k) for s, k in var])
            continue
        if isinstance(m, nn.Linear) and names == ["linear"]:
            call = ops[0]
            tie = [i for c, i in emb.items() if i is not None and
                   graph.canonical(c.args[0].target) == graph.canonical(call.args[1].target)]
            if tie:
                if m.bias is not None:
                    _refuse(where, "a head tied to the embedding has no bias in repipe")
                lines.append((g.name, "linear %d bias=false tie=%d" % (m.out_features, tie[0])))
                variables.append([("weight", call.args[1].target)])
            else:
                words, var = _module_line(g.unit, m)
                lines.append((g.name, words))
                variables.append([(s, g.unit + "." + k) for s, k in var])
            continue
        if m is not None and "scaled_dot_product_attention" in names:
            words, var = _block(graph, g, where, dep)
            lines.append((g.name, words))
            variables.append(var)
            continue
        _refuse(where, "has no repipe layer (its calls: %s)" % ", ".join(names))
    return graph, lines, variables


def _spec(placeholder, lines, example_input, loss):
    names = {placeholder: "x"}
    shape = tuple(example_input.shape[1:])
    text = ["x = input " + " ".join(str(int(d)) for d in shape)]
    previous = placeholder
    for node, words, args in lines:
        reads = []
        for a in args:
            while isinstance(a, torch.fx.Node) and "repipe_alias" in a.meta:
                a = a.meta["repipe_alias"]
            if not isinstance(a, torch.fx.Node) or a not in names:
                _refuse("'%s'" % node.name, "reads %r, which is not a tensor of the model" % (a,))
            reads.append(names[a])
        names[node] = node.name
        line = "%s = %s" % (node.name, words)
        if len(reads) != 1 or args[0] is not previous:
            line += " < " + " ".join(reads)
        text.append(line)
        previous = node
    if loss == "cross_entropy":
        text.append("softmax_cross_entropy")
    elif loss is not None:
        raise repipe.Error("loss %r: expected 'cross_entropy' or None" % (loss,))
    return "\n".join(text) + "\n"


def _graph_spec(lines, example_input, loss):
    """A chain of torch.export's nodes as a spec: each line reads the one above."""
    shape = tuple(example_input.shape[1:])
    text = ["input " + " ".join(str(int(d)) for d in shape)]
    for name, words in lines:
        text.append("%s = %s" % (name.replace(".", "_").replace("#", "_"), words))
    if loss == "cross_entropy":
        text.append("softmax_cross_entropy")
    elif loss is not None:
        raise repipe.Error("loss %r: expected 'cross_entropy' or None" % (loss,))
    return "\n".join(text) + "\n"


def export(module, example_input, model="m.model", weights="m.rpw", loss="cross_entropy"):
    """Writes the module as a repipe model spec (`model`) and its parameters and batchnorm
    statistics as a weight file (`weights`); example_input is a batch, whose shape past the
    first dimension is the spec's input. loss="cross_entropy" ends the spec with
    softmax_cross_entropy (PyTorch's cross_entropy on the module's output); None leaves it
    out. Returns the spec's text."""
    graph = None
    try:
        placeholder, lines, variables = _convert(module)
    except Exception as fx_failed:  # noqa: BLE001 - torch.fx's trace, or its lines, fail:
        try:  # a transformer, from torch.export's graph
            graph, glines, variables = _convert_graph(module, example_input)
        except Exception:  # noqa: BLE001 - neither reads it: the module's own refusal
            if isinstance(fx_failed, repipe.Error):
                raise fx_failed from None
            raise
    if graph is None:
        text = _spec(placeholder, lines, example_input, loss)
    else:
        text = _graph_spec(glines, example_input, loss)
    parsed = repipe.Model.parse(text, model)  # the C parser checks the shapes now
    state = module.state_dict()
    out = {}
    for layer, var in enumerate(variables):
        for suffix, key in var:
            t = state[key] if graph is None else graph._attr(key)
            out["%d.%s" % (layer, suffix)] = np.ascontiguousarray(
                t.detach().cpu().numpy().astype(np.float32))
    if parsed.num_params != sum(a.size for a in out.values()):
        raise repipe.Error("%s: %d parameters in the spec, %d in the module" %
                           (model, parsed.num_params, sum(a.size for a in out.values())))
    with open(model, "w") as f:
        f.write(text)
    repipe.save_weights(weights, out)
    return text


def load(module, weights, example_input=None):
    """Copies a weight file of the module's export (trained by repipe, say) into the module's
    parameters and batchnorm statistics. Every tensor must be there with its shape. A module
    export read from torch.export's graph (a transformer) needs its example_input again."""
    graph = None
    try:
        _, _, variables = _convert(module)
        state = module.state_dict()
    except Exception:  # noqa: BLE001 - as export read it: from torch.export's graph
        if example_input is None:
            raise repipe.Error("repipe.torch.load: torch.fx cannot read this module, so its "
                               "export came from torch.export's graph: pass the example_input "
                               "export was given") from None
        graph, _, variables = _convert_graph(module, example_input)
        state = {key: graph._attr(key) for var in variables for _, key in var}
    w = repipe.load_weights(weights)
    with torch.no_grad():
        for layer, var in enumerate(variables):
            for suffix, key in var:
                name = "%d.%s" % (layer, suffix)
                if name not in w:
                    raise repipe.Error("%s: no tensor %s (the module's %s)" % (weights, name, key))
                a = w[name]
                if tuple(a.shape) != tuple(state[key].shape):
                    raise repipe.Error("%s: %s has shape %s, the module's %s %s" %
                                       (weights, name, tuple(a.shape), key,
                                        tuple(state[key].shape)))
                state[key].copy_(torch.from_numpy(np.ascontiguousarray(a)))
    return module
