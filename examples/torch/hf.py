"""A Hugging Face transformers model as it is, from profile to a pipeline on torch.distributed.

    python examples/torch/hf.py profile --model llama --out DIR/graph.txt
    repipe plan --profile DIR/graph.txt --machines 4 --pp 4 ... --config-out DIR/plan.json
    torchrun --standalone --nproc-per-node 4 examples/torch/hf.py train --model llama \\
        --plan DIR/plan.json

--model is a model_type of transformers (gpt2, llama, mistral, qwen2, bert, ...), built by
its Auto class from its config class with small sizes (--hidden, --layers, ...), or --config
a model's config.json (its sizes as written, unless given). The weights are random: put
from_pretrained in its place for real ones. Nothing of the model is changed or wrapped: the
profile's nodes are its embedding, a node a decoder (or encoder) layer, its final norm and its
head, and the loss reads its logits. docs/python.md walks through it.
"""
import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import repipe.torch as rt  # noqa: E402

ENCODERS = ("bert", "roberta", "distilbert", "electra")  # trained as masked LMs here


def build(a):
    import transformers
    sizes = {k: v for k, v in (("hidden_size", a.hidden), ("num_hidden_layers", a.layers),
                                ("num_attention_heads", a.heads),
                                ("vocab_size", a.vocab), ("max_position_embeddings", a.seq))
             if v is not None}
    if a.config:
        with open(a.config) as f:
            keys = json.load(f)
        kind = keys.pop("model_type")
        keys.update(sizes)
        if a.layers is not None and "layer_types" in keys:  # (a kind of attention a layer)
            keys["layer_types"] = keys["layer_types"][:a.layers]
    else:  # transformers' defaults are full-size models: these make one a CPU trains
        kind = a.model
        keys = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, vocab_size=512,
                    max_position_embeddings=a.seq or 64)
        keys.update(sizes)
        if kind != "gpt2":  # (GPT-2's inner size is 4 x hidden, its n_inner unset)
            keys.setdefault("intermediate_size", 4 * keys["hidden_size"])
        # (Mistral's default is 8 key-value heads, more than these 4 query heads)
        keys["num_key_value_heads"] = a.kv_heads or keys["num_attention_heads"]
    # no dropout: a pipeline's stages draw masks from other generators than one process does
    for k in ("hidden_dropout_prob", "attention_probs_dropout_prob", "attention_dropout",
              "resid_pdrop", "embd_pdrop", "attn_pdrop"):
        keys[k] = 0.0
    cfg = transformers.AutoConfig.for_model(kind, **keys)
    auto = (transformers.AutoModelForMaskedLM if kind in ENCODERS
            else transformers.AutoModelForCausalLM)
    return auto.from_config(cfg), cfg


def batch(n, step, cfg, seq):
    """n random token sequences and their next tokens (a stand-in for your data)."""
    g = torch.Generator().manual_seed(step)
    rows = torch.randint(0, cfg.vocab_size, (n, seq + 1), generator=g)
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def loss_fn(logits, targets):  # logits (batch, positions, vocabulary), targets (batch, positions)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["profile", "train"])
    ap.add_argument("--model", default="llama", help="a transformers model_type [llama]")
    ap.add_argument("--config", help="a model's config.json, in place of --model")
    ap.add_argument("--hidden", type=int)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--seq", type=int, help="tokens a sequence [64]")
    ap.add_argument("--out", default="graph.txt", help="profile: the graph.txt to write")
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--plan", default="plan.json")
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    torch.manual_seed(0)
    model, cfg = build(a)
    seq = a.seq or 64
    if a.what == "profile":
        x, _ = batch(a.micro_batch, 0, cfg, seq)
        rt.profile(model, x, out=a.out)
        print("profile of %s (%d parameters) written to %s"
              % (type(model).__name__, sum(p.numel() for p in model.parameters()), a.out))
        return
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    pipe = rt.Pipeline(model, a.plan, loss_fn=loss_fn,
                       optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3))
    n = pipe.B * pipe.GA * pipe.R  # the plan's sequences per update
    for step in range(a.steps):
        x, y = batch(n, step, cfg, seq)
        loss = pipe.step(x, y)
        if dist.get_rank() == 0:
            print("update %d: loss %.4f" % (step, loss))
    pipe.state_dict()  # the whole model's weights on rank 0, as model.state_dict() names them
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
