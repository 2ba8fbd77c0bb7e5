#!/usr/bin/env python3
"""The engine objective on a GPT-2 1.5B-shaped model in the simulator: 48 blocks
at C 1600 (32 heads of 50, so that tensor groups of 2, 4 and 8 divide them; GPT-2
XL has 25), MLP 6400, 1024 positions, vocabulary 50304, written as a graph, with
a profile of analytic times for a device of FLOPS floating-point operations a
second and BW bytes/s of memory (products 2 m n k / FLOPS, a backward twice its
forward, the element-wise layers their bytes / BW). Writes the model and the
profile into DIR, then runs 'repipe plan' on M1 x M2 workers (M1 a server) with
and without --tensor-split, so that its table sets the plans with tensor groups
beside the best of stages and replicas alone.

Usage: bench/gpt15b_plan.py BUILD_DIR DIR [--flops 1e14] [--memory-bw 2e12]
       [--machines 8 4] [--bandwidth 3e11 2.5e10] [--global-batch 512]
       [--blocks 48] [--fused] [--memory-size 80e9]

--fused writes each block as one transformer_block layer (its layers' times
and parameters summed, its output as its activation), as a profile of whole
modules would: 53 layers for the 48 blocks instead of 484.
"""
import argparse
import os
import subprocess
import sys

ap = argparse.ArgumentParser()
ap.add_argument("build")
ap.add_argument("dir")
ap.add_argument("--flops", type=float, default=1e14)
ap.add_argument("--memory-bw", type=float, default=2e12)
ap.add_argument("--machines", type=int, nargs=2, default=[8, 4])
ap.add_argument("--bandwidth", type=float, nargs=2, default=[3e11, 2.5e10])
ap.add_argument("--global-batch", type=int, default=512)
ap.add_argument("--micro-batch", type=int, default=8)
ap.add_argument("--blocks", type=int, default=48)
ap.add_argument("--memory-size", default="80e9")
ap.add_argument("--fused", action="store_true",
                help="each block one transformer_block layer, its layers' times summed")
a = ap.parse_args()

T, C, H, M, V, B = 1024, 1600, 32, 6400, 50304, a.micro_batch
layers = []  # (spec line, kind, forward ms, output floats, parameters)


def lin(n_in, n_out, bias=True):
    return 2.0 * B * T * n_in * n_out / a.flops * 1e3, n_in * n_out + (n_out if bias else 0)


def elem(floats, passes=3):
    return passes * 4.0 * floats / a.memory_bw * 1e3


spec = ["input %d" % T]
layers.append(("embedding", elem(B * T * C, 2), B * T * C, V * C))
spec.append("embedding %d %d std=0.02" % (V, C))
layers.append(("position_embedding", elem(B * T * C), B * T * C, T * C))
spec.append("x0 = position_embedding")
for b in range(a.blocks):
    x = "x%d" % b
    f, p = lin(C, 3 * C)
    rows = [("layernorm < %s" % x, "layernorm", elem(B * T * C), B * T * C, 2 * C),
            ("linear %d" % (3 * C), "linear", f, B * T * 3 * C, p),
            ("attention heads=%d" % H, "attention",
             4.0 * B * T * T * C / a.flops * 1e3 + elem(B * H * T * T, 2), B * T * C, 0)]
    f, p = lin(C, C)
    rows.append(("o%d = linear %d" % (b, C), "linear", f, B * T * C, p))
    rows.append(("h%d = add < o%d %s" % (b, b, x), "add", elem(B * T * C), B * T * C, 0))
    rows.append(("layernorm", "layernorm", elem(B * T * C), B * T * C, 2 * C))
    f, p = lin(C, M)
    rows.append(("linear %d" % M, "linear", f, B * T * M, p))
    rows.append(("gelu", "gelu", elem(B * T * M), B * T * M, 0))
    f, p = lin(M, C)
    rows.append(("m%d = linear %d" % (b, C), "linear", f, B * T * C, p))
    rows.append(("x%d = add < m%d h%d" % (b + 1, b, b), "add", elem(B * T * C), B * T * C, 0))
    if a.fused:  # one layer: the block's output, its layers' times and parameters
        spec.append("x%d = transformer_block heads=%d < %s" % (b + 1, H, x))
        layers.append(("transformer_block", sum(r[2] for r in rows), B * T * C,
                       sum(r[4] for r in rows)))
        continue
    for line, kind, ms, out, par in rows:
        spec.append(line)
        layers.append((kind, ms, out, par))
spec.append("layernorm")
layers.append(("layernorm", elem(B * T * C), B * T * C, 2 * C))
f, p = lin(C, V, False)
spec.append("linear %d bias=false tie=0" % V)
layers.append(("linear", f, B * T * V, 0))  # its weight is the embedding's
spec.append("softmax_cross_entropy")
layers.append(("softmax_cross_entropy", elem(B * T * V), B * T, 0))

os.makedirs(a.dir, exist_ok=True)
model = os.path.join(a.dir, "gpt15b.model")
with open(model, "w") as fh:
    fh.write("# GPT-2 1.5B-shaped (bench/gpt15b_plan.py)\n" + "\n".join(spec) + "\n")
profile = os.path.join(a.dir, "gpt15b.txt")
with open(profile, "w") as fh:
    fh.write("node0 -- Input0 micro_batch=%d -- forward_compute_time=0.000, "
             "backward_compute_time=0.000, activation_size=%.1f, parameter_size=0.000\n" % (B, 4.0 * B * T))
    for i, (kind, ms, out, par) in enumerate(layers):
        fh.write("node%d -- %s (layer %d) -- forward_compute_time=%.6f, backward_compute_time=%.6f, "
                 "activation_size=%.1f, parameter_size=%.1f\n" % (i + 1, kind, i, ms, 2 * ms, 4.0 * out, 4.0 * par))
    for i in range(len(layers)):
        fh.write("\tnode%d -- node%d\n" % (i, i + 1))
print("%d layers, %.2fe9 parameters" % (len(layers), sum(l[3] for l in layers) / 1e9))
common = [os.path.join(a.build, "repipe"), "plan", "--profile", profile, "--objective", "engine",
          "--machines", str(a.machines[0]), str(a.machines[1]), "--bandwidth",
          str(a.bandwidth[0]), str(a.bandwidth[1]), "--global-batch", str(a.global_batch),
          "--memory-size", a.memory_size]
for extra in ([], ["--tensor-split", model]):
    print("\n$ " + " ".join(common + extra), flush=True)
    subprocess.run(common + extra, check=True, stdout=sys.stdout)
