"""Regenerates tests/fixtures/planners/aceso.json: Aceso (microsoft/SuperScaler, branch Aceso,
EuroSys'24) and repipe on Aceso's own small-scale case, each plan priced by both cost models.

Aceso's code runs as its README runs it: its search (search/aceso_search.py) and its cost model
on a given configuration (search/aceso_cost_model.py --initial-point CONFIG), from ACESO_DIR
(its search/ and profiler/ folders), standard library only; nothing of it is kept here but the
numbers it printed (MIT licence). Run:

    python3 tests/aceso_fixtures.py ACESO_DIR build/repipe

The case (Aceso's README, its pre-profiled database profiler/profiled-time-miniset): GPT-1.3B (24
blocks, hidden 2048, 32 heads, sequences of 2048, vocabulary 51200, fp16) on one node of 4 GPUs,
12 000 MB a GPU, 512 sequences an update, micro-batches of 1, 2, 4 or 8.

The mapping from Aceso's profiles to repipe's device (docs/planner.md): the shape is Aceso's
GPT; the device is repipe's v100-32gb with its products and memory passes slowed by one factor,
the ratio of Aceso's block (its 13 operators' forward and backward, micro-batch 1, tensor 1) to
repipe's prediction of the same block; its memory Aceso's limit; the node's link the bandwidth
Aceso's point-to-point profile reaches at its largest size.
"""
import csv
import json
import os
import re
import subprocess
import sys
import tempfile

import planner_runs

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "planners", "aceso.json")
SHAPE = "layers=24,hidden=2048,heads=32,seq=2048,vocab=51200"
GBS, GPUS, MEMORY_MB = 512, 4, 12000
AcesoSpace = ["--vp", "1", "--schedules", "1f1b", "--cp", "1", "--sharding", "none"]


def aceso_args(aceso, tmp, extra):
    return [sys.executable] + extra + [
        "--model-name", "gpt", "--model-size", "1_3B", "--global-batch-size", str(GBS),
        "--micro-batch-size", "1", "2", "4", "8", "--num-nodes", "1", "--num-gpus-per-node",
        str(GPUS), "--memory-limit", str(MEMORY_MB), "--log-path", tmp + "/logs/",
        "--profiled-time-path", os.path.join(aceso, "profiler", "profiled-time-miniset") + "/",
        "--config-save-path", tmp + "/configs/", "--config-suffix", "fixture",
        "--max-num-hops", "7", "--time-budget-total", "200"]


def aceso_search(aceso, tmp):
    for d in ("logs/trends", "configs/top_configs", "configs/csv"):
        os.makedirs(os.path.join(tmp, d), exist_ok=True)
    out = subprocess.run(aceso_args(aceso, tmp, ["aceso_search.py"]), capture_output=True,
                         text=True, cwd=os.path.join(aceso, "search"), check=True).stdout
    row = re.search(r"^(\d+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s+(\d+)\s*$", out, re.M)
    seconds = float(re.search(r"overall search time: ([\d.]+) s", out).group(1))
    stages = int(row.group(1))
    top = os.path.join(tmp, "configs", "top_configs")  # (named by the time: Aceso's own suffix)
    config = os.path.join(top, [f for f in os.listdir(top) if "_%dstages_" % stages in f][0])
    return {"stages": stages, "time_s": float(row.group(2)), "memory_mb": int(row.group(4)),
            "explored": int(row.group(5)), "seconds": seconds}, json.load(open(config))


def aceso_price(aceso, tmp, config):
    """Aceso's cost model on a configuration: its time (ms) and most memory (MB)."""
    path = os.path.join(tmp, "price.json")
    json.dump(config, open(path, "w"), indent=1)
    out = subprocess.run(aceso_args(aceso, tmp, ["aceso_cost_model.py", "--initial-point", path]),
                         capture_output=True, text=True, cwd=os.path.join(aceso, "search"),
                         check=True).stdout
    return (float(re.search(r"overall time = ([\d.]+) ms", out).group(1)),
            float(re.search(r"max allocated memory = ([\d.]+) MB", out).group(1)))


def block_us(aceso):
    """Aceso's block at micro-batch 1, tensor 1: its 13 operators, forward and backward (us)."""
    path = os.path.join(aceso, "profiler", "profiled-time-miniset", "gpt_1_3B_mbs1_tp1_algo0.csv")
    rows = list(csv.reader(open(path)))[1:]
    return sum(float(r[1]) + float(r[2]) for r in rows[1:14])


def link_bandwidth(aceso):
    """Aceso's point-to-point profile inside a node at its largest size, in bytes/s (its
    figures are MB a millisecond: its cost model divides MB by a thousandth of them for us)."""
    path = os.path.join(aceso, "profiler", "profiled-time-miniset", "p2p_intra_node.csv")
    rows = list(csv.reader(open(path)))
    return float(rows[1][-1]) * 2 ** 20 * 1e3


def repipe_cluster(repipe, aceso, tmp):
    mine = planner_runs.block_ms(repipe, SHAPE, "v100-32gb")
    theirs = block_us(aceso) / 1e3
    slow = theirs / mine
    dev = {"name": "aceso-gpu", "peak_flops": 125e12 / slow, "peak_fp32": 15.7e12 / slow,
           "memory_bytes": MEMORY_MB * 2 ** 20, "memory_bandwidth": 900e9 / slow,
           "gemm_efficiency": 0.80, "gemm_half": 64, "memory_efficiency": 0.80,
           "attention_efficiency": 0.50}
    bw = link_bandwidth(aceso)
    return {"name": "aceso-1x4", "device": dev, "per_node": GPUS, "node_bandwidth": bw,
            "network_bandwidth": bw, "latency": 1e-5}, slow, theirs, mine


def as_aceso(plan, template):
    """repipe's plan as an Aceso configuration: its stages cut where repipe cuts (Aceso's ops:
    the embedding's 1, a block's 13, the head's 2), every op of a stage at the stage's tensor
    and data sizes, recomputation as repipe's (full: every op of the stage; selective: the
    attention's core, score to context; none)."""
    L = 24
    counts = plan["layers_per_stage"]
    layers = [L + 2 - sum(c for c in counts if c > 0) if c < 0 else c for c in counts]
    ops_of = [1] + [13] * L + [2]
    core = {3, 4, 5, 6}  # a block's score, softmax, dropout and context ops
    cfg = {k: template[k] for k in ("model_name", "model_size", "num_layers", "seq_length",
                                    "max_position_embeddings", "num_attention_heads",
                                    "hidden_size")}
    t, d = plan["tensor_parallel"], plan["data_parallel"]
    # (Aceso's micro-batch is a stage's, over its data-parallel ranks)
    cfg.update(global_batch_size=GBS, micro_batch_size=plan["micro_batch"] * d,
               num_stages=len(layers), num_gpus=[t * d] * len(layers),
               resharding_stages=[False] * len(layers), num_ops_in_each_stage=[],
               model_parallel_size_of_each_op=[], data_parallel_size_of_each_op=[],
               recompute_ops=[], algo_of_each_op=[], checkpoint_activations=[])
    at = 0
    for n in layers:
        rc = []
        for l in range(at, at + n):
            for k in range(ops_of[l]):
                block = 0 < l <= L
                rc.append(int(block and (plan["recompute"] == "full" or
                                         (plan["recompute"] == "selective" and k in core))))
        cfg["num_ops_in_each_stage"].append(len(rc))
        cfg["model_parallel_size_of_each_op"].append([t] * len(rc))
        cfg["data_parallel_size_of_each_op"].append([d] * len(rc))
        cfg["recompute_ops"].append(rc)
        cfg["algo_of_each_op"].append([0] * len(rc))
        cfg["checkpoint_activations"].append(max(rc) > 0)
        at += n
    return cfg


def repipe_plan(repipe, cluster_file, extra=()):
    args = ["plan", "--cluster", cluster_file, "--devices", str(GPUS), "--global-batch",
            str(GBS), "--transformer", SHAPE] + list(extra)
    plan, seconds = planner_runs.plan(repipe, args)
    return args, plan, seconds


def main():
    aceso, repipe = sys.argv[1], os.path.abspath(sys.argv[2])
    with tempfile.TemporaryDirectory() as tmp:
        theirs, their_cfg = aceso_search(aceso, tmp)
        their_price = aceso_price(aceso, tmp, their_cfg)
        cluster, slow, block_theirs, block_mine = repipe_cluster(repipe, aceso, tmp)
        cluster_file = os.path.join(tmp, "cluster.json")
        json.dump(cluster, open(cluster_file, "w"))
        # repipe's own choice, and its choice among the plans Aceso's form holds: one chunk
        # a rank, 1F1B, no context groups, no sharded optimizer state (Aceso's memory has none)
        args_free, free, _ = repipe_plan(repipe, cluster_file)
        args, plan, seconds = repipe_plan(repipe, cluster_file, AcesoSpace)
        mine_cfg = as_aceso(plan, their_cfg)
        mine_price = aceso_price(aceso, tmp, mine_cfg)
        # and with every block recomputed, which Aceso's memory holds
        args_full, full, _ = repipe_plan(repipe, cluster_file, AcesoSpace + ["--recompute", "full"])
        full_price = aceso_price(aceso, tmp, as_aceso(full, their_cfg))
    keys = ("tensor_parallel", "pipeline_parallel", "data_parallel", "context_parallel",
            "micro_batch", "micro_batches", "virtual_stages", "recompute", "sharding",
            "sequence_parallel", "layers_per_stage", "seconds_per_update", "peak_memory_bytes")
    case = {"name": "gpt 1.3B, 1 x 4, 12000 MB, batch 512", "cluster": cluster,
            "block_ms": {"aceso_profile": block_theirs, "repipe_v100": block_mine},
            "slowdown": slow,
            "aceso": dict(theirs, config={k: their_cfg[k] for k in (
                "num_stages", "micro_batch_size", "num_gpus", "num_ops_in_each_stage",
                "checkpoint_activations")},
                          recomputed_ops=[sum(r) for r in their_cfg["recompute_ops"]],
                          priced_ms=their_price[0], priced_memory_mb=their_price[1]),
            "repipe_free": {"args": args_free, "plan": {k: free[k] for k in keys}},
            "repipe": {"args": args, "seconds_to_plan": seconds,
                       "plan": {k: plan[k] for k in keys},
                       "as_aceso": {k: mine_cfg[k] for k in (
                           "num_stages", "micro_batch_size", "num_gpus", "num_ops_in_each_stage",
                           "checkpoint_activations")},
                       "by_aceso_ms": mine_price[0], "by_aceso_memory_mb": mine_price[1]},
            "repipe_full": {"args": args_full, "plan": {k: full[k] for k in keys},
                            "by_aceso_ms": full_price[0], "by_aceso_memory_mb": full_price[1]}}
    print("Aceso %.2f s (%d stages), repipe's plan by Aceso %.2f s, %.0f MB" % (
        theirs["time_s"], theirs["stages"], mine_price[0] / 1e3, mine_price[1]))
    rev = subprocess.run(["git", "-C", aceso, "rev-parse", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    json.dump({"source": "tests/aceso_fixtures.py",
               "aceso": rev or "fa80ad0 (microsoft/SuperScaler, branch Aceso)",
               "licence": "Aceso: MIT (its code is not here; the numbers it printed are)",
               "python": sys.version.split()[0], "cases": [case]}, open(OUT, "w"), indent=1)
    print("wrote", OUT)


if __name__ == "__main__":
    main()
