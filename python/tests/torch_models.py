"""Models the PyTorch tests train: ordinary PyTorch, written as their users write them."""
import copy

import torch
import torch.nn.functional as F
from torch import nn

import repipe.torch_graph as torch_graph


class SelfAttention(nn.Module):
    """nanoGPT's: one Linear for q, k and v, F.scaled_dot_product_attention, causal."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MHA(nn.Module):
    """nn.MultiheadAttention with a causal mask."""

    def __init__(self, d, heads):
        super().__init__()
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)

    def forward(self, x):
        T = x.size(1)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), 1)
        return self.attn(x, x, x, attn_mask=mask, need_weights=False)[0]


class Block(nn.Module):
    def __init__(self, d, heads, mha):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = MHA(d, heads) if mha else SelfAttention(d, heads)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """A nanoGPT-style GPT: positions from torch.arange, the head tied to the embedding,
    logits as (batch x positions, vocabulary) for cross_entropy."""

    def __init__(self, vocab=64, seq=16, d=32, heads=4, layers=4, mha=False, dropout=0.0):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList([Block(d, heads, mha) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x)).view(b * t, -1)


def gpt_batch(n, vocab=64, seq=16, seed=0):
    """n sequences and their next tokens, flattened as GPT's logits are."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, vocab, (n, seq + 1), generator=g)
    return idx[:, :-1].contiguous(), idx[:, 1:].reshape(-1).contiguous()


def resnet18():
    """torchvision's resnet18 for one input channel and 10 classes."""
    import torchvision
    m = torchvision.models.resnet18(num_classes=10)
    m.conv1 = nn.Conv2d(1, 64, 7, 2, 3, bias=False)
    return m


class VGG16(nn.Module):
    """VGG-16 (configuration D) laid out as torchvision's VGG: `features` (13 convolutions,
    each with its ReLU, and 5 max-pools), `avgpool`, a flatten, `classifier` (three linear
    layers), with every width divided by div, for 32 x 32 images and 10 classes. Its own
    class rather than torchvision's, whose import on each of the seed layout's 16 ranks
    took half that test's time on two cores (torchvision's resnet18 is tested beside it)."""

    def __init__(self, div=16):
        super().__init__()
        layers, cin = [], 3
        for v in (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
                  512, 512, 512, "M"):
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(cin, v // div, 3, padding=1), nn.ReLU(True)]
                cin = v // div
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        w = 4096 // div
        self.classifier = nn.Sequential(nn.Linear(512 // div, w), nn.ReLU(True), nn.Dropout(0.0),
                                        nn.Linear(w, w), nn.ReLU(True), nn.Dropout(0.0),
                                        nn.Linear(w, 10))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class Skip(nn.Module):
    """An MLP whose residual branch crosses a cut after `b`: two tensors cross it."""

    def __init__(self, d=16, classes=5):
        super().__init__()
        self.a, self.b = nn.Linear(d, d), nn.Linear(d, d)
        self.c, self.head = nn.Linear(d, d), nn.Linear(d, classes)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        g = self.b(h)
        return self.head(torch.relu(self.c(h + g)))


# Hugging Face transformers' own classes, as from_config builds them: small, without dropout
# (a pipeline's stages draw their masks from other generators than one process does), and
# untouched otherwise: rt.Pipeline and repipe.torch.profile take them as they are.
HF_MODELS = ("gpt2", "llama", "mistral", "qwen2", "bert")


def warm():
    """Loads what torch.export loads on first use (a small module exported as rt.Pipeline
    exports one), for fork_ranks.py to do once before it forks the ranks."""
    from repipe.torch_graph import Graph
    torch.manual_seed(0)
    Graph(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), torch.randn(2, 4))


def warm_hf():
    """warm(), and each Hugging Face model's forward once (transformers loads its attention
    and mask functions on first use)."""
    warm()
    for name in HF_MODELS:
        hf(name)(hf_batch(1)[0])


def hf(name, layers=4, vocab=64, seq=16):
    import transformers as T
    common = dict(vocab_size=vocab, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    if name == "gpt2":
        return T.GPT2LMHeadModel(T.GPT2Config(n_positions=seq, n_embd=32, n_layer=layers,
                                              n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
                                              attn_pdrop=0.0, **common))
    decoders = {"llama": (T.LlamaConfig, T.LlamaForCausalLM),
                "mistral": (T.MistralConfig, T.MistralForCausalLM),
                "qwen2": (T.Qwen2Config, T.Qwen2ForCausalLM)}
    if name in decoders:
        cls, model = decoders[name]
        return model(cls(hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=seq, **common))
    if name == "bert":
        return T.BertForMaskedLM(T.BertConfig(hidden_size=32, intermediate_size=64,
                                              num_hidden_layers=layers, num_attention_heads=4,
                                              max_position_embeddings=seq,
                                              hidden_dropout_prob=0.0,
                                              attention_probs_dropout_prob=0.0, **common))
    raise ValueError("no Hugging Face model " + name)


def hf_batch(n, vocab=64, seq=16, seed=0):
    """n token sequences and a target for every position, (n, seq) each."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, vocab, (n, seq + 1), generator=g)
    return idx[:, :-1].contiguous(), idx[:, 1:].contiguous()


def make(model):
    """The model named, seeded: the same weights on every rank and in every case."""
    torch.manual_seed(1)
    if model == "gpt":
        return GPT()
    if model == "gpt-mha":
        return GPT(mha=True)
    if model == "resnet18":
        return resnet18()
    if model == "vgg16":
        return VGG16()
    if model == "skip":
        return Skip()
    if model.startswith("hf-"):
        return hf(model[3:])
    raise SystemExit("unknown model " + model)


def batch(model, n, k):
    if model.startswith("gpt"):
        return gpt_batch(n, seed=100 + k)
    if model.startswith("hf-"):
        return hf_batch(n, seed=100 + k)
    g = torch.Generator().manual_seed(100 + k)
    if model == "skip":
        return torch.randn(n, 16, generator=g), torch.randint(0, 5, (n,), generator=g)
    size = 64 if model == "resnet18" else 32
    ch = 3 if model == "vgg16" else 1
    return torch.randn(n, ch, size, size, generator=g), torch.randint(0, 10, (n,), generator=g)


# A launch's cases share their models: each (model, dtype) is made once a process (or once
# before the ranks fork: torch_pipeline_run.prepare) and put back to its first weights for each
# case, and torch.export's graph of it, which rt.Pipeline makes on every rank, kept for the cases
# after the first (the same module and micro-batch shape: the same graph over the same
# parameters). The Hugging Face test's 25 cases on 4 ranks spent two thirds of their CPU time
# exporting 10 graphs 100 times.
_MADE, _EXPORTED = {}, {}


def fresh(model, dtype):
    """The model's module in `dtype` at its first weights, with no gradients."""
    if (model, dtype) not in _MADE:
        module = make(model).to(dtype)
        _MADE[model, dtype] = (module, copy.deepcopy(module.state_dict()))
    module, first = _MADE[model, dtype]
    with torch.no_grad():
        module.load_state_dict(first)
    for p in module.parameters():
        p.grad = None
    return module


def share_exports():
    """rt.Pipeline's exports kept, by module (held, so that its id is not another's later),
    example shape and arguments: for torch_pipeline_run.py's cases only."""
    export = torch_graph._export
    if getattr(export, "shared", False):
        return

    def once(module, example, kwargs):
        key = (id(module), tuple((tuple(t.shape), t.dtype) for t in example), repr(kwargs))
        if key not in _EXPORTED:
            _EXPORTED[key] = (module, export(module, example, kwargs))
        return _EXPORTED[key][1]
    once.shared = True
    torch_graph._export = once
