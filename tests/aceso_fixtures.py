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
network's the bandwidths Aceso's point-to-point profiles reach at their largest size. A second,
calibrated device adds what Aceso's profile says beyond that (the block's line in the
micro-batch, each tensor size's efficiency, the memory as Aceso counts it); and the best plan of
repipe's whole space by Aceso's own model is searched beside them (space_best).
"""
import csv
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time

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
# state (Aceso's memory has none), no sequence parallelism (its Megatron-LM keeps the norms'
# and dropouts' activations whole on each rank of a tensor group)
AcesoSpace = ["--vp", "1", "--schedules", "1f1b", "--cp", "1", "--sharding", "none",
              "--sequence-parallel", "off"]


class Case:
    def __init__(self, aceso, row):
        (self.name, db, self.size, (self.layers, hidden, heads), self.nodes, self.per_node,
         self.gbs, self.memory_mb) = row
        self.db = os.path.join(aceso, "profiler", "profiled-time-" + db)
        self.shape = "layers=%d,hidden=%d,heads=%d,seq=2048,vocab=51200" % (self.layers, hidden,
                                                                           heads)
        self.aceso = aceso


def aceso_args(c, tmp, extra):
    """Aceso's arguments as its search script for the model passes them (a case may name
    another model and its micro-batches; its script's further settings are the search's)."""
    return [sys.executable] + extra + [
        "--model-name", getattr(c, "model", "gpt"), "--model-size", c.size,
        "--global-batch-size", str(c.gbs), "--micro-batch-size"] + [
        str(m) for m in getattr(c, "micro_batches", (1, 2, 4, 8))] + [
        "--num-nodes", str(c.nodes),
        "--num-gpus-per-node", str(c.per_node), "--memory-limit", str(c.memory_mb),
        "--log-path", tmp + "/logs/", "--profiled-time-path", c.db + "/",
        "--config-save-path", tmp + "/configs/", "--config-suffix", "fixture",
        "--max-num-hops", "7", "--time-budget-total", "200"]


def aceso_search(c, tmp):
    """Aceso's search on a case: what it printed of its choice, and the choice. With
    ACESO_SEARCH_CACHE=DIR, kept there by the search's arguments and read back by later runs
    (its search is budgeted by time: a run beside other work may find a slower plan)."""
    for d in ("logs/trends", "configs/top_configs", "configs/csv"):
        os.makedirs(os.path.join(tmp, d), exist_ok=True)
    args = aceso_args(c, tmp, ["aceso_search.py"]) + list(getattr(c, "search_settings", ()))
    cache = os.environ.get("ACESO_SEARCH_CACHE")
    if cache:
        key = hashlib.sha1(" ".join(args).replace(tmp, "TMP").encode()).hexdigest()[:16]
        path = os.path.join(cache, "%s_%s_%s.json" % (getattr(c, "model", "gpt"), c.size, key))
        if os.path.exists(path):
            found, config = json.load(open(path))
            return found, config
    found, config = run_search(c, tmp, args)
    if cache:
        os.makedirs(cache, exist_ok=True)
        json.dump([found, config], open(path, "w"))
    return found, config


def run_search(c, tmp, args):
    out = subprocess.run(args, capture_output=True,
                         text=True, cwd=os.path.join(c.aceso, "search"), check=True).stdout
    row = re.search(r"^(\d+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s+(\d+)\s*$", out, re.M)
    seconds = float(re.search(r"overall search time: ([\d.]+) s", out).group(1))
    stages = int(row.group(1))
    top = os.path.join(tmp, "configs", "top_configs")  # (named by the time: Aceso's own suffix)
    config = os.path.join(top, [f for f in os.listdir(top) if "_%dstages_" % stages in f][0])
    return {"stages": stages, "time_s": float(row.group(2)), "memory_mb": int(row.group(4)),
            "explored": int(row.group(5)), "seconds": seconds}, json.load(open(config))


def aceso_price(c, tmp, config, stages=False):
    """Aceso's cost model on a configuration: its time (ms) and most memory (MB); with stages,
    also each stage's memory as it breaks it down (MB: weights, gradients, optimizer,
    activations, peak, memory_reserved)."""
    path = os.path.join(tmp, "price.json")
    json.dump(config, open(path, "w"), indent=1)
    out = subprocess.run(aceso_args(c, tmp, ["aceso_cost_model.py", "--initial-point", path]),
                         capture_output=True, text=True, cwd=os.path.join(c.aceso, "search"),
                         check=True).stdout
    got = (float(re.search(r"overall time = ([\d.]+) ms", out).group(1)),
           float(re.search(r"max allocated memory = ([\d.]+) MB", out).group(1)))
    if not stages:
        return got
    parts = [dict((k, float(v)) for k, v in re.findall(r"(\w+) \+?= ([\d.]+)", line.split(
        "MB.", 1)[1])) for line in out.splitlines() if re.match(r"\s*\*?\s*\[stage \d+\] memory", line)]
    return got + (parts,)


def block_ms(c, t=1, mbs=1):
    """Aceso's block at micro-batch mbs, tensor t: its 13 operators, forward and backward (at
    t > 1 with the tensor group's all-reduces, which its operators were timed with)."""
    path = os.path.join(c.db, "gpt_%s_mbs%d_tp%d_algo0.csv" % (c.size, mbs, t))
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


def tensor_efficiency(repipe, c, cluster):
    """The device's tensor_efficiency for each group size Aceso profiled: the share e of its
    kernels' rates at which repipe's block at tensor t, its all-reduces as they were, takes
    Aceso's block's time at t over its time at 1 of the block at 1 (which the device's one
    slowdown already matches): e = repipe's kernels' time / (that target - repipe's
    all-reduces), the kernels' time priced on links too fast to count."""
    fast = dict(cluster, node_bandwidth=1e15, network_bandwidth=1e15, latency=0)
    one, got = planner_runs.block_ms(repipe, c.shape, cluster=cluster), {}
    passes = 3 * cluster["device"].get("block_latency", 0) * 1e3  # (ms: no kernel's)
    for t in (2, 4, 8):
        if t > c.per_node or not os.path.exists(
                os.path.join(c.db, "gpt_%s_mbs1_tp%d_algo0.csv" % (c.size, t))):
            continue
        target = one * block_ms(c, t) / block_ms(c)
        kernels = planner_runs.block_ms(repipe, c.shape, cluster=fast, tensor=t) - passes
        links = planner_runs.block_ms(repipe, c.shape, cluster=cluster, tensor=t) - kernels - passes
        got[str(t)] = min(2.0, max(0.01, kernels / (target - links - passes)))
    return got


def calibrate_memory(repipe, c, tmp, cluster, template):
    """The device's memory and activation_scale such that repipe's count holds a plan to
    Aceso's limit as Aceso's count does, from three plans (t 1, p 4, micro-batch 1, recomputing
    nothing, attention's core, every block; their first stage, which holds the most
    micro-batches): the memory scaled by repipe's weights and optimizer state over Aceso's
    (weights, gradients, optimizer and its reserved memory, at least a copy of the weights),
    the activations by the most Aceso counts (activations and the backward's peak) over what
    repipe counts of the three, times that scale: plans of each kind fit both counts alike, or
    repipe's the more tightly."""
    roomy = dict(cluster, device=dict(cluster["device"], memory_bytes=1e15))
    path = os.path.join(tmp, "roomy.json")
    json.dump(roomy, open(path, "w"))
    refs = []
    for p, how in ((p, how) for p in (2, 4) for how in ("none", "selective", "full")):
        plan, _ = planner_runs.plan(repipe, [
            "plan", "--cluster", path, "--devices", str(c.nodes * c.per_node), "--global-batch",
            str(c.gbs), "--transformer", c.shape, "--tp", "1", "--pp", str(p), "--micro-batch",
            "1", "--recompute", how] + AcesoSpace)
        stage = aceso_price(c, tmp, as_aceso(c, plan, template), stages=True)[2][0]
        mine = plan["memory_by_rank"][0]
        their_states = sum(stage[k] for k in ("weights", "gradients", "optimizer",
                                              "memory_reserved")) * 2 ** 20
        refs.append({"pipeline": p, "recompute": how, "aceso_mb": stage,
                     "repipe_mb": {k: mine[k] / 2 ** 20 for k in ("weights_and_optimizer",
                                                                  "activations")},
                     "states": mine["weights_and_optimizer"] / their_states,
                     "activations": (stage["activations"] + stage["peak"]) * 2 ** 20 /
                                    mine["activations"]})
    states = min(r["states"] for r in refs)
    acts = max(r["activations"] for r in refs)
    return {"memory_bytes": c.memory_mb * 2 ** 20 * states,
            "activation_scale": acts * states}, {"plans": "t 1, p 2 and 4, micro-batch 1",
                                                 "references": refs}


def block_line(c):
    """Aceso's block at tensor 1 as a line in the micro-batch (least squares over its profiled
    1, 2, 4 and 8): ms a sequence, and ms a pass of the three (forward, and each half of the
    backward) beyond them."""
    ms = [(m, block_ms(c, 1, m)) for m in (1, 2, 4, 8)]
    mx, my = sum(m for m, _ in ms) / 4, sum(y for _, y in ms) / 4
    slope = sum((m - mx) * (y - my) for m, y in ms) / sum((m - mx) ** 2 for m, _ in ms)
    return slope, max(0.0, my - slope * mx) / 3


def repipe_cluster(repipe, c, line=False):
    """The cluster: repipe's v100-32gb slowed by one factor, Aceso's block at micro-batch 1 over
    repipe's; with line, by the slope of Aceso's block in the micro-batch instead, its
    intercept the device's block_latency."""
    mine = planner_runs.block_ms(repipe, c.shape, "v100-32gb")
    theirs, latency = block_line(c) if line else (block_ms(c), 0.0)
    slow = theirs / mine
    dev = {"name": "aceso-gpu", "peak_flops": 125e12 / slow, "peak_fp32": 15.7e12 / slow,
           "memory_bytes": c.memory_mb * 2 ** 20, "memory_bandwidth": 900e9 / slow,
           "gemm_efficiency": 0.80, "gemm_half": 64, "memory_efficiency": 0.80,
           "attention_efficiency": 0.50}
    if line:
        dev["block_latency"] = latency / 1e3
    return {"name": "aceso-%dx%d" % (c.nodes, c.per_node), "device": dev,
            "per_node": c.per_node, "node_bandwidth": link_bandwidth(c, "intra"),
            "network_bandwidth": link_bandwidth(c, "inter"), "latency": 1e-5}, slow, theirs, mine


def as_aceso(c, plan, template):
    """repipe's plan as an Aceso configuration: its stages cut where repipe cuts (Aceso's ops:
    the embedding's 1, a block's 13, the head's 2), every op of a stage at the stage's tensor
    and data sizes, recomputation as repipe's (full: every op of the stage's blocks; blocks:
    every op of the first recompute_blocks blocks of each stage; selective: the attention's
    core, score to context; none)."""
    L = c.layers
    counts = plan["layers_per_stage"]
    layers = [L + 2 - sum(n for n in counts if n > 0) if n < 0 else n for n in counts]
    ops_of = [1] + [13] * L + [2]
    core = {2, 3, 4, 5}  # a block's score, softmax, dropout and context (after its norm and QKV)
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
    at, how = 0, plan["recompute"]
    for n in layers:
        rc, first = [], 0  # first: the stage's blocks so far
        for l in range(at, at + n):
            block = 0 < l <= L
            whole = block and (how == "full" or
                               (how == "blocks" and first < plan.get("recompute_blocks", 0)))
            first += block
            for k in range(ops_of[l]):
                rc.append(int(whole or (block and how == "selective" and k in core)))
        cfg["num_ops_in_each_stage"].append(len(rc))
        cfg["model_parallel_size_of_each_op"].append([t] * len(rc))
        cfg["data_parallel_size_of_each_op"].append([d] * len(rc))
        cfg["recompute_ops"].append(rc)
        cfg["algo_of_each_op"].append([0] * len(rc))
        cfg["checkpoint_activations"].append(max(rc) > 0)
        at += n
    return cfg


def space_best(c, tmp, template):
    """The fastest plan repipe's space holds by Aceso's own model, among those that fit Aceso's
    memory by Aceso's count: every tensor (1 to 8, within a node), pipeline and data size over
    the case's GPUs, micro-batches of 1 to 8, recomputation none, selective, full or the first n
    blocks of each stage; its stages cut evenly, then a layer at a time moved between
    neighbours while Aceso's model says that helps. No plan repipe can write (nor Megatron-LM
    run: stages of equal width, cut at layers, one recomputation for all) is faster by that
    model than what this finds but by its cuts, which it searches locally."""
    N, L, units = c.nodes * c.per_node, c.layers, c.layers + 2
    best, evaluations = None, 0

    def price(plan):
        nonlocal evaluations
        evaluations += 1
        try:
            ms, mb = aceso_price(c, tmp, as_aceso(c, plan, template))
        except subprocess.CalledProcessError:  # a shape its profiles do not hold
            return (True, float("inf")), (float("inf"), float("inf"))
        return (mb > c.memory_mb, ms), (ms, mb)

    for t in (1, 2, 4, 8):
        for p in range(1, min(N // t, L) + 1):
            if t > c.per_node or N % (t * p):
                continue
            d = N // (t * p)
            for mb in (1, 2, 4, 8):
                if c.gbs % (mb * d):
                    continue
                most = -(-L // p)  # blocks on the fullest stage
                ways = [("none", 0), ("selective", 0), ("full", 0)] + [
                    ("blocks", n) for n in range(1, most)]
                for how, n in ways:
                    q, r = divmod(units, p)
                    plan = {"tensor_parallel": t, "data_parallel": d, "micro_batch": mb,
                            "recompute": how, "recompute_blocks": n,
                            "layers_per_stage": [q + (i < r) for i in range(p)]}
                    key, got = price(plan)
                    moved = True
                    while moved:
                        moved = False
                        for i, step in ((i, s) for i in range(p - 1) for s in (1, -1)):
                            cut = list(plan["layers_per_stage"])
                            cut[i] += step
                            cut[i + 1] -= step
                            if min(cut) < 1:
                                continue
                            other = dict(plan, layers_per_stage=cut)
                            k2, g2 = price(other)
                            if k2 < key:
                                plan, key, got, moved = other, k2, g2, True
                    if not key[0] and (best is None or got[0] < best["by_aceso_ms"]):
                        cfg = as_aceso(c, plan, template)
                        best = {"plan": plan, "by_aceso_ms": got[0], "by_aceso_memory_mb": got[1],
                                "recomputed_ops": [sum(r) for r in cfg["recompute_ops"]],
                                "recomputed": recomputed_names(c, cfg)}
    return dict(best or {}, evaluations=evaluations)


def op_names(c):
    """Aceso's operators of the model, in order, by the names its profile gives them."""
    rows = list(csv.reader(open(os.path.join(c.db, "gpt_%s_mbs1_tp1_algo0.csv" % c.size))))[1:]
    return [rows[0][0]] + [r[0] for r in rows[1:14]] * c.layers + [r[0] for r in rows[14:16]]


def recomputed_names(c, config):
    """The names of the operators a configuration recomputes, stage by stage (each once)."""
    names, at, out = op_names(c), 0, []
    for flags in config["recompute_ops"]:
        out.append(sorted({names[at + i] for i, f in enumerate(flags) if f}))
        at += len(flags)
    return out


def repipe_in_space(repipe, c, cluster_file):
    """repipe's plan among those Aceso's form holds, which also needs a stage's micro-batch over
    its replicas (Aceso's micro_batch_size) to be one Aceso profiled, 1, 2, 4 or 8: repipe
    planned at each tensor size, pipeline size and micro-batch, the fastest by repipe's model
    that Aceso's form holds; the time to plan is all of those runs'."""
    N, best, seconds = c.nodes * c.per_node, None, 0.0
    for t in (1, 2, 4, 8):
        for p in range(1, min(N // t, c.layers) + 1):
            for mb in (1, 2, 4, 8):
                if t > c.per_node or N % (t * p) or mb * N // (t * p) > 8:
                    continue
                try:
                    args, plan, sec = repipe_plan(repipe, c, cluster_file, AcesoSpace + [
                        "--tp", str(t), "--pp", str(p), "--micro-batch", str(mb)])
                except subprocess.CalledProcessError:  # no plan of that shape fits
                    continue
                seconds += sec
                if best is None or plan["seconds_per_update"] < best[1]["seconds_per_update"]:
                    best = (args, plan)
    return best[0], best[1], seconds


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
        t0 = time.time()
        best = space_best(c, tmp, their_cfg)
        best["seconds"] = time.time() - t0
        # the device calibrated to Aceso's profile beyond its one slowdown: each tensor size's
        # efficiency, and the memory as Aceso counts it; repipe's plan on it, in Aceso's space
        lined = repipe_cluster(repipe, c, line=True)[0]
        memory, reference = calibrate_memory(repipe, c, tmp, lined, their_cfg)
        cal = dict(lined, device=dict(lined["device"], name="aceso-gpu-calibrated",
                                      tensor_efficiency=tensor_efficiency(repipe, c, lined),
                                      **memory))
        json.dump(cal, open(cluster_file, "w"))
        args_cal, cal_plan, cal_seconds = repipe_in_space(repipe, c, cluster_file)
        cal_cfg = as_aceso(c, cal_plan, their_cfg)
        cal_price = aceso_price(c, tmp, cal_cfg)
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
                            "by_aceso_ms": full_price[0], "by_aceso_memory_mb": full_price[1]},
            "repipe_space_best": best,
            "repipe_calibrated": {"cluster": cal, "memory_reference": reference,
                                  "args": args_cal, "seconds_to_plan": cal_seconds,
                                  "plan": {k: cal_plan[k] for k in KEYS + ("recompute_blocks",)
                                           if k in cal_plan},
                                  "as_aceso": {k: cal_cfg[k] for k in SHOWN},
                                  "recomputed": recomputed_names(c, cal_cfg),
                                  "by_aceso_ms": cal_price[0],
                                  "by_aceso_memory_mb": cal_price[1]}}


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
