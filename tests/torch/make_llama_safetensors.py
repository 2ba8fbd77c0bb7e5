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

The model is tests/torch/llama_torch.py's, written from the public architecture. The
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

from llama_torch import HFForCausalLM, Shape, Transformer, hf_state

SHAPE = Shape(V=32, T=8, C=16, H=2, K=1, M=40, blocks=2, eps=1e-5, theta=10000.0)
V, T = SHAPE.V, SHAPE.T
B, UPDATES = 4, 3
OPT = dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)


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
    model = Transformer(SHAPE)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
    save_safetensors(model.state_dict(), os.path.join(out, "tiny.safetensors"))
    hf = HFForCausalLM(SHAPE)
    hf.load_state_dict(hf_state(SHAPE, {k: v.clone() for k, v in model.state_dict().items()}))
    assert list(hf.state_dict()) == list(hf_state(SHAPE, model.state_dict()))  # its order
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
