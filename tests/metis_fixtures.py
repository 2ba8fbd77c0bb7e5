"""Regenerates tests/fixtures/planners/metis.json: Metis (SamsungLabs/Metis, ATC'24) and repipe
on Metis's own shipped case, each plan priced by both cost models.

Metis's code runs as its scripts run it (its profile loader, cluster, plan generators and cost
estimators, imported from METIS_DIR), in a scratch environment with numpy; nothing of it is
kept here but the numbers it printed (Metis is CC BY-NC 4.0). Run:

    python tests/metis_fixtures.py METIS_DIR build/repipe

The case: Metis's A100 profiles (profile_data_samples: its GPT of 8 blocks, hidden 4096,
sequences of 1024, at tensor 1, 2, 4 x micro-batch 1, 2, 4) on nodes of 4 A100 80 GB, every link
at 50 GB/s (Metis's cluster file reads one `intra_bandwidth` for both levels: its
get_inter_bandwidth returns it, and its homogeneous script asserts it lies in [10, 50]).

The mapping from Metis's profiles to repipe's device (docs/planner.md): the shape is Metis's
GPT; the device is repipe's a100-80gb with its products and memory passes slowed by one factor,
the ratio of Metis's block (forward and backward, tensor 1, micro-batch 1) to repipe's
prediction of the same block ('repipe profile --transformer'); memory 80 GiB (Metis's 80 x
1024 MB); both links Metis's 50 x 2^20 x 1000 bytes/s (its GB/s are 2^20 bytes a millisecond).
"""
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import time

import planner_runs

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "planners", "metis.json")
SHAPE = "layers=8,hidden=4096,heads=32,seq=1024,vocab=51200"
BANDWIDTH = 50  # Metis's GB/s: 2^20 bytes a millisecond
# name, nodes, GPUs a node, sequences an update
CASES = [("shipped", 4, 4, 128), ("8 GPUs", 2, 4, 128), ("batch 512", 4, 4, 512)]


def metis_env(metis, tmp, nodes, per_node):
    sys.path.insert(0, metis)
    with open(os.path.join(tmp, "hostfile"), "w") as f:
        for i in range(nodes):
            f.write("10.0.0.%d slots=%d\n" % (i, per_node))
    with open(os.path.join(tmp, "clusterfile.json"), "w") as f:
        json.dump({"10.0.0.%d" % i: {"instance_type": "A100", "memory": 80,
                                     "intra_bandwidth": BANDWIDTH, "inter_bandwidth": BANDWIDTH}
                   for i in range(nodes)}, f)


def metis_search(metis, tmp, gbs):
    """Metis's heterogeneous search (cost_het_cluster.py's loop, printing its progress as it
    does) and its homogeneous one (cost_homo_cluster.py's), each timed from the profiles'
    loading; their best plans."""
    sys.argv = ["metis", "--max_profiled_tp_degree", "4", "--max_profiled_batch_size", "4"]
    from data_loader import ProfileDataLoader
    from gpu_cluster import GPUCluster
    from model.activation_parameter import GPTActivationAndParam
    from model.cost_estimator import HeteroCostEstimator, HomoCostEstimator
    from model.device_group import StagePerformance
    from model.load_balancer import LayerLoadBalancer
    from search_space.plan import (InterStagePlanGenerator, IntraStagePlanGenerator,
                                   UniformPlanGenerator)
    from utils import ModelConfig
    out = {}
    for kind in ("het", "homo"):
        t0 = time.time()
        cluster = GPUCluster(hostfile_path=os.path.join(tmp, "hostfile"),
                             clusterfile_path=os.path.join(tmp, "clusterfile.json"))
        profile, types = ProfileDataLoader(os.path.join(metis, "profile_data_samples")) \
            .load_profile_data_all()
        config = ModelConfig(model_name="GPT", num_layers=10, sequence_length=1024,
                             vocab_size=51200, hidden_size=4096, attention_head_size=32)
        volume = GPTActivationAndParam(config, profile["model"]["parameters"])
        costs = []
        if kind == "het":
            est = HeteroCostEstimator(profile, config, volume, cluster)
            balancer = LayerLoadBalancer(cluster, profile, config, gbs)
            for inter in InterStagePlanGenerator(device_types=set(cluster.get_device_types()),
                                                 num_devices=cluster.get_total_num_devices(),
                                                 gbs=gbs, num_layers=10, variance=1,
                                                 max_permute_len=4):
                perf = StagePerformance(config, profile, cluster, inter)
                ranks = perf.get_device_placement()
                gen = IntraStagePlanGenerator(inter, perf, balancer, 4, 4)
                while gen.has_next:
                    intra = gen.next()
                    try:
                        with open(os.devnull, "w") as null:
                            keep, sys.stdout = sys.stdout, null
                            try:
                                cost = est.get_cost(inter, intra.strategies,
                                                    intra.layer_partition, ranks)
                            finally:
                                sys.stdout = keep
                        costs.append((cost, {"device_groups": list(inter.device_groups),
                                             "strategies": [list(s) for s in intra.strategies],
                                             "batches": inter.batches,
                                             "layer_partition": list(intra.layer_partition)}))
                    except KeyError:
                        pass
        else:
            est = HomoCostEstimator(profile, config, volume, cluster)
            for plan in UniformPlanGenerator(num_devices=cluster.get_total_num_devices(),
                                             max_tp=4, max_gbs=gbs):
                if plan.gbs != gbs:
                    continue
                try:
                    cost, _, oom = est.get_cost(plan, types[0])
                    costs.append((cost, {"dp": plan.dp, "pp": plan.pp, "tp": plan.tp,
                                         "mbs": plan.mbs, "oom": oom}))
                except KeyError:
                    pass
        seconds = time.time() - t0
        costs.sort(key=lambda c: c[0])
        out[kind] = {"plans": len(costs), "seconds": seconds, "best_ms": costs[0][0],
                     "best": costs[0][1]}
        if kind == "homo":
            fit = [c for c in costs if not c[1]["oom"]]
            out[kind].update(best_fitting_ms=fit[0][0], best_fitting=fit[0][1])
    out["profile"], out["estimators"] = profile, (HeteroCostEstimator, HomoCostEstimator)
    out["classes"] = (GPUCluster, ModelConfig, GPTActivationAndParam, StagePerformance,
                      ProfileDataLoader)
    return out


def stage_memory(profile, plan):
    """A stage's GPU's memory (MB) by Metis's own per-layer profile: its layers' sums at the
    stage's tensor size and micro-batch (what its homogeneous estimator checks; its
    heterogeneous one sums the memories of the stage's GPUs instead)."""
    worst = 0
    gbs_per = plan["gbs"] // plan["batches"]
    for s, (dp, tp) in enumerate(plan["strategies"]):
        lo, hi = plan["layer_partition"][s], plan["layer_partition"][s + 1]
        mem = profile["DeviceType.A100"]["tp%d_bs%d" % (tp, gbs_per // dp)]["memory"]
        worst = max(worst, sum(mem[lo:hi]))
    return worst


def repipe_device(repipe, profile, tmp, nodes, per_node):
    """repipe's cluster file for the case: a100-80gb slowed to Metis's measured block."""
    mine = planner_runs.block_ms(repipe, SHAPE, "a100-80gb")
    theirs = profile["DeviceType.A100"]["tp1_bs1"]["time"]["layer-computes"][1]
    slow = theirs / mine
    dev = {"name": "metis-a100", "peak_flops": 312e12 / slow, "peak_fp32": 19.5e12 / slow,
           "memory_bytes": 80 * 2 ** 30, "memory_bandwidth": 2039e9 / slow,
           "gemm_efficiency": 0.75, "gemm_half": 64, "memory_efficiency": 0.80,
           "attention_efficiency": 0.70}
    bw = BANDWIDTH * 2 ** 20 * 1e3
    cluster = {"name": "metis-%dx%d" % (nodes, per_node), "device": dev, "per_node": per_node,
               "node_bandwidth": bw, "network_bandwidth": bw, "latency": 0}
    return cluster, slow, theirs, mine


def repipe_plan(repipe, cluster_file, devices, gbs, extra=()):
    args = ["plan", "--cluster", cluster_file, "--devices", str(devices), "--global-batch",
            str(gbs), "--transformer", SHAPE] + list(extra)
    plan, seconds = planner_runs.plan(repipe, args)
    return args, plan, seconds


def as_metis(plan):
    """repipe's plan in Metis's form: stages of t d GPUs each, (d, t) a stage, the
    micro-batches, the layers (embedding, blocks, head: Metis's 10) cut where repipe cuts."""
    counts = plan["layers_per_stage"]
    counts = [10 - sum(c for c in counts if c > 0) if c < 0 else c for c in counts]
    cuts = [0]
    for n in counts:
        cuts.append(cuts[-1] + n)
    p, d, t = plan["pipeline_parallel"], plan["data_parallel"], plan["tensor_parallel"]
    return {"device_groups": [d * t] * p, "strategies": [[d, t]] * p,
            "batches": plan["micro_batches"], "layer_partition": cuts,
            "gbs": plan["global_batch"]}


def metis_price(m, plan, tmp, gbs):
    """Metis's heterogeneous estimator's time for a plan in its form (ms)."""
    from search_space.plan import InterStagePlan
    from utils import DeviceType
    GPUCluster, ModelConfig, Volume, StagePerformance, _ = m["classes"]
    cluster = GPUCluster(hostfile_path=os.path.join(tmp, "hostfile"),
                         clusterfile_path=os.path.join(tmp, "clusterfile.json"))
    config = ModelConfig(model_name="GPT", num_layers=10, sequence_length=1024, vocab_size=51200,
                         hidden_size=4096, attention_head_size=32)
    volume = Volume(config, m["profile"]["model"]["parameters"])
    inter = InterStagePlan(ns_idx=0, node_sequence=[DeviceType.A100], dg_idx=0,
                           device_groups=plan["device_groups"],
                           num_stage=len(plan["device_groups"]), batches=plan["batches"], gbs=gbs)
    est = m["estimators"][0](m["profile"], config, volume, cluster)
    ranks = StagePerformance(config, m["profile"], cluster, inter).get_device_placement()
    with open(os.devnull, "w") as null:
        keep, sys.stdout = sys.stdout, null
        try:
            return est.get_cost(inter, [tuple(s) for s in plan["strategies"]],
                                plan["layer_partition"], ranks)
        finally:
            sys.stdout = keep


def main():
    metis, repipe = sys.argv[1], sys.argv[2]
    head = subprocess.run(["git", "-C", metis, "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip() or "4b24046 (SamsungLabs/Metis main)"
    cases = []
    for name, nodes, per_node, gbs in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            metis_env(metis, tmp, nodes, per_node)
            m = metis_search(metis, tmp, gbs)
            for _ in range(2):  # the least of 3 searches' times
                again = metis_search(metis, tmp, gbs)
                for kind in ("het", "homo"):
                    m[kind]["seconds"] = min(m[kind]["seconds"], again[kind]["seconds"])
            cluster, slow, theirs, mine = repipe_device(repipe, m["profile"], tmp, nodes,
                                                        per_node)
            cluster_file = os.path.join(tmp, "cluster.json")
            json.dump(cluster, open(cluster_file, "w"))
            devices = nodes * per_node
            args, plan, seconds = repipe_plan(repipe, cluster_file, devices, gbs)
            mine_m = as_metis(plan)
            theirs_m = dict(m["het"]["best"], gbs=gbs)
            # Metis's choice as repipe prices it: its shape fixed (uniform stages only)
            d, t = theirs_m["strategies"][0]
            p = len(theirs_m["device_groups"])
            fixed = ["--tp", str(t), "--pp", str(p), "--micro-batch",
                     str(gbs // theirs_m["batches"] // d), "--vp", "1", "--recompute", "none"]
            _, their_plan, _ = repipe_plan(repipe, cluster_file, devices, gbs, fixed)
            case = {
                "name": name, "nodes": nodes, "per_node": per_node, "global_batch": gbs,
                "cluster": cluster, "block_ms": {"metis_profile": theirs, "repipe_a100": mine},
                "slowdown": slow,
                "metis": {"het": {k: m["het"][k] for k in ("plans", "seconds", "best_ms", "best")},
                          "homo": {k: m["homo"][k] for k in ("plans", "seconds", "best_ms", "best",
                                                             "best_fitting_ms", "best_fitting")},
                          "best_memory_mb": stage_memory(m["profile"], theirs_m),
                          "best_by_repipe_s": their_plan["seconds_per_update"],
                          "best_by_repipe_memory_bytes": their_plan["peak_memory_bytes"]},
                "repipe": {"args": args, "seconds_to_plan": seconds,
                           "plan": {k: plan[k] for k in (
                               "tensor_parallel", "pipeline_parallel", "data_parallel",
                               "context_parallel", "micro_batch", "micro_batches",
                               "virtual_stages", "recompute", "sharding", "layers_per_stage",
                               "seconds_per_update", "peak_memory_bytes")},
                           "as_metis": mine_m,
                           "by_metis_ms": metis_price(m, mine_m, tmp, gbs),
                           "memory_by_metis_profile_mb": stage_memory(m["profile"], mine_m)},
            }
            print(name, "Metis %.1f ms (%s), repipe's plan by Metis %.1f ms" % (
                m["het"]["best_ms"], m["het"]["best"], case["repipe"]["by_metis_ms"]))
            cases.append(case)
            for mod in [k for k in sys.modules if k.split(".")[0] in (
                    "data_loader", "gpu_cluster", "model", "search_space", "utils", "arguments")]:
                del sys.modules[mod]
            sys.path.remove(metis)
    json.dump({"source": "tests/metis_fixtures.py", "metis": head,
               "licence": "Metis: CC BY-NC 4.0 (its code is not here; the numbers it printed "
                          "are)",
               "versions": {"numpy": importlib.metadata.version("numpy"),
                            "python": sys.version.split()[0]},
               "cases": cases}, open(OUT, "w"), indent=1)
    print("wrote", OUT)


if __name__ == "__main__":
    main()
