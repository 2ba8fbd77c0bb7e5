"""A LLaMA-family model in PyTorch, written from the public architecture, for the references
(tests/torch/make_llama_safetensors.py) and the bench beside repipe (bench/llama_vs_torch.py).

Two layouts of one model. Transformer has the module names of Meta's llama/model.py
(tok_embeddings, layers.i.attention.wq/wk/wv/wo, attention_norm, ffn_norm,
feed_forward.w1/w2/w3, norm, output), so that its state_dict is Meta's, and Meta's rotary
convention (a head's features in interleaved pairs, as complex numbers). HFForCausalLM has the
names of transformers' LlamaForCausalLM (model.embed_tokens, model.layers.i.self_attn.q_proj ...,
mlp.gate_proj/up_proj/down_proj, input_layernorm, post_attention_layernorm, model.norm, lm_head)
and its rotary convention (a head's halves rotated against each other); hf_state() converts
Meta's state_dict to it as transformers' convert_llama_weights_to_hf.py does. Both: RMSNorm,
grouped-query attention (key/value heads repeated for their query heads), w2(silu(w1 x) * w3 x),
no biases, an untied head.
"""
from collections import namedtuple

import torch
from torch import nn

Shape = namedtuple("Shape", "V T C H K M blocks eps theta")

# The rotary embeddings' arithmetic: float64 for the references (so that PyTorch's side is the
# more exact one), float32 for a speed comparison, as Meta's code runs it (complex64).
ROPE_DTYPE = torch.float64
_cache = {}


class RMSNorm(nn.Module):
    def __init__(s, d, eps):
        super().__init__()
        s.eps, s.weight = eps, nn.Parameter(torch.ones(d))

    def forward(s, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + s.eps) * s.weight


def _angles(a):
    hs = a.C // a.H
    freqs = 1.0 / (a.theta ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
    return torch.outer(torch.arange(a.T, dtype=torch.float64), freqs)  # (T, hs / 2)


def _cis(a):  # Meta's freqs_cis, computed once per shape and precision
    key = (a, ROPE_DTYPE)
    if key not in _cache:
        hs = a.C // a.H
        cis = torch.polar(torch.ones(a.T, hs // 2, dtype=torch.float64), _angles(a))
        _cache[key] = (cis if ROPE_DTYPE == torch.float64 else cis.to(torch.complex64)).view(
            1, a.T, 1, hs // 2)
    return _cache[key]


def rope_meta(a, x):  # (B, T, heads, hs): interleaved pairs as complex numbers
    hs = x.shape[-1]
    z = torch.view_as_complex(x.to(ROPE_DTYPE).reshape(*x.shape[:-1], hs // 2, 2))
    return torch.view_as_real(z * _cis(a)).flatten(-2).float()


def rope_hf(a, x):  # (B, T, heads, hs): a head's halves
    hs, half = x.shape[-1], x.shape[-1] // 2
    emb = torch.cat((_angles(a), _angles(a)), dim=-1).view(1, a.T, 1, hs)
    x = x.double()
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * emb.cos() + rotated * emb.sin()).float()


def attend(a, q, k, v):
    """Causal attention of (B, T, heads, hs) queries on their key/value heads."""
    b, hs = q.shape[0], a.C // a.H
    k, v = (t.repeat_interleave(a.H // a.K, dim=2) for t in (k, v))
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    att = (q @ k.transpose(-2, -1)) / hs ** 0.5
    att = att.masked_fill(torch.tril(torch.ones(a.T, a.T)) == 0, float("-inf")).softmax(-1)
    return (att @ v).transpose(1, 2).reshape(b, a.T, a.C)


def _qkv(a):
    hs = a.C // a.H
    return (nn.Linear(a.C, a.H * hs, bias=False), nn.Linear(a.C, a.K * hs, bias=False),
            nn.Linear(a.C, a.K * hs, bias=False), nn.Linear(a.H * hs, a.C, bias=False))


class Attention(nn.Module):
    def __init__(s, a):
        super().__init__()
        s.a = a
        s.wq, s.wk, s.wv, s.wo = _qkv(a)

    def forward(s, x):
        a, b, hs = s.a, x.shape[0], s.a.C // s.a.H
        q = rope_meta(a, s.wq(x).view(b, a.T, a.H, hs))
        k = rope_meta(a, s.wk(x).view(b, a.T, a.K, hs))
        return s.wo(attend(a, q, k, s.wv(x).view(b, a.T, a.K, hs)))


class FeedForward(nn.Module):
    def __init__(s, a):
        super().__init__()
        s.w1, s.w2 = nn.Linear(a.C, a.M, bias=False), nn.Linear(a.M, a.C, bias=False)
        s.w3 = nn.Linear(a.C, a.M, bias=False)

    def forward(s, x):
        return s.w2(nn.functional.silu(s.w1(x)) * s.w3(x))


class Block(nn.Module):
    def __init__(s, a):
        super().__init__()
        s.attention, s.feed_forward = Attention(a), FeedForward(a)
        s.attention_norm, s.ffn_norm = RMSNorm(a.C, a.eps), RMSNorm(a.C, a.eps)

    def forward(s, x):
        h = x + s.attention(s.attention_norm(x))
        return h + s.feed_forward(s.ffn_norm(h))


class Transformer(nn.Module):
    """Meta's layout."""

    def __init__(s, a):
        super().__init__()
        s.tok_embeddings = nn.Embedding(a.V, a.C)
        s.layers = nn.ModuleList(Block(a) for _ in range(a.blocks))
        s.norm, s.output = RMSNorm(a.C, a.eps), nn.Linear(a.C, a.V, bias=False)

    def forward(s, tokens):
        h = s.tok_embeddings(tokens)
        for layer in s.layers:
            h = layer(h)
        return s.output(s.norm(h))


class HFAttention(nn.Module):
    def __init__(s, a):
        super().__init__()
        s.a = a
        s.q_proj, s.k_proj, s.v_proj, s.o_proj = _qkv(a)

    def forward(s, x):
        a, b, hs = s.a, x.shape[0], s.a.C // s.a.H
        q = rope_hf(a, s.q_proj(x).view(b, a.T, a.H, hs))
        k = rope_hf(a, s.k_proj(x).view(b, a.T, a.K, hs))
        return s.o_proj(attend(a, q, k, s.v_proj(x).view(b, a.T, a.K, hs)))


class HFMLP(nn.Module):
    def __init__(s, a):
        super().__init__()
        s.gate_proj, s.up_proj = nn.Linear(a.C, a.M, bias=False), nn.Linear(a.C, a.M, bias=False)
        s.down_proj = nn.Linear(a.M, a.C, bias=False)

    def forward(s, x):
        return s.down_proj(nn.functional.silu(s.gate_proj(x)) * s.up_proj(x))


class HFLayer(nn.Module):
    def __init__(s, a):
        super().__init__()
        s.self_attn, s.mlp = HFAttention(a), HFMLP(a)
        s.input_layernorm = RMSNorm(a.C, a.eps)
        s.post_attention_layernorm = RMSNorm(a.C, a.eps)

    def forward(s, x):
        h = x + s.self_attn(s.input_layernorm(x))
        return h + s.mlp(s.post_attention_layernorm(h))


class HFModel(nn.Module):
    def __init__(s, a):
        super().__init__()
        s.embed_tokens = nn.Embedding(a.V, a.C)
        s.layers = nn.ModuleList(HFLayer(a) for _ in range(a.blocks))
        s.norm = RMSNorm(a.C, a.eps)


class HFForCausalLM(nn.Module):
    """Hugging Face's layout."""

    def __init__(s, a):
        super().__init__()
        s.model, s.lm_head = HFModel(a), nn.Linear(a.C, a.V, bias=False)

    def forward(s, tokens):
        h = s.model.embed_tokens(tokens)
        for layer in s.model.layers:
            h = layer(h)
        return s.lm_head(s.model.norm(h))


def permute(w, heads):
    """Hugging Face's conversion of Meta's Q or K rows (convert_llama_weights_to_hf.py): each
    head's (pairs, 2) rows viewed as (2, pairs), so row p * hs/2 + i is Meta's 2i + p."""
    rows, cols = w.shape
    return w.view(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def hf_state(a, meta):
    """Meta's state_dict under Hugging Face's names and rotary order."""
    out = {"model.embed_tokens.weight": meta["tok_embeddings.weight"]}
    for i in range(a.blocks):
        m, h = "layers.%d." % i, "model.layers.%d." % i
        out[h + "self_attn.q_proj.weight"] = permute(meta[m + "attention.wq.weight"], a.H)
        out[h + "self_attn.k_proj.weight"] = permute(meta[m + "attention.wk.weight"], a.K)
        out[h + "self_attn.v_proj.weight"] = meta[m + "attention.wv.weight"]
        out[h + "self_attn.o_proj.weight"] = meta[m + "attention.wo.weight"]
        out[h + "mlp.gate_proj.weight"] = meta[m + "feed_forward.w1.weight"]
        out[h + "mlp.up_proj.weight"] = meta[m + "feed_forward.w3.weight"]
        out[h + "mlp.down_proj.weight"] = meta[m + "feed_forward.w2.weight"]
        out[h + "input_layernorm.weight"] = meta[m + "attention_norm.weight"]
        out[h + "post_attention_layernorm.weight"] = meta[m + "ffn_norm.weight"]
    out["model.norm.weight"], out["lm_head.weight"] = meta["norm.weight"], meta["output.weight"]
    return out
