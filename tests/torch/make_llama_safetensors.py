#!/usr/bin/env python3
"""Writes tests/fixtures/llama/: a small LLaMA-family model in PyTorch, with the module names of
Meta's llama/model.py (tok_embeddings, layers.i.attention.wq/wk/wv/wo, attention_norm, ffn_norm,
feed_forward.w1/w2/w3, norm, output), initialised by PyTorch (seed 0; the RMSNorm weights moved
off 1 so that a misplaced norm shows), its state_dict saved as safetensors (F32), and PyTorch's
losses on a fixed batch before and after three AdamW updates. tests/test_safetensors.c imports
the file into tests/fixtures/llama/tiny.model and must take the same losses. The same weights
under Hugging Face's names (transformers' LlamaForCausalLM: model.embed_tokens,
model.layers.i.self_attn.q_proj ... mlp.down_proj, model.norm, lm_head), their Q and K rows
permuted as its convert_llama_weights_to_hf.py permutes Meta's, go to tiny_hf.safetensors, after
a module of that layout with Hugging Face's rotary convention (rotate_half: a head's halves) was
checked to take the Meta module's losses within 1e-5.

    /usr/bin/python3 tests/torch/make_llama_safetensors.py [OUT_DIR]

The model is written here from the public architecture (Meta's LLaMA: RMSNorm, rotary pairs as
complex numbers, key/value heads repeated for their query heads, w2(silu(w1 x) * w3 x)). The
safetensors file is written from the format's description (a u64 header length, the JSON header,
the data), since the safetensors package is not in Debian; repipe's reader is checked against
files the package itself wrote (tests/fixtures/safetensors).
"""
import json
import os
import struct
import sys

import torch
from torch import nn

V, T, C, H, K, M, BLOCKS, EPS, THETA = 32, 8, 16, 2, 1, 40, 2, 1e-5, 10000.0
HS = C // H
B, UPDATES = 4, 3
OPT = dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)


class RMSNorm(nn.Module):
    def __init__(s, d):
        super().__init__()
        s.weight = nn.Parameter(torch.ones(d))

    def forward(s, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * s.weight


def rope(x):  # (B, T, heads, HS), Meta's interleaved pairs
    freqs = 1.0 / (THETA ** (torch.arange(0, HS, 2, dtype=torch.float64) / HS))
    cis = torch.polar(torch.ones(T, HS // 2, dtype=torch.float64),
                      torch.outer(torch.arange(T, dtype=torch.float64), freqs))
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], HS // 2, 2))
    return torch.view_as_real(z * cis.view(1, T, 1, HS // 2)).flatten(-2).float()


class Attention(nn.Module):
    def __init__(s):
        super().__init__()
        s.wq, s.wk = nn.Linear(C, H * HS, bias=False), nn.Linear(C, K * HS, bias=False)
        s.wv, s.wo = nn.Linear(C, K * HS, bias=False), nn.Linear(H * HS, C, bias=False)

    def forward(s, x):
        b = x.shape[0]
        q, k = rope(s.wq(x).view(b, T, H, HS)), rope(s.wk(x).view(b, T, K, HS))
        v = s.wv(x).view(b, T, K, HS)
        k, v = (a.repeat_interleave(H // K, dim=2) for a in (k, v))
        q, k, v = (a.transpose(1, 2) for a in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / HS ** 0.5
        att = att.masked_fill(torch.tril(torch.ones(T, T)) == 0, float("-inf")).softmax(-1)
        return s.wo((att @ v).transpose(1, 2).reshape(b, T, H * HS))


class FeedForward(nn.Module):
    def __init__(s):
        super().__init__()
        s.w1, s.w2 = nn.Linear(C, M, bias=False), nn.Linear(M, C, bias=False)
        s.w3 = nn.Linear(C, M, bias=False)

    def forward(s, x):
        return s.w2(nn.functional.silu(s.w1(x)) * s.w3(x))


class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.attention, s.feed_forward = Attention(), FeedForward()
        s.attention_norm, s.ffn_norm = RMSNorm(C), RMSNorm(C)

    def forward(s, x):
        h = x + s.attention(s.attention_norm(x))
        return h + s.feed_forward(s.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(s):
        super().__init__()
        s.tok_embeddings = nn.Embedding(V, C)
        s.layers = nn.ModuleList(Block() for _ in range(BLOCKS))
        s.norm, s.output = RMSNorm(C), nn.Linear(C, V, bias=False)

    def forward(s, tokens):
        h = s.tok_embeddings(tokens)
        for layer in s.layers:
            h = layer(h)
        return s.output(s.norm(h))


def rotate_half(x):  # Hugging Face's rotary convention: a head's halves, not its pairs
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_hf(x):  # (B, T, heads, HS)
    freqs = 1.0 / (THETA ** (torch.arange(0, HS, 2, dtype=torch.float64) / HS))
    angles = torch.outer(torch.arange(T, dtype=torch.float64), freqs)
    emb = torch.cat((angles, angles), dim=-1).view(1, T, 1, HS)
    return (x.double() * emb.cos() + rotate_half(x.double()) * emb.sin()).float()


class HFAttention(nn.Module):
    def __init__(s):
        super().__init__()
        s.q_proj, s.k_proj = nn.Linear(C, H * HS, bias=False), nn.Linear(C, K * HS, bias=False)
        s.v_proj, s.o_proj = nn.Linear(C, K * HS, bias=False), nn.Linear(H * HS, C, bias=False)

    def forward(s, x):
        b = x.shape[0]
        q, k = rope_hf(s.q_proj(x).view(b, T, H, HS)), rope_hf(s.k_proj(x).view(b, T, K, HS))
        v = s.v_proj(x).view(b, T, K, HS)
        k, v = (a.repeat_interleave(H // K, dim=2) for a in (k, v))
        q, k, v = (a.transpose(1, 2) for a in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / HS ** 0.5
        att = att.masked_fill(torch.tril(torch.ones(T, T)) == 0, float("-inf")).softmax(-1)
        return s.o_proj((att @ v).transpose(1, 2).reshape(b, T, H * HS))


class HFMLP(nn.Module):
    def __init__(s):
        super().__init__()
        s.gate_proj, s.up_proj = nn.Linear(C, M, bias=False), nn.Linear(C, M, bias=False)
        s.down_proj = nn.Linear(M, C, bias=False)

    def forward(s, x):
        return s.down_proj(nn.functional.silu(s.gate_proj(x)) * s.up_proj(x))


class HFLayer(nn.Module):
    def __init__(s):
        super().__init__()
        s.self_attn, s.mlp = HFAttention(), HFMLP()
        s.input_layernorm, s.post_attention_layernorm = RMSNorm(C), RMSNorm(C)

    def forward(s, x):
        h = x + s.self_attn(s.input_layernorm(x))
        return h + s.mlp(s.post_attention_layernorm(h))


class HFModel(nn.Module):
    def __init__(s):
        super().__init__()
        s.embed_tokens = nn.Embedding(V, C)
        s.layers = nn.ModuleList(HFLayer() for _ in range(BLOCKS))
        s.norm = RMSNorm(C)


class HFForCausalLM(nn.Module):
    """Hugging Face's LlamaForCausalLM's module names, from its public architecture."""

    def __init__(s):
        super().__init__()
        s.model, s.lm_head = HFModel(), nn.Linear(C, V, bias=False)

    def forward(s, tokens):
        h = s.model.embed_tokens(tokens)
        for layer in s.model.layers:
            h = layer(h)
        return s.lm_head(s.model.norm(h))


def permute(w, heads):
    """Hugging Face's conversion of Meta's Q or K rows (its convert_llama_weights_to_hf.py):
    each head's (pairs, 2) rows viewed as (2, pairs), so row p * hs/2 + i is Meta's 2i + p."""
    rows, cols = w.shape
    return w.view(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def hf_state(meta):
    """Meta's state_dict under Hugging Face's names and rotary order."""
    out = {"model.embed_tokens.weight": meta["tok_embeddings.weight"]}
    for i in range(BLOCKS):
        m, h = "layers.%d." % i, "model.layers.%d." % i
        out[h + "self_attn.q_proj.weight"] = permute(meta[m + "attention.wq.weight"], H)
        out[h + "self_attn.k_proj.weight"] = permute(meta[m + "attention.wk.weight"], K)
        out[h + "self_attn.v_proj.weight"] = meta[m + "attention.wv.weight"]
        out[h + "self_attn.o_proj.weight"] = meta[m + "attention.wo.weight"]
        out[h + "mlp.gate_proj.weight"] = meta[m + "feed_forward.w1.weight"]
        out[h + "mlp.up_proj.weight"] = meta[m + "feed_forward.w3.weight"]
        out[h + "mlp.down_proj.weight"] = meta[m + "feed_forward.w2.weight"]
        out[h + "input_layernorm.weight"] = meta[m + "attention_norm.weight"]
        out[h + "post_attention_layernorm.weight"] = meta[m + "ffn_norm.weight"]
    out["model.norm.weight"], out["lm_head.weight"] = meta["norm.weight"], meta["output.weight"]
    return out


def run(model, x, y):
    adam = torch.optim.AdamW(model.parameters(), **OPT)
    losses = []
    for _ in range(UPDATES):
        adam.zero_grad()
        loss = nn.functional.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))
        loss.backward()
        adam.step()
        losses.append(loss.item())
    with torch.no_grad():
        losses.append(nn.functional.cross_entropy(model(x).reshape(-1, V), y.reshape(-1)).item())
    return losses


def save_safetensors(tensors, path):
    """F32 tensors in the given order: u64 header length, the JSON header padded with spaces to
    8 bytes, then the data."""
    header, data, at = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        b = t.detach().contiguous().float().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [at, at + len(b)]}
        data.append(b)
        at += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(data))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "llama")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Transformer()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
    save_safetensors(model.state_dict(), os.path.join(out, "tiny.safetensors"))
    hf = HFForCausalLM()
    hf.load_state_dict(hf_state({k: v.clone() for k, v in model.state_dict().items()}))
    assert list(hf.state_dict()) == list(hf_state(model.state_dict()))  # the module's order
    save_safetensors(hf.state_dict(), os.path.join(out, "tiny_hf.safetensors"))
    tokens = torch.randint(0, V, (B, T + 1), generator=torch.Generator().manual_seed(1))
    x, y = tokens[:, :T], tokens[:, 1:]
    losses, hf_losses = run(model, x, y), run(hf, x, y)
    gap = max(abs(a - b) for a, b in zip(losses, hf_losses))
    assert gap < 1e-5, "Hugging Face's layout and rotary order off Meta's by %g" % gap
    with open(os.path.join(out, "tiny_losses.txt"), "w") as f:
        f.write("# PyTorch %s (tests/torch/make_llama_safetensors.py): tiny.safetensors' model "
                "on %d windows of %d tokens (+1 target), AdamW lr %g betas %g %g eps %g "
                "weight_decay %g; the loss before each of %d updates, then after the last\n" %
                (torch.__version__, B, T, OPT["lr"], OPT["betas"][0], OPT["betas"][1],
                 OPT["eps"], OPT["weight_decay"], UPDATES))
        for row in tokens.tolist():
            f.write("window %s\n" % " ".join(str(v) for v in row))
        f.write("losses %s\n" % " ".join("%.9g" % v for v in losses))
    print("wrote %s: losses %s (Hugging Face's layout within %.2g)" %
          (out, " ".join("%.6f" % v for v in losses), gap))


if __name__ == "__main__":
    main()
