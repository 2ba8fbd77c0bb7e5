"""repipe.torch.profile on VGG-16 against torch.profiler and against the shipped profile.

    PYTHONPATH=python $(sh scripts/python-env) bench/torch_profile.py [--batch 64] [--repeat 2] [--threads 2]

1. Profiles a VGG-16 written here (torchvision's layers; no download) at --batch samples with
   repipe.torch.profile, and times the same passes with torch.profiler: the forward op each
   module calls, and the backward functions autograd runs for it. Prints both per layer.
2. Plans both this profile and the VGG-16 profile shipped in tests/fixtures (PipeDream's, from a
   GPU) for 8 x 2 workers at PipeDream's bandwidths, and compares their structure: stages and
   replication per level, and each stage boundary counted in layers. The plan depends on the
   ratio of compute to communication, so the profile is also planned with its times scaled to
   the shipped profile's total (a device as fast as the one it was measured on).
Needs PyTorch 2 (the project's environment, scripts/python-env); takes about 4 minutes at batch 64 on 2 cores.
"""
import argparse
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
import repipe  # noqa: E402

try:
    import torch
    from torch import nn
    import repipe.torch as rtorch
except ImportError:
    sys.exit("torch_profile: needs PyTorch 2: run it with scripts/python-env's python")

SHIPPED = os.path.join(HERE, "..", "tests", "fixtures", "pipedream", "profiles", "vgg16",
                       "graph.txt")
MODULE_OPS = {"aten::conv2d", "aten::relu_", "aten::relu", "aten::max_pool2d",
              "aten::adaptive_avg_pool2d", "aten::flatten", "aten::linear", "aten::dropout"}
MACHINES, BANDWIDTH = [8, 2], [4294967296, 2147483648]


class VGG16(nn.Module):
    """torchvision's VGG-16 (configuration D), written out."""

    def __init__(self, classes=1000):
        super().__init__()
        layers, c = [], 3
        for v in [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
                  512, 512, 512, "M"]:
            if v == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                layers += [nn.Conv2d(c, v, kernel_size=3, padding=1), nn.ReLU(inplace=True)]
                c = v
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(True), nn.Dropout(),
            nn.Linear(4096, 4096), nn.ReLU(True), nn.Dropout(), nn.Linear(4096, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


def read_graph(path):
    """[(name, desc, fw ms, bw ms)] in node order, and the raw lines."""
    nodes = []
    with open(path) as f:
        lines = f.read().splitlines()
    for line in lines:
        if line.startswith("\t"):
            continue
        name, desc, rest = line.split(" -- ")
        kv = dict(x.split("=") for x in rest.split(", "))
        nodes.append((name, desc, float(kv["forward_compute_time"]),
                      float(kv["backward_compute_time"])))
    nodes.sort(key=lambda n: int(n[0][4:]))
    return nodes, lines


def torch_profiler_times(model, x, repeat):
    """Per module in forward order: (forward ms, backward ms), the best of `repeat` passes, from
    torch.profiler's top-level events. The forward op a module calls is one top-level event; its
    backward is the autograd functions from its main one up to the next (the weight's
    AccumulateGrad and the transpose of a Linear belong to it)."""
    from torch.profiler import profile, ProfilerActivity
    best = None
    for _ in range(repeat):
        xi = x.detach().requires_grad_(True)  # as repipe.torch.profile runs it
        with profile(activities=[ProfilerActivity.CPU]) as p:
            out = model(xi)
            out.sum().backward()
        model.zero_grad(set_to_none=True)
        top = sorted((e for e in p.events() if e.cpu_parent is None),
                     key=lambda e: e.time_range.start)
        prefix = "autograd::engine::evaluate_function: "
        fw = []
        for e in top:  # the ops the modules call, up to the loss
            if e.name == "aten::sum":
                break
            if e.name in MODULE_OPS:
                fw.append(e.cpu_time_total / 1e3)
            else:
                print("torch.profiler: %s (%.3f ms) is not a module's; left out"
                      % (e.name, e.cpu_time_total / 1e3))
        groups = []
        for e in top:
            if not e.name.startswith(prefix) or e.name.endswith("SumBackward0"):
                continue
            what = e.name[len(prefix):]
            if what.endswith("AccumulateGrad") or what == "TBackward0":
                groups[-1] += e.cpu_time_total / 1e3
            else:
                groups.append(e.cpu_time_total / 1e3)
        bw = groups[::-1]
        times = list(zip(fw, bw))
        if len(fw) != len(bw):
            sys.exit("torch_profile: %d forward ops but %d backward groups" % (len(fw), len(bw)))
        best = times if best is None else [(min(a[0], b[0]), min(a[1], b[1]))
                                           for a, b in zip(best, times)]
    return best


def is_layer(desc):
    """A module (not the input, and not a function between modules: flatten, Size, View)."""
    return not (desc.startswith("Input") or desc.endswith("(call_function)") or
                desc.startswith("Size(") or desc.startswith("View("))


def structure(path, nodes):
    """The plan's levels (stages and their replication) and each final stage's layer count."""
    plan = repipe.plan(path, machines=MACHINES, bandwidth=BANDWIDTH, activation_compression=1)
    levels = [[s["replication"] for s in lv["stages"]] for lv in plan.json["levels"]]
    stage_of = plan.json["node_stage"]
    counts = {}
    for name, desc, _, _ in nodes:
        if is_layer(desc) and name in stage_of:
            counts[stage_of[name]] = counts.get(stage_of[name], 0) + 1
    return plan, levels, [counts[s] for s in sorted(counts)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3, help="rounds of both profilers [3]")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--keep", metavar="FILE", help="also write the profile to FILE")
    ap.add_argument("--profile", metavar="FILE",
                    help="plan this profile of the VGG-16 here (from --keep), without timing")
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory()
    if args.profile:
        nodes, lines = read_graph(args.profile)
        args.batch = int(nodes[0][1].split("micro_batch=")[1].split()[0])
        compare_plans(nodes, lines, args.batch, tmp.name)
        return
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    model, x = VGG16(), torch.randn(args.batch, 3, 224, 224)
    # Rounds interleave the two, so that the machine's drift falls on both: each round is
    # repipe.torch.profile(repeat=1) (a warm-up pass and a timed one), then a torch.profiler
    # pass; each keeps its best time per layer over the rounds.
    path = os.path.join(tmp.name, "graph.txt")
    best, ref, spent = {}, None, [0.0, 0.0]
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        rtorch.profile(model, x, repeat=1, out=path)
        t1 = time.perf_counter()
        times = torch_profiler_times(model, x, 1)
        t2 = time.perf_counter()
        spent[0] += t1 - t0
        spent[1] += t2 - t1
        nodes, lines = read_graph(path)
        for name, _, fw, bw in nodes:
            old = best.get(name, (fw, bw))
            best[name] = (min(old[0], fw), min(old[1], bw))
        ref = times if ref is None else [(min(a[0], b[0]), min(a[1], b[1]))
                                         for a, b in zip(ref, times)]
    nodes, lines = read_graph(transform(lines, os.path.join(tmp.name, "best.txt"),
                                        lambda n, fw, bw, act: best[n] + (act,)))
    if args.keep:
        with open(args.keep, "w") as f:
            f.write("\n".join(lines) + "\n")
    print("VGG-16, batch %d, %d threads, %d rounds: repipe.torch.profile %.0f s, "
          "torch.profiler %.0f s" % (args.batch, args.threads, args.repeat, spent[0], spent[1]))
    compare_times(nodes, ref)
    compare_plans(nodes, lines, args.batch, tmp.name)


def compare_times(nodes, ref):
    mods = nodes[1:]  # node0 is the input
    if len(mods) != len(ref):
        sys.exit("torch_profile: %d profiled nodes but %d modules in torch.profiler"
                 % (len(mods), len(ref)))
    print("\n%-4s %-44s %11s %11s %6s %11s %11s %6s" % ("node", "layer", "fw repipe", "fw torch",
                                                        "ratio", "bw repipe", "bw torch", "ratio"))
    within, compared, worst = 0, 0, 1.0
    for (name, desc, fw, bw), (tfw, tbw) in zip(mods, ref):
        cells = []
        for ours, theirs in ((fw, tfw), (bw, tbw)):
            if not is_layer(desc):  # a function between modules: no time of its own
                cells.append("%11.3f %11.3f %6s" % (ours, theirs, "-"))
                continue
            r = ours / theirs if theirs > 0 else float("inf")
            compared += 1
            within += 0.5 <= r <= 2.0
            worst = max(worst, r, 1 / r if r > 0 else float("inf"))
            cells.append("%11.3f %11.3f %6.2f" % (ours, theirs, r))
        print("%-4s %-44s %s %s" % (name, desc[:44], cells[0], cells[1]))
    tot = sum(f + b for _, d, f, b in mods if is_layer(d))
    ttot = sum(f + b for (_, d, _, _), (f, b) in zip(mods, ref) if is_layer(d))
    print("total (ms): repipe %.1f, torch.profiler %.1f, ratio %.3f" % (tot, ttot, tot / ttot))
    print("%d of %d times within 2x of torch.profiler's; the farthest is %.2fx"
          % (within, compared, worst))


def compare_plans(nodes, lines, batch, tmp):
    """Plans this profile, the shipped one, and variants that tell what makes them differ."""
    mods = nodes[1:]
    path = os.path.join(tmp, "graph.txt")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    tot = sum(f + b for _, d, f, b in mods if is_layer(d))
    shipped_nodes, shipped_lines = read_graph(SHIPPED)
    shipped_total = sum(f + b for _, d, f, b in shipped_nodes if is_layer(d))
    per_sample = shipped_total * batch / 128 / tot  # the shipped profile is of batch 128
    ours_layers = [n for n in mods if is_layer(n[1]) and not n[1].startswith("AdaptiveAvgPool")]
    shipped_layers = [n for n in shipped_nodes if is_layer(n[1])]
    kinds = [(a[1].split("(")[0], b[1].split("(")[0]) for a, b in zip(ours_layers, shipped_layers)]
    if len(ours_layers) != len(shipped_layers) or any(a != b for a, b in kinds):
        sys.exit("torch_profile: the layers do not pair with the shipped profile's")
    times = {b[0]: (a[2], a[3]) for a, b in zip(ours_layers, shipped_layers)}
    variants = {
        "a": ("shipped VGG-16 profile (batch 128, a GPU)", SHIPPED, shipped_nodes),
        "b": ("this profile (batch %d, this CPU)" % batch, path, nodes),
        "c": ("this profile, times x%.4f: per sample as fast as (a)" % per_sample,
              transform(lines, os.path.join(tmp, "c.txt"),
                        lambda n, fw, bw, act: (fw * per_sample, bw * per_sample, act)), nodes),
        "d": ("(a)'s sizes, this profile's layer times x%.4f" % (shipped_total / tot),
              transform(shipped_lines, os.path.join(tmp, "d.txt"),
                        lambda n, fw, bw, act: (tuple(t * shipped_total / tot for t in times[n])
                                                if n in times else (fw, bw)) + (act,)),
              shipped_nodes),
        "e": ("(a) at batch %d: its times and activations x%g" % (batch, batch / 128),
              transform(shipped_lines, os.path.join(tmp, "e.txt"),
                        lambda n, fw, bw, act: (fw * batch / 128, bw * batch / 128,
                                                act * batch / 128)), shipped_nodes),
    }
    print("\nplans for %s workers at %s bytes/s (replication per stage, innermost level last;"
          " layers per final stage)" % (" x ".join(map(str, MACHINES)), BANDWIDTH))
    results = {}
    for key, (what, p, n) in variants.items():
        plan, levels, counts = structure(p, n)
        results[key] = (levels, counts)
        print("  (%s) %-54s %-24s layers %-22s %.2fx data parallel"
              % (key, what, levels, counts, plan.json["speedup_vs_dp"]))

    def boundaries(counts):  # the layers before each stage boundary
        return [sum(counts[:i + 1]) for i in range(len(counts) - 1)]

    for x, y, why in (("b", "a", "as measured, against the shipped plan"),
                      ("c", "a", "at the shipped profile's speed, against the shipped plan"),
                      ("d", "a", "this profile's layer times alone"),
                      ("c", "e", "at the same speed and batch")):
        (lx, cx), (ly, cy) = results[x], results[y]
        bx, by = boundaries(cx), boundaries(cy)
        same = lx == ly and len(bx) == len(by) and all(abs(i - j) <= 1 for i, j in zip(bx, by))
        print("  (%s) vs (%s), %s: %s" % (x, y, why, "the same structure (boundaries within one "
                                          "layer)" if same else "not the same structure"))


def transform(lines, out, f):
    """lines of a graph.txt with each node's (fw, bw, activation bytes) replaced by f's."""
    with open(out, "w") as fo:
        for line in lines:
            if not line.startswith("\t"):
                name, desc, rest = line.split(" -- ")
                kv = dict(x.split("=") for x in rest.split(", "))
                fw, bw, act = f(name, float(kv["forward_compute_time"]),
                                float(kv["backward_compute_time"]), float(kv["activation_size"]))
                line = "%s -- %s -- forward_compute_time=%.6f, backward_compute_time=%.6f, " \
                       "activation_size=%.1f, parameter_size=%s" % (
                           name, desc, fw, bw, act, kv["parameter_size"])
            fo.write(line + "\n")
    return out


if __name__ == "__main__":
    main()
