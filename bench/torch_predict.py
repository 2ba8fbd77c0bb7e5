"""repipe's predictions beside PyTorch runs on this machine.

    $PY bench/torch_predict.py [--build build] [--runs 3] [--part steps|pipeline|all]

steps: the machine calibrated (repipe.calibrate, float32, the threads torch uses), then a
GPT (repipe.calibrate.GPT: the transformer `--transformer ...,flash=1,dropout=0` describes)
trained in one process at two sizes with fused AdamW: the median update of `runs` rounds (the
sizes take turns; a round's median of 3 updates after one that warms up) beside `repipe profile
--transformer SPEC --device CALIBRATED --precision fp32`'s nodes summed, with AdamW's pass at
the calibrated bandwidth (28 bytes a parameter read and written).

pipeline: a GPT of 8 blocks profiled by repipe.torch.profile on one thread (its loss, the
cross entropy, timed into the head's node), then trained by
rt.Pipeline on gloo ranks of one thread each (bench/torch_predict_run.py under torchrun) on
1f1b, interleaved 1F1B (2 chunks a rank), zb-h1, a stage replicated on both ranks, and [2, 1]
on 3 ranks, beside `repipe simulate` of the same configuration on the link the ranks measured
(--machines W --bandwidth --latency, --cores the machine's cores).

Prints a table and one JSON line; needs the project's PyTorch environment (scripts/python-env)
and a build (--build: its repipe and librepipe.so).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, HERE)
from torch_common import use_build  # noqa: E402

SIZES = [  # layers, hidden, heads, seq, vocab, micro-batch
    (4, 512, 8, 256, 8192, 4),
    (4, 1024, 16, 512, 8192, 2),
]
PIPE_MODEL = (8, 256, 4, 128, 2048)
PIPE_B, PIPE_GA = 4, 8


def spec(L, H, A, S, V):
    return "layers=%d,hidden=%d,heads=%d,seq=%d,vocab=%d,flash=1,dropout=0" % (L, H, A, S, V)


def node_times(path):
    """[(name, forward ms, backward ms)] of a graph.txt, its Input left out."""
    out = []
    with open(path) as f:
        for ln in f:
            if ln.startswith("node") and "forward_compute_time=" in ln and "Input" not in ln:
                fw = float(ln.split("forward_compute_time=")[1].split(",")[0])
                bw = float(ln.split("backward_compute_time=")[1].split(",")[0])
                out.append((ln.split(" -- ")[1].split(":")[0], fw, bw))
    return out


def part_steps(cli, work, runs):
    from repipe.calibrate import GPT, calibrate
    dev_path = os.path.join(work, "cpu.json")
    dev = calibrate("cpu", torch.float32, out=dev_path)
    models, rows = [], []
    for L, H, A, S, V, b in SIZES:
        torch.manual_seed(0)
        m = GPT(L, H, A, S, V)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
        x = torch.randint(0, V, (b, S))
        y = torch.randint(0, V, (b * S,))
        models.append((m, opt, x, y))
    measured = [[] for _ in SIZES]
    for r in range(runs):  # the sizes take turns
        for i, (m, opt, x, y) in enumerate(models):
            def step():
                torch.nn.functional.cross_entropy(m(x), y).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            step()
            ts = []
            for _ in range(3):
                t0 = time.perf_counter()
                step()
                ts.append(time.perf_counter() - t0)
            measured[i].append(statistics.median(ts))
    for i, (L, H, A, S, V, b) in enumerate(SIZES):
        g = os.path.join(work, "size%d.txt" % i)
        subprocess.run([cli, "profile", "--transformer", spec(L, H, A, S, V), "--device",
                        dev_path, "--precision", "fp32", "--micro-batch", str(b), "--out", g],
                       check=True, capture_output=True)
        compute = sum(fw + bw for _, fw, bw in node_times(g)) / 1e3
        params = sum(p.numel() for p in models[i][0].parameters())
        optim = params * 28 / dev["memory_bandwidth"]
        meas = statistics.median(measured[i])
        rows.append({"model": spec(L, H, A, S, V), "micro_batch": b, "parameters": params,
                     "predicted_s": compute + optim, "measured_s": meas,
                     "rounds_s": measured[i], "ratio": (compute + optim) / meas})
    return {"device": {k: v for k, v in dev.items() if k != "measured"}, "rows": rows,
            "threads": torch.get_num_threads()}


def balanced(times, parts):
    """Counts of consecutive nodes in `parts` stages, each near an equal share of the time."""
    total, counts, acc, k = sum(times), [], 0.0, 0
    for p in range(parts - 1):
        start = k
        target = total * (p + 1) / parts
        while k < len(times) - (parts - 1 - p) and (acc + times[k] / 2 < target or k == start):
            acc += times[k]
            k += 1
        counts.append(k - start)
    counts.append(len(times) - k)
    return counts


def launch(world, cases, work, runs, tag):
    out = os.path.join(work, "run-%s.json" % tag)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(world), os.path.join(HERE, "torch_predict_run.py"), "--out", out,
           "--model", ",".join(map(str, PIPE_MODEL)), "--rounds", str(runs)]
    for c in cases:
        cmd += ["--case", json.dumps(c)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode:
        sys.exit("torch_predict.py: torchrun failed:\n" + p.stderr[-4000:])
    with open(out) as f:
        return json.load(f)


def part_pipeline(cli, work, runs):
    import repipe.torch as rt
    from repipe.calibrate import GPT
    torch.set_num_threads(1)
    L, H, A, S, V = PIPE_MODEL
    torch.manual_seed(0)
    graph = os.path.join(work, "gpt.txt")
    x = torch.randint(0, V, (PIPE_B, S))
    y = torch.randint(0, V, (PIPE_B * S,))
    rt.profile(GPT(L, H, A, S, V), x, out=graph, repeat=5,
               loss_fn=torch.nn.functional.cross_entropy, target=y)
    times = [fw + bw for _, fw, bw in node_times(graph)]
    base = {"micro_batch_size": PIPE_B, "gradient_accumulation_steps": PIPE_GA}
    two, four = balanced(times, 2), balanced(times, 4)
    cases2 = [
        {"name": "1f1b", "plan": dict(base, layers_per_stage=two, schedule="1f1b")},
        {"name": "interleaved-1f1b", "plan": dict(base, layers_per_stage=four,
                                                  schedule="interleaved-1f1b", virtual_stages=2)},
        {"name": "zb-h1", "plan": dict(base, layers_per_stage=two, schedule="zb-h1")},
        {"name": "[2] (a stage replicated)", "runner": "repipe",
         "plan": dict(base, layers_per_stage=[len(times)], stage_replication=[2],
                      gradient_accumulation_steps=PIPE_GA // 2)},
    ]
    cases3 = [{"name": "[2, 1] on 3 ranks", "runner": "repipe",
               "plan": dict(base, layers_per_stage=two, stage_replication=[2, 1])}]
    got = launch(2, cases2, work, runs, "2")
    got3 = launch(3, cases3, work, runs, "3")
    rows = []
    cores = os.cpu_count()
    for c, res in [(c, got) for c in cases2] + [(c, got3) for c in cases3]:
        cfg = os.path.join(work, "case.json")
        with open(cfg, "w") as f:
            json.dump(c["plan"], f)
        sim = os.path.join(work, "sim.json")
        subprocess.run([cli, "simulate", "--profile", graph, "--config", cfg, "--machines",
                        str(res["world"]), "--bandwidth", "%.6g" % got["bandwidth"],
                        "--latency", "%.6g" % got["latency"], "--cores", str(cores),
                        "--json", sim], check=True, capture_output=True)
        with open(sim) as f:
            pred = json.load(f)["seconds_per_update"]
        meas = statistics.median(res["rounds"][c["name"]])
        rows.append({"case": c["name"], "ranks": res["world"], "plan": c["plan"],
                     "predicted_s": pred, "measured_s": meas,
                     "rounds_s": res["rounds"][c["name"]], "ratio": pred / meas})
    return {"model": spec(*PIPE_MODEL), "link": {"latency_s": got["latency"],
                                                 "bandwidth": got["bandwidth"]},
            "cores": cores, "rows": rows}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--part", choices=["steps", "pipeline", "all"], default="all")
    a = ap.parse_args()
    cli = use_build(a.build, "torch_predict.py")
    report = {"torch": torch.__version__}
    with tempfile.TemporaryDirectory() as work:
        if a.part in ("steps", "all"):
            report["steps"] = part_steps(cli, work, a.runs)
            print("one process, %d threads, float32, fused AdamW:" % report["steps"]["threads"])
            for r in report["steps"]["rows"]:
                print("  %-66s b %d: predicted %.3f s, measured %.3f s (%.2f)"
                      % (r["model"], r["micro_batch"], r["predicted_s"], r["measured_s"],
                         r["ratio"]))
        if a.part in ("pipeline", "all"):
            report["pipeline"] = part_pipeline(cli, work, a.runs)
            p = report["pipeline"]
            print("rt.Pipeline on gloo, a thread a rank, %s, micro-batches of %d x %d; link "
                  "%.0f us, %.2g B/s:" % (p["model"], PIPE_B, PIPE_GA,
                                          1e6 * p["link"]["latency_s"], p["link"]["bandwidth"]))
            for r in p["rows"]:
                print("  %-26s %d ranks: predicted %.3f s, measured %.3f s (%.2f)"
                      % (r["case"], r["ranks"], r["predicted_s"], r["measured_s"], r["ratio"]))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
