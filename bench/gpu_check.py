"""The GPU check: repipe's device model and its PyTorch side on one GPU, in a few minutes.

    $PY bench/gpu_check.py [--build build] [--out gpu-report.json]     # on a machine with a GPU
    $PY bench/gpu_check.py --cpu [--out report.json]                    # its parts, here (tests)

1. repipe.calibrate measures the device (bfloat16; float32 beside it) and writes its file.
2. A LLaMA block (RMSNorm, grouped-query attention with rotary embeddings, SwiGLU) in bfloat16,
   forward and backward, at two sizes (LLaMA 3 8B's and 70B's blocks, a sequence of 4096),
   beside `repipe profile --transformer` of the same block on the preset that matches the GPU
   (h100-80gb, a100-80gb, ...) and on the calibrated file.
3. repipe.torch.profile of a GPT on the GPU (CUDA events), its nodes' sum beside the whole
   model's forward and backward.
4. rt.Pipeline on NCCL, one rank (a GPU holds one): 5 updates of that GPT, their losses beside
   the same updates in one process.
Writes a JSON report (--out) and prints a summary. --cpu runs each part on the CPU at small
sizes (gloo for part 4), as `make test` does, to keep the script working where no GPU is.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, HERE)
from torch_common import use_build  # noqa: E402


class LlamaBlock(nn.Module):
    def __init__(self, h, heads, kv, ffn, seq):
        super().__init__()
        self.heads, self.kv, self.d = heads, kv, h // heads
        self.n1, self.n2 = nn.RMSNorm(h), nn.RMSNorm(h)
        self.q = nn.Linear(h, h, bias=False)
        self.k = nn.Linear(h, kv * self.d, bias=False)
        self.v = nn.Linear(h, kv * self.d, bias=False)
        self.o = nn.Linear(h, h, bias=False)
        self.gate = nn.Linear(h, ffn, bias=False)
        self.up = nn.Linear(h, ffn, bias=False)
        self.down = nn.Linear(ffn, h, bias=False)
        inv = 1.0 / (500000.0 ** (torch.arange(0, self.d, 2).float() / self.d))
        ang = torch.outer(torch.arange(seq).float(), inv)
        self.register_buffer("cos", torch.cat([ang.cos(), ang.cos()], -1), persistent=False)
        self.register_buffer("sin", torch.cat([ang.sin(), ang.sin()], -1), persistent=False)

    def rope(self, x):
        a, b = x.chunk(2, dim=-1)
        return x * self.cos + torch.cat([-b, a], -1) * self.sin

    def forward(self, x):
        B, S, H = x.shape
        h = self.n1(x)
        q = self.q(h).view(B, S, self.heads, self.d).transpose(1, 2)
        k = self.k(h).view(B, S, self.kv, self.d).transpose(1, 2)
        v = self.v(h).view(B, S, self.kv, self.d).transpose(1, 2)
        y = F.scaled_dot_product_attention(self.rope(q), self.rope(k), v, is_causal=True,
                                           enable_gqa=True)
        x = x + self.o(y.transpose(1, 2).reshape(B, S, H))
        h = self.n2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def preset_for(name):
    name = name.lower()
    for key, preset in (("h200", "h200-141gb"), ("h100", "h100-80gb"), ("a100", "a100-80gb"),
                        ("b200", "b200"), ("v100", "v100-32gb")):
        if key in name:
            return preset
    return None


def predicted_block(cli, spec, device, precision, batch, work):
    out = os.path.join(work, "block.txt")
    subprocess.run([cli, "profile", "--transformer", spec, "--device", device, "--precision",
                    precision, "--micro-batch", str(batch), "--out", out], check=True,
                   capture_output=True)
    with open(out) as f:
        for ln in f:
            if "layers.0:" in ln:
                fw = float(ln.split("forward_compute_time=")[1].split(",")[0])
                bw = float(ln.split("backward_compute_time=")[1].split(",")[0])
                return (fw + bw) / 1e3
    raise SystemExit("gpu_check.py: no block in " + out)


def part_blocks(cli, dev, dtype, cal_path, device_name, work, cpu):
    from repipe.calibrate import time_layer
    sizes = ([("tiny", 128, 4, 2, 256, 256, 1)] if cpu else
             [("llama3-8b", 4096, 32, 8, 14336, 4096, 1),
              ("llama3-70b", 8192, 64, 8, 28672, 4096, 1)])
    precision = "bf16" if dtype == torch.bfloat16 else "fp32"
    preset = preset_for(device_name)
    rows = []
    for name, h, heads, kv, ffn, seq, b in sizes:
        torch.manual_seed(0)
        blk = LlamaBlock(h, heads, kv, ffn, seq).to(dev, dtype)
        measured = time_layer(blk, b, seq, h, 0.05 if cpu else 1.0)
        spec = ("layers=1,hidden=%d,heads=%d,kv_heads=%d,ffn=%d,seq=%d,vocab=32000,mlp=swiglu,"
                "norm=rmsnorm,position=rope,bias=none,tied=0,flash=1,dropout=0"
                % (h, heads, kv, ffn, seq))
        row = {"block": name, "spec": spec, "micro_batch": b, "measured_s": measured,
               "calibrated_s": predicted_block(cli, spec, cal_path, precision, b, work)}
        if preset:
            row["preset"] = preset
            row["preset_s"] = predicted_block(cli, spec, preset, precision, b, work)
        rows.append(row)
        del blk
    return rows


def part_profile(dev, dtype, cpu, work):
    import repipe.torch as rt
    from repipe.calibrate import GPT
    L, H, A, S, V, b = (2, 64, 2, 32, 128, 2) if cpu else (12, 768, 12, 1024, 50304, 8)
    torch.manual_seed(0)
    m = GPT(L, H, A, S, V).to(dev)
    x = torch.randint(0, V, (b, S), device=dev)
    path = os.path.join(work, "gpt.txt")
    t0 = time.perf_counter()
    rt.profile(m, x, out=path, repeat=3)
    took = time.perf_counter() - t0
    total = 0.0
    with open(path) as f:
        for ln in f:
            if "forward_compute_time=" in ln and "Input" not in ln:
                total += float(ln.split("forward_compute_time=")[1].split(",")[0])
                total += float(ln.split("backward_compute_time=")[1].split(",")[0])
    from repipe.calibrate import _best

    def whole():
        m(x).float().sum().backward()
        m.zero_grad(set_to_none=True)

    return {"model": [L, H, A, S, V], "micro_batch": b, "nodes_s": total / 1e3,
            "whole_s": _best(whole, dev, 0.05 if cpu else 0.5), "profile_took_s": took,
            "clock": type(rt._clock_for(m, x)).__name__}


PIPE_RUN = r'''
import json, os, sys, torch, torch.distributed as dist, copy
sys.path.insert(0, os.path.join(sys.argv[1], "python"))
import repipe.torch as rt
from repipe.calibrate import GPT
cpu = sys.argv[3] == "cpu"
dist.init_process_group("gloo" if cpu else "nccl")
dev = torch.device("cpu" if cpu else "cuda", 0)
if not cpu:
    torch.cuda.set_device(dev)
L, H, A, S, V = (2, 64, 2, 32, 128) if cpu else (12, 768, 12, 1024, 50304)
torch.manual_seed(0)
model = GPT(L, H, A, S, V).to(dev)
ref = copy.deepcopy(model)
plan = {"micro_batch_size": 2, "gradient_accumulation_steps": 4, "layers_per_stage": [L + 4],
        "schedule": "1f1b"}
pipe = rt.Pipeline(model, plan, loss_fn=torch.nn.functional.cross_entropy, device=dev,
                   optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1))
opt = torch.optim.SGD(ref.parameters(), lr=0.1)
g = torch.Generator().manual_seed(1)
ours, theirs = [], []
for k in range(5):
    idx = torch.randint(0, V, (8, S + 1), generator=g)
    x, y = idx[:, :-1].contiguous(), idx[:, 1:].reshape(-1).contiguous()
    ours.append(pipe.step(x, y))
    total = 0.0
    for j in range(4):
        xs, ys = x[2 * j:2 * j + 2].to(dev), y[2 * j * S:(2 * j + 2) * S].to(dev)
        loss = torch.nn.functional.cross_entropy(ref(xs), ys) / 4
        loss.backward()
        total += loss.item()
    opt.step()
    opt.zero_grad()
    theirs.append(total)
with open(sys.argv[2], "w") as f:
    json.dump({"losses": ours, "ref_losses": theirs}, f)
dist.destroy_process_group()
'''


def part_pipeline(cpu, work):
    script = os.path.join(work, "pipe_run.py")
    with open(script, "w") as f:
        f.write(PIPE_RUN)
    out = os.path.join(work, "pipe.json")
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "1", script, ROOT, out, "cpu" if cpu else "cuda"],
                       capture_output=True, text=True, timeout=300)
    if p.returncode:
        return {"error": p.stderr[-3000:]}
    with open(out) as f:
        r = json.load(f)
    r["largest_relative_difference"] = max(abs(a - b) / abs(b)
                                           for a, b in zip(r["losses"], r["ref_losses"]))
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--out", default="gpu-report.json")
    ap.add_argument("--cpu", action="store_true", help="every part on the CPU, small (tests)")
    a = ap.parse_args()
    cli = use_build(a.build, "gpu_check.py")
    if not a.cpu and not torch.cuda.is_available():
        sys.exit("gpu_check.py: no CUDA device here (torch %s); --cpu runs the parts on the CPU"
                 % torch.__version__)
    from repipe.calibrate import calibrate
    dev = torch.device("cpu") if a.cpu else torch.device("cuda", 0)
    dtype = torch.float32 if a.cpu else torch.bfloat16
    report = {"torch": torch.__version__, "device": str(dev),
              "device_name": "cpu" if a.cpu else torch.cuda.get_device_name(dev)}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        cal_path = os.path.join(work, "device.json")
        cal = calibrate(dev, dtype, out=cal_path, quick=a.cpu)
        report["calibrated"] = {k: v for k, v in cal.items() if k != "measured"}
        report["calibration"] = cal["measured"]
        report["blocks"] = part_blocks(cli, dev, dtype, cal_path, report["device_name"], work,
                                       a.cpu)
        report["profile"] = part_profile(dev, dtype, a.cpu, work)
        report["pipeline"] = part_pipeline(a.cpu, work)
    report["seconds"] = time.perf_counter() - start
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    c = report["calibrated"]
    print("%s (%s): products %.3g FLOP/s bf16, %.3g fp32, gemm_half %.0f; memory %.3g B/s; "
          "attention %.0f %%" % (report["device_name"], report["device"], c["peak_flops"],
                                 c["peak_fp32"], c["gemm_half"], c["memory_bandwidth"],
                                 100 * c["attention_efficiency"]))
    for r in report["blocks"]:
        print("  block %-10s measured %.4f s; predicted %.4f s calibrated%s"
              % (r["block"], r["measured_s"], r["calibrated_s"],
                 ", %.4f s %s" % (r["preset_s"], r["preset"]) if "preset" in r else ""))
    p = report["profile"]
    print("  profile (%s): nodes %.4f s, whole %.4f s" % (p["clock"], p["nodes_s"], p["whole_s"]))
    q = report["pipeline"]
    if "error" in q:
        print("  rt.Pipeline: failed:\n" + q["error"])
    else:
        print("  rt.Pipeline: 5 updates, losses within %.2g of one process"
              % q["largest_relative_difference"])
    print("  %.0f s; report in %s" % (report["seconds"], a.out))
    # one rank runs the updates of one process: the same losses, but for the order of sums
    return 1 if "error" in q or q["largest_relative_difference"] > 1e-5 else 0


if __name__ == "__main__":
    sys.exit(main())
