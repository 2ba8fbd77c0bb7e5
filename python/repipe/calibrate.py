"""A device measured from PyTorch, written as the device file `repipe profile --transformer ...
--device FILE` and `repipe plan --cluster` read.

    import repipe.calibrate
    dev = repipe.calibrate.calibrate("cpu", torch.float32, out="cpu.json")

or from the shell (PYTHONPATH=python):

    python -m repipe.calibrate --device cuda --dtype bfloat16 --out h100.json

repipe prices a transformer from a few rates of its device (include/repipe/device.h): matrix
products of smallest dimension d at peak * d / (d + gemm_half), elementwise kernels at the
memory bandwidth, a fused attention kernel at a share of the peak. This measures each the way
the model uses it:
- products: the best time of torch.matmul over square and transformer-shaped (tall) matrices,
  in bfloat16 and in float32 (PyTorch's default: no TF32), and the line 1/rate = (1 + h/d) / P
  through them; P is the peak a product reaches (so gemm_efficiency is 1) and h is gemm_half
  (of `dtype`'s products);
- memory: the best rate of an elementwise add over tensors far larger than the caches (three
  tensors' bytes moved);
- attention: F.scaled_dot_product_attention, causal, forward and backward, as the model counts
  its FLOPs (half the square for the mask, the backward 2.5 forwards), over `dtype`'s P;
- memory_bytes: the device's (CUDA) or the machine's (CPU).
Beside them, a GPT block's forward and backward at one shape is timed and returned (under
"measured", with every point), for a prediction to be set beside it. Only the device's keys go
to the file. A CPU is measured with the threads torch uses (torch.set_num_threads first to
measure a rank of several on one machine).
"""
import argparse
import json
import os
import time

import torch
import torch.nn.functional as F

__all__ = ["calibrate", "time_block", "time_layer", "GPT"]

DEVICE_KEYS = ("name", "peak_flops", "peak_fp32", "memory_bytes", "memory_bandwidth",
               "gemm_efficiency", "gemm_half", "memory_efficiency", "attention_efficiency")


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _best(fn, dev, seconds):
    """The best time of one call of fn, over rounds of at least `seconds` / 4 each."""
    fn()
    _sync(dev)
    t0 = time.perf_counter()
    fn()
    _sync(dev)
    once = max(time.perf_counter() - t0, 1e-7)
    reps = max(1, int(seconds / 4 / once))
    best = float("inf")
    for _ in range(4):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        _sync(dev)
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def _gemm_points(dev, dtype, sizes, tall, seconds):
    """(smallest dimension, FLOP/s) of square products and of tall ones (tall x d times
    d x d, a transformer's tokens times a weight)."""
    pts = []
    shapes = [(n, n, n) for n in sizes] + [(tall, d, d) for d in sizes if d < tall]
    for m, k, n in shapes:
        a = torch.randn(m, k, device=dev, dtype=dtype)
        b = torch.randn(k, n, device=dev, dtype=dtype)
        t = _best(lambda: torch.matmul(a, b), dev, seconds)
        pts.append((min(m, k, n), 2.0 * m * k * n / t))
    return pts


def _fit(points):
    """P and h of rate = P d / (d + h), by least squares of 1/rate = 1/P + (h/P) (1/d)."""
    xs = [1.0 / d for d, _ in points]
    ys = [1.0 / r for _, r in points]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    icpt = my - slope * mx
    if icpt <= 0 or slope <= 0:  # rates that fall with size: the best is the peak, at once
        return max(r for _, r in points), 0.0
    return 1.0 / icpt, slope / icpt


def _bandwidth(dev, n, seconds):
    a = torch.randn(n, device=dev)
    b = torch.randn(n, device=dev)
    c = torch.empty(n, device=dev)
    t = _best(lambda: torch.add(a, b, out=c), dev, seconds)
    return 3.0 * n * 4 / t


def _attention(dev, dtype, batch_heads, seq, head_dim, seconds):
    """FLOP/s of a causal fused attention's forward and backward, as the model counts."""
    q, k, v = (torch.randn(1, batch_heads, seq, head_dim, device=dev, dtype=dtype,
                           requires_grad=True) for _ in range(3))
    g = torch.randn(1, batch_heads, seq, head_dim, device=dev, dtype=dtype)

    def step():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(g)
        q.grad = k.grad = v.grad = None

    t = _best(step, dev, seconds)
    forward = 4.0 * batch_heads * seq * seq * head_dim / 2
    return 3.5 * forward / t


class _Block(torch.nn.Module):
    """A GPT block (LayerNorm, attention with a bias, GELU MLP of 4 h), as the model's
    default transformer is."""

    def __init__(self, h, heads):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = torch.nn.LayerNorm(h), torch.nn.LayerNorm(h)
        self.qkv, self.proj = torch.nn.Linear(h, 3 * h), torch.nn.Linear(h, h)
        self.up, self.down = torch.nn.Linear(h, 4 * h), torch.nn.Linear(4 * h, h)

    def forward(self, x):
        B, S, H = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(H, dim=2)
        q, k, v = (t.view(B, S, self.heads, H // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, S, H))
        return x + self.down(F.gelu(self.up(self.ln_2(x))))


class GPT(torch.nn.Module):
    """The transformer `repipe profile --transformer layers=L,hidden=H,heads=A,seq=S,vocab=V,
    flash=1,dropout=0` describes, in PyTorch: learned positions, these blocks, a final
    LayerNorm and a head tied to the embedding; logits as (batch x positions, vocabulary)."""

    def __init__(self, layers, hidden, heads, seq, vocab):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(vocab, hidden), torch.nn.Embedding(seq, hidden)
        self.h = torch.nn.ModuleList([_Block(hidden, heads) for _ in range(layers)])
        self.ln_f = torch.nn.LayerNorm(hidden)
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        b, t = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x)).view(b * t, -1)


def time_layer(layer, batch, seq, hidden, seconds=1.0):
    """The best seconds of a layer's forward and backward on a (batch, seq, hidden) input of
    its parameters' device and dtype."""
    p = next(layer.parameters())
    x = torch.randn(batch, seq, hidden, device=p.device, dtype=p.dtype, requires_grad=True)
    g = torch.randn(batch, seq, hidden, device=p.device, dtype=p.dtype)

    def step():
        layer(x).backward(g)
        layer.zero_grad(set_to_none=True)
        x.grad = None

    return _best(step, p.device, seconds)


def time_block(dev, dtype, batch, seq, hidden, heads, seconds=1.0):
    """The best seconds of a GPT block's forward and backward on (batch, seq, hidden)."""
    return time_layer(_Block(hidden, heads).to(torch.device(dev), dtype), batch, seq, hidden,
                      seconds)


def _name(dev):
    if dev.type == "cuda":
        raw = torch.cuda.get_device_name(dev)
    else:
        raw = "cpu-%dt" % torch.get_num_threads()
    out = "".join(c if c.isalnum() else "-" for c in raw.lower()).strip("-")
    return out[:31]


def calibrate(device="cpu", dtype=torch.float32, *, out=None, name=None, quick=False):
    """Measures `device` (a torch.device or its name) and returns its device dict (with the
    raw measurements under "measured"); writes the device's keys to `out` where given, as
    JSON. dtype: the products gemm_half and attention_efficiency are measured in. quick:
    small shapes and short rounds (seconds, for tests), not a calibration to plan with."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    big = dev.type == "cuda"
    seconds = 0.02 if quick else (0.4 if big else 0.6)
    sizes = ([32, 64, 128] if quick else
             [128, 256, 512, 1024, 2048, 4096, 8192] if big else [64, 128, 256, 512, 1024, 2048])
    tall = 256 if quick else (16384 if big else 4096)
    other = torch.bfloat16 if dtype == torch.float32 else torch.float32
    points = {str(dt).replace("torch.", ""): _gemm_points(dev, dt, sizes, tall, seconds)
              for dt in (dtype, other)}
    fits = {k: _fit(v) for k, v in points.items()}
    primary = str(dtype).replace("torch.", "")
    p16, _ = fits.get("bfloat16", fits[primary])
    p32, _ = fits["float32"]
    peak, half = fits[primary]
    n = (1 << 16) if quick else ((1 << 28) if big else (1 << 24))
    bandwidth = _bandwidth(dev, n, seconds)
    attn_shape = (4, 128, 32) if quick else ((32, 4096, 128) if big else (16, 512, 64))
    attn = _attention(dev, dtype, *attn_shape, seconds)
    if big:
        memory = torch.cuda.get_device_properties(dev).total_memory
    else:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    block = dict(batch=1, seq=128, hidden=128, heads=4) if quick else \
        dict(batch=4, seq=2048, hidden=4096, heads=32) if big else \
        dict(batch=4, seq=256, hidden=512, heads=8)
    block_s = time_block(dev, dtype, seconds=seconds * 2, **block)
    result = {
        "name": name or _name(dev),
        "peak_flops": p16, "peak_fp32": p32,
        "memory_bytes": float(memory), "memory_bandwidth": bandwidth,
        "gemm_efficiency": 1.0, "gemm_half": half, "memory_efficiency": 1.0,
        "attention_efficiency": min(1.0, attn / peak),
        "measured": {"dtype": primary, "device": str(dev), "threads": torch.get_num_threads(),
                     "gemm": {k: [[d, r] for d, r in v] for k, v in points.items()},
                     "attention_flops": attn, "attention_shape": attn_shape,
                     "block": dict(block, seconds=block_s)},
    }
    if out:
        with open(out + ".tmp", "w") as f:
            json.dump({k: result[k] for k in DEVICE_KEYS}, f, indent=1)
            f.write("\n")
        os.replace(out + ".tmp", out)
    return result


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m repipe.calibrate",
                                 description="measure a device for repipe's transformer model")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16" if torch.cuda.is_available() else "float32",
                    choices=["bfloat16", "float32"])
    ap.add_argument("--out", required=True, help="the device file to write")
    ap.add_argument("--name", help="the device's name in the file [from the device]")
    ap.add_argument("--threads", type=int, help="a CPU's threads [torch's]")
    ap.add_argument("--quick", action="store_true", help="seconds, not a calibration")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    r = calibrate(a.device, getattr(torch, a.dtype), out=a.out, name=a.name, quick=a.quick)
    print("%s: products %.3g FLOP/s in bfloat16, %.3g in float32 (half of it at d = %.0f), "
          "memory %.3g B/s, attention %.0f %% of the %s peak; a GPT block %s: %.4f s; "
          "written to %s" % (r["name"], r["peak_flops"], r["peak_fp32"], r["gemm_half"],
                             r["memory_bandwidth"], 100 * r["attention_efficiency"], a.dtype,
                             r["measured"]["block"], r["measured"]["block"]["seconds"], a.out))


if __name__ == "__main__":
    main()
