"""Regenerates tests/fixtures/planners/aceso.json: Aceso (microsoft/SuperScaler, branch Aceso,
EuroSys'24) and repipe on Aceso's own GPT cases, each plan priced by both cost models.

Aceso's code runs as its README runs it: its search (search/aceso_search.py) and its cost model
on a given configuration (search/aceso_cost_model.py --initial-point CONFIG), from ACESO_DIR
(its search/ and profiler/ folders), standard library only; nothing of it is kept here but the
numbers it printed (MIT licence). Run:

    python3 tests/aceso_fixtures.py ACESO_DIR build/repipe

The cases: its README's small one (GPT-1.3B on one node of 4 GPUs, 12 000 MB a GPU, 512
sequences an update, its pre-profiled database profiler/profiled-time-miniset) and its paper's
GPT settings (search/scripts/search_gpt.sh: 1 x 4, 1 x 8 and 2 x 8 V100-32GB, 28 000 MB, 1024
sequences, profiler/profiled-time-eurosys); micro-batches of 1, 2, 4 or 8, its search's budget of
200 s and 7 hops.

The mapping from Aceso's profiles to repipe's device (docs/planner.md): the shape is Aceso's
GPT; the device is repipe's v100-32gb with its products and memory passes slowed by one factor,
the ratio of Aceso's block (its 13 operators' forward and backward, micro-batch 1, tensor 1) to
repipe's prediction of the same block; its memory Aceso's limit; the node's link and the
network's the bandwidths Aceso's point-to-point profiles reach at their largest size.
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
# name, Aceso's database, model size, (blocks, hidden, heads), nodes, GPUs a node, sequences an
# update, MB a GPU
CASES = [("gpt 1.3B, 1 x 4, 12000 MB, batch 512", "miniset", "1_3B", (24, 2048, 32), 1, 4, 512,
          12000),
         ("gpt 1.3B, 1 x 4, 28000 MB, batch 1024", "eurosys", "1_3B", (24, 2048, 32), 1, 4, 1024,
          28000),
         ("gpt 2.6B, 1 x 8, 28000 MB, batch 1024", "eurosys", "2_6B", (32, 2560, 32), 1, 8, 1024,
          28000),
         ("gpt 6.7B, 2 x 8, 28000 MB, batch 1024", "eurosys", "6_7B", (32, 4096, 32), 2, 8, 1024,
          28000)]
# the plans Aceso's form holds: one chunk a rank, 1F1B, no context groups, no sharded optimizer
# state (Aceso's memory has none)
AcesoSpace = ["--vp", "1", "--schedules", "1f1b", "--cp", "1", "--sharding", "none"]


class Case:
    def __init__(self, aceso, row):
        (self.name, db, self.size, (self.layers, hidden, heads), self.nodes, self.per_node,
         self.gbs, self.memory_mb) = row
        self.db = os.path.join(aceso, "profiler", "profiled-time-" + db)
        self.shape = "layers=%d,hidden=%d,heads=%d,seq=2048,vocab=51200" % (self.layers, hidden,
                                                                           heads)
        self.aceso = aceso


def aceso_args(c, tmp, extra):
    return [sys.executable] + extra + [
        "--model-name", "gpt", "--model-size", c.size, "--global-batch-size", str(c.gbs),
        "--micro-batch-size", "1", "2", "4", "8", "--num-nodes", str(c.nodes),
        "--num-gpus-per-node", str(c.per_node), "--memory-limit", str(c.memory_mb),
        "--log-path", tmp + "/logs/", "--profiled-time-path", c.db + "/",
        "--config-save-path", tmp + "/configs/", "--config-suffix", "fixture",
        "--max-num-hops", "7", "--time-budget-total", "200"]


def aceso_search(c, tmp):
    for d in ("logs/trends", "configs/top_configs", "configs/csv"):
        os.makedirs(os.path.join(tmp, d), exist_ok=True)
    out = subprocess.run(aceso_args(c, tmp, ["aceso_search.py"]), capture_output=True,
                         text=True, cwd=os.path.join(c.aceso, "search"), check=True).stdout
    row = re.search(r"^(\d+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s+(\d+)\s*$", out, re.M)
    seconds = float(re.search(r"overall search time: ([\d.]+) s", out).group(1))
    stages = int(row.group(1))
    top = os.path.join(tmp, "configs", "top_configs")  # (named by the time: Aceso's own suffix)
    config = os.path.join(top, [f for f in os.listdir(top) if "_%dstages_" % stages in f][0])
    return {"stages": stages, "time_s": float(row.group(2)), "memory_mb": int(row.group(4)),
            "explored": int(row.group(5)), "seconds": seconds}, json.load(open(config))


def aceso_price(c, tmp, config):
    """Aceso's cost model on a configuration: its time (ms) and most memory (MB)."""
    path = os.path.join(tmp, "price.json")
    json.dump(config, open(path, "w"), indent=1)
    out = subprocess.run(aceso_args(c, tmp, ["aceso_cost_model.py", "--initial-point", path]),
                         capture_output=True, text=True, cwd=os.path.join(c.aceso, "search"),
                         check=True).stdout
    return (float(re.search(r"overall time = ([\d.]+) ms", out).group(1)),
            float(re.search(r"max allocated memory = ([\d.]+) MB", out).group(1)))


def block_ms(c):
    """Aceso's block at micro-batch 1, tensor 1: its 13 operators, forward and backward."""
    path = os.path.join(c.db, "gpt_%s_mbs1_tp1_algo0.csv" % c.size)
    rows = list(csv.reader(open(path)))[1:]
    return sum(float(r[1]) + float(r[2]) for r in rows[1:14]) / 1e3


def link_bandwidth(c, where):
    """Aceso's point-to-point profile at its largest size, in bytes/s (its figures are MB a
    millisecond: its cost model divides MB by a thousandth of them for us); the network's is
    the node's where Aceso has none (as its cost model takes it)."""
    path = os.path.join(c.db, "p2p_%s_node.csv" % where)
    if not os.path.exists(path):
        path = os.path.join(c.db, "p2p_intra_node.csv")
    rows = list(csv.reader(open(path)))
    return float(rows[1][-1]) * 2 ** 20 * 1e3


def repipe_cluster(repipe, c):
    mine = planner_runs.block_ms(repipe, c.shape, "v100-32gb")
    theirs = block_ms(c)
    slow = theirs / mine
    dev = {"name": "aceso-gpu", "peak_flops": 125e12 / slow, "peak_fp32": 15.7e12 / slow,
           "memory_bytes": c.memory_mb * 2 ** 20, "memory_bandwidth": 900e9 / slow,
           "gemm_efficiency": 0.80, "gemm_half": 64, "memory_efficiency": 0.80,
           "attention_efficiency": 0.50}
    return {"name": "aceso-%dx%d" % (c.nodes, c.per_node), "device": dev,
            "per_node": c.per_node, "node_bandwidth": link_bandwidth(c, "intra"),
            "network_bandwidth": link_bandwidth(c, "inter"), "latency": 1e-5}, slow, theirs, mine


def as_aceso(c, plan, template):
    """repipe's plan as an Aceso configuration: its stages cut where repipe cuts (Aceso's ops:
    the embedding's 1, a block's 13, the head's 2), every op of a stage at the stage's tensor
    and data sizes, recomputation as repipe's (full: every op of the stage's blocks; selective:
    the attention's core, score to context; none)."""
    L = c.layers
    counts = plan["layers_per_stage"]
    layers = [L + 2 - sum(n for n in counts if n > 0) if n < 0 else n for n in counts]
    ops_of = [1] + [13] * L + [2]
    core = {3, 4, 5, 6}  # a block's score, softmax, dropout and context ops
    cfg = {k: template[k] for k in ("model_name", "model_size", "num_layers", "seq_length",
                                    "max_position_embeddings", "num_attention_heads",
                                    "hidden_size")}
    t, d = plan["tensor_parallel"], plan["data_parallel"]
    # (Aceso's micro-batch is a stage's, over its data-parallel ranks)
    cfg.update(global_batch_size=c.gbs, micro_batch_size=plan["micro_batch"] * d,
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


def repipe_plan(repipe, c, cluster_file, extra=()):
    args = ["plan", "--cluster", cluster_file, "--devices", str(c.nodes * c.per_node),
            "--global-batch", str(c.gbs), "--transformer", c.shape] + list(extra)
    plan, seconds = planner_runs.plan(repipe, args)
    return args, plan, seconds


KEYS = ("tensor_parallel", "pipeline_parallel", "data_parallel", "context_parallel",
        "micro_batch", "micro_batches", "virtual_stages", "recompute", "sharding",
        "sequence_parallel", "layers_per_stage", "seconds_per_update", "peak_memory_bytes")
SHOWN = ("num_stages", "micro_batch_size", "num_gpus", "num_ops_in_each_stage",
         "checkpoint_activations")


def one_case(aceso, repipe, row):
    c = Case(aceso, row)
    with tempfile.TemporaryDirectory() as tmp:
        theirs, their_cfg = aceso_search(c, tmp)
        their_price = aceso_price(c, tmp, their_cfg)
        cluster, slow, block_theirs, block_mine = repipe_cluster(repipe, c)
        cluster_file = os.path.join(tmp, "cluster.json")
        json.dump(cluster, open(cluster_file, "w"))
        # repipe's own choice, its choice among the plans Aceso's form holds, and that with
        # every block recomputed
        args_free, free, _ = repipe_plan(repipe, c, cluster_file)
        args, plan, seconds = repipe_plan(repipe, c, cluster_file, AcesoSpace)
        mine_cfg = as_aceso(c, plan, their_cfg)
        mine_price = aceso_price(c, tmp, mine_cfg)
        args_full, full, _ = repipe_plan(repipe, c, cluster_file,
                                         AcesoSpace + ["--recompute", "full"])
        full_price = aceso_price(c, tmp, as_aceso(c, full, their_cfg))
    print("%s: Aceso %.2f s (%d stages), repipe's plan by Aceso %.2f s, %.0f MB" % (
        c.name, theirs["time_s"], theirs["stages"], mine_price[0] / 1e3, mine_price[1]))
    return {"name": c.name, "layers": c.layers, "memory_mb": c.memory_mb, "cluster": cluster,
            "block_ms": {"aceso_profile": block_theirs, "repipe_v100": block_mine},
            "slowdown": slow,
            "aceso": dict(theirs, config={k: their_cfg[k] for k in SHOWN},
                          recomputed_ops=[sum(r) for r in their_cfg["recompute_ops"]],
                          tensor_sizes=sorted({t for s in their_cfg[
                              "model_parallel_size_of_each_op"] for t in s}),
                          priced_ms=their_price[0], priced_memory_mb=their_price[1]),
            "repipe_free": {"args": args_free, "plan": {k: free[k] for k in KEYS}},
            "repipe": {"args": args, "seconds_to_plan": seconds,
                       "plan": {k: plan[k] for k in KEYS},
                       "as_aceso": {k: mine_cfg[k] for k in SHOWN},
                       "by_aceso_ms": mine_price[0], "by_aceso_memory_mb": mine_price[1]},
            "repipe_full": {"args": args_full, "plan": {k: full[k] for k in KEYS},
                            "by_aceso_ms": full_price[0], "by_aceso_memory_mb": full_price[1]}}


def main():
    aceso, repipe = sys.argv[1], os.path.abspath(sys.argv[2])
    cases = [one_case(aceso, repipe, row) for row in CASES]
    rev = subprocess.run(["git", "-C", aceso, "rev-parse", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    json.dump({"source": "tests/aceso_fixtures.py",
               "aceso": rev or "fa80ad0 (microsoft/SuperScaler, branch Aceso)",
               "licence": "Aceso: MIT (its code is not here; the numbers it printed are)",
               "python": sys.version.split()[0], "cases": cases}, open(OUT, "w"), indent=1)
    print("wrote", OUT)


if __name__ == "__main__":
    main()
