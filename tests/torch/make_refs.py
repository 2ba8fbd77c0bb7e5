#!/usr/bin/env python3
"""Writes tests/torch/refs.txt: PyTorch's outputs and gradients for each repipe layer and
for both example models, for tests/test_torch_refs.c to compare against (the tests need no
torch). Run with Debian's python3-torch:

    /usr/bin/python3 tests/torch/make_refs.py > tests/torch/refs.txt

Inputs, parameters, labels and output weights come from an integer formula that the C test
computes identically (value()), so the file holds only results. Each case is a model spec, a
batch size, and:
  - per-layer cases: the objective sum(out * r) with r = value(.., salt 7); the file holds
    out, the input gradient and every parameter gradient in full;
  - model cases: the mean softmax cross-entropy; the file holds the logits, the loss, and per
    parameter gradient its sum, sum of absolute values and 64 sampled entries.
Dropout is left out (its masks come from repipe's own counter-based generator); the
finite-difference checks of tests/test_layers.c cover it.

The mixture-of-experts cases (`--moe`, written to tests/torch/moe_refs.txt with PyPI's torch 2:
    ~/.cache/repipe/venv-torch/bin/python tests/torch/make_refs.py --moe > tests/torch/moe_refs.txt)
are a layer case each (the objective plus the layer's balance losses) and router cases: the
router alone in float64 on scores from the same formula, its gates, the balance loss and the
scores' gradient, printed to 17 digits.
"""
import sys

import torch

torch.set_default_dtype(torch.float32)
torch.set_num_threads(1)


def value(i, salt, scale):
    # ((i * 7919 + salt * 104729) mod 2003) / 2003 - 0.5, times scale; exact in C too
    return (((i * 7919 + salt * 104729) % 2003) / 2003.0 - 0.5) * scale


def tensor(n, salt, scale, shape):
    return torch.tensor([value(i, salt, scale) for i in range(n)], dtype=torch.float64).float().reshape(shape)


def emit(name, t):
    flat = t.detach().reshape(-1).tolist()
    print(name, len(flat), " ".join("%.9g" % v for v in flat))


def emit_stats(name, t):
    flat = t.detach().reshape(-1).double()
    n = flat.numel()
    picks = [flat[(k * n) // 64].item() for k in range(64)]
    print(name + ".stats", 66, "%.12g %.12g" % (flat.sum().item(), flat.abs().sum().item()),
          " ".join("%.9g" % v for v in picks))


def params_of(mods):
    out = []
    for m in mods:
        if hasattr(m, "ordered"):
            out += m.ordered
            continue
        for p in (getattr(m, "weight", None), getattr(m, "bias", None)):
            if p is not None:
                out.append(p)
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):  # repipe's variables 2, 3
            out += [m.running_mean, m.running_var]
    return out


def set_params(params):
    for v, p in enumerate(params):
        with torch.no_grad():
            p.copy_(tensor(p.numel(), 100 + v, 0.5, p.shape))


class Block(torch.nn.Module):
    """GPT-2's block as nanoGPT and llm.c's PyTorch reference write it: pre-LayerNorm, fused
    QKV, causal attention, GELU (tanh form unless erf), no dropout."""

    def __init__(s, C, H, mlp=4, gelu="tanh"):
        super().__init__()
        nn = torch.nn
        s.H = H
        s.ln1, s.qkv, s.proj = nn.LayerNorm(C), nn.Linear(C, 3 * C), nn.Linear(C, C)
        s.ln2, s.fc, s.fcproj = nn.LayerNorm(C), nn.Linear(C, mlp * C), nn.Linear(mlp * C, C)
        s.gelu = nn.GELU(approximate=gelu if gelu == "tanh" else "none")
        # repipe's variable order
        s.ordered = [s.ln1.weight, s.ln1.bias, s.qkv.weight, s.qkv.bias, s.proj.weight, s.proj.bias,
                     s.ln2.weight, s.ln2.bias, s.fc.weight, s.fc.bias, s.fcproj.weight, s.fcproj.bias]

    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.qkv(s.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, s.H, C // s.H).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (C // s.H) ** 0.5
        att = att.masked_fill(torch.tril(torch.ones(T, T)) == 0, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + s.proj(y)
        return x + s.fcproj(s.gelu(s.fc(s.ln2(x))))


class RMSNorm(torch.nn.Module):
    """LLaMA's RMSNorm, from its definition (torch 1.13 has no nn.RMSNorm)."""

    def __init__(s, D, eps=1e-6):
        super().__init__()
        s.eps = eps
        s.weight = torch.nn.Parameter(torch.ones(D))

    def forward(s, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + s.eps) * s.weight


class Attention(torch.nn.Module):
    """Causal attention on fused [q | k | v] rows with H query heads sharing K key/value
    heads and rotary embeddings, as Meta's LLaMA reference computes them (freqs_cis: the
    pairs (2i, 2i + 1) as complex numbers turned by t theta^(-2i/hs))."""

    def __init__(s, H, K, theta=0.0):
        super().__init__()
        s.H, s.K, s.theta = H, K, theta

    def rope(s, x, T, hs):
        freqs = 1.0 / (s.theta ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
        cis = torch.polar(torch.ones(T, hs // 2, dtype=torch.float64),
                          torch.outer(torch.arange(T, dtype=torch.float64), freqs))
        z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], hs // 2, 2))
        return torch.view_as_real(z * cis.view(1, T, 1, hs // 2)).flatten(-2).float()

    def forward(s, x):
        B, T, W = x.shape
        H, K = s.H, s.K
        hs = W // (H + 2 * K)
        q = x[..., :H * hs].reshape(B, T, H, hs)
        k = x[..., H * hs:(H + K) * hs].reshape(B, T, K, hs)
        v = x[..., (H + K) * hs:].reshape(B, T, K, hs)
        if s.theta:
            q, k = s.rope(q, T, hs), s.rope(k, T, hs)
        k, v = (t.repeat_interleave(H // K, dim=2) for t in (k, v))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / hs ** 0.5
        att = att.masked_fill(torch.tril(torch.ones(T, T)) == 0, float("-inf")).softmax(dim=-1)
        return (att @ v).transpose(1, 2).reshape(B, T, H * hs)


class MoE(torch.nn.Module):
    """A mixture of SwiGLU experts as Mixtral's and DeepSeek-V3's references write it: a
    linear router without bias, softmax (or sigmoid) scores in float64, the top k, gates
    renormalised over them (norm), each expert w2(silu(w1 x) * w3 x) on the tokens routed to
    it, scaled by its gate; and DeepSeek-V3's sequence-wise balance loss (its report's eqs.
    17-20: f_i = E / (K T) x the sample's tokens on expert i, P_i the mean over the sample of
    the normalised scores, alpha sum_i f_i P_i), kept in self.aux as the sum over samples."""

    def __init__(s, C, E, K, F, gate="softmax", norm=True, balance=0.0):
        super().__init__()
        nn = torch.nn
        s.E, s.K, s.gate, s.norm, s.balance = E, K, gate, norm, balance
        s.router = nn.Linear(C, E, bias=False)
        s.w1 = nn.ModuleList(nn.Linear(C, F, bias=False) for _ in range(E))
        s.w3 = nn.ModuleList(nn.Linear(C, F, bias=False) for _ in range(E))
        s.w2 = nn.ModuleList(nn.Linear(F, C, bias=False) for _ in range(E))
        s.ordered = [s.router.weight]
        for e in range(E):
            s.ordered += [s.w1[e].weight, s.w3[e].weight, s.w2[e].weight]

    def route(s, logits, B, T):
        u = torch.sigmoid(logits) if s.gate == "sigmoid" else torch.softmax(logits, dim=-1)
        top, idx = torch.topk(u, s.K, dim=-1)
        gates = top / top.sum(-1, keepdim=True) if s.norm else top
        aux = logits.new_zeros(())
        if s.balance:
            counts = torch.zeros(B, s.E, dtype=torch.float64)
            counts.scatter_add_(1, idx.reshape(B, T * s.K), torch.ones(B, T * s.K, dtype=torch.float64))
            f = counts * s.E / (s.K * T)
            P = (u / u.sum(-1, keepdim=True)).reshape(B, T, s.E).mean(1)
            aux = s.balance * (f * P).sum()
        return gates, idx, aux

    def forward(s, x):
        B, C = x.shape[0], x.shape[-1]
        T = x.shape[1] if x.dim() == 3 else 1
        flat = x.reshape(-1, C)
        logits = flat.double() @ s.router.weight.double().t()
        gates, idx, s.aux = s.route(logits, B, T)
        out = torch.zeros_like(flat)
        for e in range(s.E):
            rows, slot = torch.nonzero(idx == e, as_tuple=True)
            if rows.numel():
                xe = flat[rows]
                y = s.w2[e](torch.nn.functional.silu(s.w1[e](xe)) * s.w3[e](xe))
                out = out.index_add(0, rows, y * gates[rows, slot].float()[:, None])
        return out.reshape(x.shape)


class Positions(torch.nn.Module):
    def __init__(s, T, C):
        super().__init__()
        s.weight = torch.nn.Parameter(torch.zeros(T, C))

    def forward(s, x):
        return x + s.weight


LAYER_CASES = [
    # name, spec (without the input line), input shape, torch modules
    ("linear", "linear 5", (2, 3, 4), lambda: [torch.nn.Linear(4, 5)]),
    ("linear_nobias", "linear 3 bias=false", (2, 6), lambda: [torch.nn.Linear(6, 3, bias=False)]),
    ("conv2d", "conv2d 4 kernel=3 stride=2 pad=1", (2, 3, 7, 6),
     lambda: [torch.nn.Conv2d(3, 4, 3, stride=2, padding=1)]),
    ("conv2d_1x1", "conv2d 2 kernel=1", (2, 3, 4, 4), lambda: [torch.nn.Conv2d(3, 2, 1)]),
    ("relu", "relu", (2, 7), lambda: [torch.nn.ReLU()]),
    ("gelu", "gelu", (2, 7), lambda: [torch.nn.GELU()]),
    ("maxpool2d", "maxpool2d 2", (2, 3, 6, 4), lambda: [torch.nn.MaxPool2d(2)]),
    ("maxpool2d_k3s2", "maxpool2d 3 stride=2", (2, 2, 7, 7), lambda: [torch.nn.MaxPool2d(3, stride=2)]),
    ("flatten", "flatten", (2, 2, 3, 2), lambda: [torch.nn.Flatten()]),
    ("layernorm", "layernorm", (2, 3, 8), lambda: [torch.nn.LayerNorm(8)]),
    ("position_embedding", "position_embedding", (2, 4, 3), lambda: [Positions(4, 3)]),
    ("transformer_block", "transformer_block heads=2", (2, 5, 8), lambda: [Block(8, 2)]),
    ("transformer_block_erf", "transformer_block heads=4 mlp=2 gelu=erf", (3, 6, 8),
     lambda: [Block(8, 4, mlp=2, gelu="erf")]),
    ("avgpool2d", "avgpool2d 2", (2, 3, 6, 5), lambda: [torch.nn.AvgPool2d(2)]),
    ("avgpool2d_k3s2p1", "avgpool2d 3 stride=2 pad=1", (2, 2, 7, 7),
     lambda: [torch.nn.AvgPool2d(3, stride=2, padding=1)]),
    ("adaptive_avgpool2d", "adaptive_avgpool2d", (2, 3, 7, 5), lambda: [torch.nn.AdaptiveAvgPool2d(1)]),
    ("adaptive_avgpool2d_3", "adaptive_avgpool2d 3", (2, 2, 7, 5), lambda: [torch.nn.AdaptiveAvgPool2d(3)]),
    ("sigmoid", "sigmoid", (2, 7), lambda: [torch.nn.Sigmoid()]),
    ("tanh", "tanh", (2, 7), lambda: [torch.nn.Tanh()]),
    ("rmsnorm", "rmsnorm", (2, 3, 8), lambda: [RMSNorm(8)]),
    ("silu", "silu", (2, 7), lambda: [torch.nn.SiLU()]),
    ("attention", "attention heads=2", (2, 5, 12), lambda: [Attention(2, 2)]),
    ("attention_gqa_rope", "attention heads=4 kv_heads=2 rope_theta=10000", (2, 6, 32),
     lambda: [Attention(4, 2, 10000.0)]),
    ("maxpool2d_k3s2p1", "maxpool2d 3 stride=2 pad=1", (2, 2, 7, 6),
     lambda: [torch.nn.MaxPool2d(3, stride=2, padding=1)]),
    ("batchnorm2d", "batchnorm2d", (3, 3, 4, 5), lambda: [torch.nn.BatchNorm2d(3)]),
    ("batchnorm1d", "batchnorm1d eps=0.001 momentum=0.3", (4, 6),
     lambda: [torch.nn.BatchNorm1d(6, eps=1e-3, momentum=0.3)]),
    ("batchnorm1d_cl", "batchnorm1d", (2, 3, 5), lambda: [torch.nn.BatchNorm1d(3)]),
    ("conv2d_groups", "conv2d 6 kernel=3 pad=1 groups=2", (2, 4, 5, 5),
     lambda: [torch.nn.Conv2d(4, 6, 3, padding=1, groups=2)]),
    ("conv2d_depthwise", "conv2d 4 kernel=3 stride=2 groups=4 bias=false", (2, 4, 6, 6),
     lambda: [torch.nn.Conv2d(4, 4, 3, stride=2, groups=4, bias=False)]),
]


class Residual(torch.nn.Module):
    """x -> tanh(relu(conv(x)) + x): the input read twice."""

    def __init__(s):
        super().__init__()
        s.conv = torch.nn.Conv2d(2, 2, 3, padding=1)
        s.ordered = [s.conv.weight, s.conv.bias]

    def forward(s, x):
        return torch.tanh(torch.relu(s.conv(x)) + x)


class Dense(torch.nn.Module):
    """Two branches and the input joined along the channels, as a DenseNet's block does."""

    def __init__(s):
        super().__init__()
        nn = torch.nn
        s.a, s.b, s.fc = nn.Conv2d(2, 3, 1), nn.Conv2d(2, 1, 3, padding=1), nn.Linear(24, 3)
        s.ordered = [s.a.weight, s.a.bias, s.b.weight, s.b.bias, s.fc.weight, s.fc.bias]

    def forward(s, x):
        y = torch.cat([s.a(x), s.b(x), x], dim=1)
        return s.fc(torch.flatten(torch.nn.functional.avg_pool2d(torch.sigmoid(y), 2), 1))


class SwiGLU(torch.nn.Module):
    """LLaMA's MLP from its definition, with its residual: x + W2 (silu(W1 n) * W3 n), n =
    RMSNorm(x)."""

    def __init__(s, C, M):
        super().__init__()
        nn = torch.nn
        s.norm, s.w1, s.w3, s.w2 = RMSNorm(C), nn.Linear(C, M, bias=False), \
            nn.Linear(C, M, bias=False), nn.Linear(M, C, bias=False)
        s.ordered = [s.norm.weight, s.w1.weight, s.w3.weight, s.w2.weight]

    def forward(s, x):
        n = s.norm(x)
        return x + s.w2(torch.nn.functional.silu(s.w1(n)) * s.w3(n))


class LlamaBlock(torch.nn.Module):
    """A LLaMA-family block from its public definition: x1 = x + Wo attn(rope(Wqkv
    RMSNorm(x))), out = x1 + SwiGLU(RMSNorm(x1)); no biases; 2 query heads on 1 key/value head."""

    def __init__(s, C=8, M=12):
        super().__init__()
        nn = torch.nn
        s.n1, s.qkv, s.att = RMSNorm(C), nn.Linear(C, 16, bias=False), Attention(2, 1, 10000.0)
        s.o, s.mlp = nn.Linear(8, C, bias=False), SwiGLU(C, M)
        s.ordered = [s.n1.weight, s.qkv.weight, s.o.weight] + s.mlp.ordered

    def forward(s, x):
        return s.mlp(x + s.o(s.att(s.qkv(s.n1(x)))))


# name, the whole spec, input shape, module: graphs, whose lines name what they read
GRAPH_CASES = [
    ("graph_residual", "x = input 2 5 4 | c = conv2d 2 kernel=3 pad=1 | r = relu | add < r x | tanh",
     (2, 2, 5, 4), Residual),
    ("graph_concat", "x = input 2 4 4 | a = conv2d 3 kernel=1 | b = conv2d 1 kernel=3 pad=1 < x | "
     "concat < a b x | sigmoid | avgpool2d 2 | flatten | linear 3", (2, 2, 4, 4), Dense),
    ("graph_swiglu", "x = input 3 6 | n = rmsnorm | w1 = linear 8 bias=false | g = silu | "
     "w3 = linear 8 bias=false < n | mul < g w3 | m = linear 6 bias=false | add < m x",
     (2, 3, 6), lambda: SwiGLU(6, 8)),
    ("graph_llama_block", "x = input 4 8 | rmsnorm | linear 16 bias=false | "
     "attention heads=2 kv_heads=1 rope_theta=10000 | o = linear 8 bias=false | x1 = add < o x | "
     "n = rmsnorm | w1 = linear 12 bias=false | s = silu | w3 = linear 12 bias=false < n | "
     "mul < s w3 | m = linear 8 bias=false | add < m x1", (2, 4, 8), LlamaBlock),
]


def layer_case(name, spec, shape, make, whole=False):
    mods = make()
    params = params_of(mods)
    set_params(params)
    n = 1
    for d in shape:
        n *= d
    x = tensor(n, 1, 4.0, shape).requires_grad_(True)
    out = x
    for m in mods:
        out = m(out)
    r = tensor(out.numel(), 7, 2.0, out.shape)
    ((out * r).sum() + sum(getattr(m, "aux", 0) for m in mods)).backward()
    print("case", name, "layer", shape[0])
    if whole:
        print("spec", spec)
    else:
        print("spec", "input " + " ".join(str(d) for d in shape[1:]), "|", spec)
    emit("out", out)
    emit("din", x.grad)
    for v, p in enumerate(params):
        if p.grad is None:  # a batchnorm's statistics: their value after the forward
            emit("after%d" % v, p)
        else:
            emit("grad%d" % v, p.grad)
    print("end")


def embedding_case():
    V, D, T, B = 11, 4, 5, 3
    emb = torch.nn.Embedding(V, D)
    ln = torch.nn.LayerNorm(D)
    set_params([emb.weight, ln.weight, ln.bias])
    ids = torch.tensor([[(b * T + t) * 13 % V for t in range(T)] for b in range(B)])
    out = ln(emb(ids))
    r = tensor(out.numel(), 7, 2.0, out.shape)
    (out * r).sum().backward()
    print("case embedding layer", B)
    print("spec input %d | embedding %d %d | layernorm" % (T, V, D))
    emit("out", out)
    emit("grad0", emb.weight.grad)
    emit("grad1", ln.weight.grad)
    emit("grad2", ln.bias.grad)
    print("end")


def model_case(name, spec, mods, B):
    seq = torch.nn.Sequential(*mods)
    params = params_of(mods)
    set_params(params)
    x = tensor(B * 784, 1, 2.0, (B, 1, 28, 28)) + 0.5
    y = torch.tensor([(i * 31 + 3) % 10 for i in range(B)])
    logits = seq(x)
    loss = torch.nn.functional.cross_entropy(logits, y)
    loss.backward()
    print("case", name, "model", B)
    print("spec", spec)
    emit("logits", logits)
    emit("loss", loss.reshape(1))
    for v, p in enumerate(params):
        emit_stats("grad%d" % v, p.grad)
    print("end")


MOE_CASES = [
    ("moe_softmax", "moe experts=4 top_k=2 ffn=6", (2, 5, 8), lambda: [MoE(8, 4, 2, 6)]),
    ("moe_balance", "moe experts=4 top_k=2 ffn=6 balance=0.25", (2, 5, 8),
     lambda: [MoE(8, 4, 2, 6, balance=0.25)]),
    ("moe_sigmoid", "moe experts=4 top_k=3 ffn=5 gate=sigmoid balance=0.5", (3, 4, 6),
     lambda: [MoE(6, 4, 3, 5, gate="sigmoid", balance=0.5)]),
    ("moe_topk1_raw", "moe experts=4 top_k=1 ffn=4 norm=false", (3, 7), lambda: [MoE(7, 4, 1, 4, norm=False)]),
]

# name, options of the moe layer, samples B, tokens a sample T
ROUTER_CASES = [
    ("router_softmax", "experts=6 top_k=2 ffn=1 balance=0.25", 3, 5),
    ("router_sigmoid", "experts=8 top_k=3 ffn=1 gate=sigmoid balance=0.5", 2, 6),
    ("router_raw", "experts=5 top_k=2 ffn=1 norm=false balance=1", 2, 4),
]


def router_case(name, options, B, T):
    """The router alone in float64: scores value(i, 3, 6), the gates' gradient value(i, 9, 2),
    the balance loss weighted 1 / B (the C test's loss_scale)."""
    words = dict(w.split("=") for w in options.split())
    E, K = int(words["experts"]), int(words["top_k"])
    m = MoE(1, E, K, 1, gate=words.get("gate", "softmax"), norm=words.get("norm", "true") == "true",
            balance=float(words["balance"]))
    R = B * T
    logits = torch.tensor([value(i, 3, 6.0) for i in range(R * E)], dtype=torch.float64)
    logits = logits.reshape(R, E).requires_grad_(True)
    dgate = torch.tensor([value(i, 9, 2.0) for i in range(R * K)], dtype=torch.float64).reshape(R, K)
    gates, idx, aux = m.route(logits, B, T)
    ((gates * dgate).sum() + aux / B).backward()
    print("case", name, "router", B)
    print("spec input %d 1 | moe %s" % (T, options))
    print("chosen", R * K, " ".join(str(int(v)) for v in idx.reshape(-1).tolist()))
    for key, t in (("gate", gates), ("loss", aux.reshape(1)), ("dlogits", logits.grad)):
        flat = t.detach().reshape(-1).tolist()
        print(key, len(flat), " ".join("%.17g" % v for v in flat))
    print("end")


def moe_main():
    print("# PyTorch %s reference outputs; see make_refs.py (--moe)" % torch.__version__)
    for case in MOE_CASES:
        layer_case(*case)
    for case in ROUTER_CASES:
        router_case(*case)


def main():
    if "--moe" in sys.argv:
        return moe_main()
    print("# PyTorch %s reference outputs; see make_refs.py" % torch.__version__)
    for case in LAYER_CASES:
        layer_case(*case)
    for name, spec, shape, module in GRAPH_CASES:
        layer_case(name, spec, shape, lambda: [module()], whole=True)
    embedding_case()
    nn = torch.nn
    model_case("mlp",
               "input 1 28 28 | flatten | linear 512 | relu | linear 512 | relu | linear 10 | softmax_cross_entropy",
               [nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)], 8)
    model_case("cnn",
               "input 1 28 28 | conv2d 16 kernel=3 pad=1 | relu | maxpool2d 2 | conv2d 32 kernel=3 pad=1 | relu | "
               "maxpool2d 2 | flatten | linear 10 | softmax_cross_entropy",
               [nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1),
                nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 7 * 7, 10)], 8)


if __name__ == "__main__":
    main()
