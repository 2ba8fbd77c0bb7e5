"""Regenerates tests/fixtures/planners/aceso_resnet.json and the profiles it plans from
(tests/fixtures/planners/aceso_resnet/): Aceso (microsoft/SuperScaler, branch Aceso, fa80ad0;
EuroSys'24; MIT) and repipe on Aceso's Wide-ResNet cases, each plan priced by both cost models.

Aceso's code runs as its search/scripts/search_resnet.sh runs it (search/aceso_search.py, budget
200 s, 7 hops, fine-tuning after each trial, micro-batches of 16, 32, 48 and 64), and its cost
model on a configuration (search/aceso_cost_model.py --initial-point CONFIG), from ACESO_DIR (its
search/ and profiler/ folders), standard library only. Kept of it: the numbers it printed, and
its per-operator profiles as repipe profiles (data, MIT). Run:

    python3 tests/aceso_resnet_fixtures.py ACESO_DIR build/repipe

The cases: the settings the script lists from Aceso's paper, Wide-ResNet of 2B parameters on 1 x 4
V100-32GB, 4B on 1 x 8, 6.8B on 2 x 8 and 13B on 4 x 8; 1536 images an update, 28 000 MB a GPU,
profiler/profiled-time-eurosys.

The mapping (docs/planner.md): repipe's profile is Aceso's operators in order, one node each, at
tensor 1: forward and backward times, weights, and as activation_size what Aceso's memory count
keeps of the operator (its activations; none for those it counts as sharing another's space,
bn1, each block's bn3 and the later blocks' downsample); one profile per micro-batch Aceso
profiled (16, 32, 48 and 64 images a GPU). The links: Aceso's point-to-point bandwidth at its
largest size, within a node and between. The optimizer: Adam (Aceso counts two states a
weight). repipe plans with the engine objective in Aceso's form: whole pipelines replicated
(`--straight`: a stage's GPUs are its data-parallel ranks), the optimizer state whole
(`--sharding none`), 1F1B, at each micro-batch and pipeline size Aceso's form holds (`--micro-batch
B --pp P`: a stage's micro-batch over its replicas and each GPU's one Aceso profiled, so at most
4 replicas), the fastest by repipe's model kept. Two memories: Aceso's limit, and the largest
share of it (in steps of 2 %, down to 30 %) at which the plan repipe makes fits Aceso's count
(fitted). Beside them, the
two counts compared on reference plans (2, 4 and 8 stages cut evenly where Aceso's form holds
them, micro-batches of 16, recomputing nothing or all), Aceso's own plan priced by repipe's
model where repipe can run it, and the best plan of repipe's space in Aceso's form by Aceso's own
model (space_best, a local search over the cuts).
"""
import csv
import json
import os
import subprocess
import sys
import tempfile

import aceso_fixtures
import planner_runs

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "planners", "aceso_resnet.json")
PROFILES = os.path.join(HERE, "fixtures", "planners", "aceso_resnet")
# name, Aceso's model size, nodes, GPUs a node
CASES = [("wide-resnet 2B, 1 x 4", "2B", 1, 4), ("wide-resnet 4B, 1 x 8", "4B", 1, 8),
         ("wide-resnet 6.8B, 2 x 8", "6_8B", 2, 8), ("wide-resnet 13B, 4 x 8", "13B", 4, 8)]
GBS, MEMORY_MB, MICRO = 1536, 28000, (16, 32, 48, 64)
ADAM = {"optimizer": {"type": "adam", "lr": 0.001}}


class Case:
    """A case in the form aceso_fixtures' helpers read."""

    def __init__(self, aceso, row):
        self.name, self.size, self.nodes, self.per_node = row
        self.model, self.micro_batches = "resnet", MICRO
        self.search_settings = ["--finetune-after-trial", "1", "--initial-point", "balance"]
        self.gbs, self.memory_mb = GBS, MEMORY_MB
        self.db = os.path.join(aceso, "profiler", "profiled-time-eurosys")
        self.aceso = aceso


def kept_mb(row):
    """What Aceso's memory count keeps of an operator (its consider_shared_space: these share
    the space of the operator before them)."""
    op = row[0]
    if op == "bn1" or "-bn3" in op or ("-downsample" in op and "0-0" not in op):
        return 0.0
    return float(row[6])


def write_profile(c, mbs):
    """Aceso's operators at tensor 1, micro-batch mbs, as a repipe profile; its path."""
    rows = list(csv.reader(open(os.path.join(
        c.db, "resnet_%s_mbs%d_tp1_algo0.csv" % (c.size, mbs)))))[1:]
    mb = 2 ** 20  # (Aceso's MB)
    path = os.path.join(PROFILES, "%s_mbs%d.txt" % (c.size, mbs))
    with open(path, "w") as f:
        f.write("node0 -- Input0 micro_batch=%d -- forward_compute_time=0, "
                "backward_compute_time=0, activation_size=%d, parameter_size=0\n" %
                (mbs, round(float(rows[0][3]) * mb)))
        for i, r in enumerate(rows, 1):
            f.write("node%d -- %s -- forward_compute_time=%.6f, backward_compute_time=%.6f, "
                    "activation_size=%d, parameter_size=%d\n" %
                    (i, r[0], float(r[1]) / 1e3, float(r[2]) / 1e3, round(kept_mb(r) * mb),
                     round(float(r[5]) * mb)))
        for i in range(len(rows)):
            f.write("\tnode%d -- node%d\n" % (i, i + 1))
    return path


def operators(path):
    """The operators of a profile this script wrote: an edge each, into it."""
    return open(path).read().count("\t")


def machines(c):
    """repipe's --machines and --bandwidth for the case (innermost level first)."""
    if c.nodes == 1:
        return ["--machines", str(c.per_node), "--bandwidth",
                repr(aceso_fixtures.link_bandwidth(c, "intra"))]
    return ["--machines", str(c.per_node), str(c.nodes), "--bandwidth",
            repr(aceso_fixtures.link_bandwidth(c, "intra")),
            repr(aceso_fixtures.link_bandwidth(c, "inter"))]


def shapes(N):
    """The micro-batches and pipeline sizes of Aceso's form on N GPUs: a stage's micro-batch
    over its replicas (B R) one Aceso profiled, as is each GPU's (B); pipelines of at most 8
    stages."""
    return [(mbs, p) for mbs in MICRO for p in (1, 2, 4, 8)
            if N % p == 0 and N // p * mbs <= MICRO[-1] and N // p * mbs in MICRO]


def plan_args(profiles, where, base, memory_bytes, mbs, pp):
    """repipe plan's arguments for a case: its profiles (micro-batch -> path), its machines
    (machines(c)), the base configuration's path, the micro-batch and pipeline size."""
    args = ["plan", "--objective", "engine"]
    for m in MICRO:
        args += ["--profile", profiles[m]]
    return args + where + [
        "--global-batch", str(GBS), "--memory-size", "%d" % memory_bytes, "--base-config", base,
        "--schedules", "1f1b", "--straight", "--sharding", "none", "--micro-batch", str(mbs),
        "--pp", str(pp)]


def repipe_best(repipe, N, where, profiles, base, memory_bytes):
    """The fastest of repipe's plans at each shape of Aceso's form on N GPUs (where: their
    --machines and --bandwidth), by repipe's model: the plan's engine entry, its micro-batch,
    pipeline size and memory, and the time to plan them all (s)."""
    best, total = None, 0.0
    for mbs, pp in shapes(N):
        args = plan_args(profiles, where, base, memory_bytes, mbs, pp)
        try:
            plan, seconds = planner_runs.plan(repipe, args)
        except subprocess.CalledProcessError:
            continue  # nothing fits at this micro-batch
        total += seconds
        entry = plan["engine"]["best"]
        if best is None or entry["seconds_per_update"] < best["seconds_per_update"]:
            best = dict(entry, micro_batch=mbs, pipeline=pp, memory_bytes=memory_bytes)
    if best:
        best["seconds_to_plan"] = total
    return best


def as_aceso(c, cfg, template):
    """repipe's configuration as Aceso's: its stages (an operator a layer of repipe's), each of
    the replicas' GPUs (Aceso's micro-batch is a stage's, over its data-parallel ranks), every
    operator at tensor 1; recomputation as repipe's (every operator of the stage but the stem's
    first convolution, which Aceso never recomputes)."""
    layers, R = cfg["layers_per_stage"], cfg["replication_factor"]
    rc = cfg.get("recompute_checkpoint_every_layer", False)
    out = {k: template[k] for k in ("model_name", "model_size", "num_layers", "in_channels",
                                    "width_factor")}
    out.update(global_batch_size=GBS, micro_batch_size=cfg["micro_batch_size"] * R,
               num_stages=len(layers), num_gpus=[R] * len(layers),
               checkpoint_activations=[rc] * len(layers), resharding_stages=[False] * len(layers),
               num_ops_in_each_stage=list(layers),
               model_parallel_size_of_each_op=[[1] * n for n in layers],
               data_parallel_size_of_each_op=[[R] * n for n in layers],
               recompute_ops=[[int(rc and not (s == 0 and k == 0)) for k in range(n)]
                              for s, n in enumerate(layers)],
               algo_of_each_op=[[0] * n for n in layers])
    return out


def as_repipe(config):
    """Aceso's configuration as repipe's, where repipe runs it: every stage as wide, every
    operator at tensor 1 and that width, recomputing nothing or every operator (but the
    stem's); None elsewhere."""
    R = config["num_gpus"][0]
    flat = lambda k: [x for s in config[k] for x in s]
    rc = flat("recompute_ops")
    if (any(g != R for g in config["num_gpus"]) or any(t != 1 for t in flat(
            "model_parallel_size_of_each_op")) or any(d != R for d in flat(
            "data_parallel_size_of_each_op")) or (any(rc) and sum(rc) < len(rc) - 1)):
        return None
    return dict(ADAM, micro_batch_size=config["micro_batch_size"] // R, replication_factor=R,
                gradient_accumulation_steps=GBS // config["micro_batch_size"],
                layers_per_stage=config["num_ops_in_each_stage"], schedule="1f1b",
                recompute_checkpoint_every_layer=bool(any(rc)))


def simulate(repipe, c, profiles, cfg, tmp):
    """repipe's model of a configuration: seconds an update, and its busiest stage's bytes."""
    path = os.path.join(tmp, "simulate.json")
    json.dump(cfg, open(path, "w"))
    out = subprocess.run([repipe, "simulate", "--profile", profiles[cfg["micro_batch_size"]],
                          "--config", path] + machines(c) + ["--json", "-"],
                         capture_output=True, text=True, check=True).stdout
    got = json.loads(out)
    return got["seconds_per_update"], max(got["stage_memory_bytes"])


def calibrate(repipe, c, profiles, tmp, template):
    """The least, over the reference plans, of repipe's count of the busiest stage over
    Aceso's; and the references."""
    refs, N = [], c.nodes * c.per_node
    for p, rc in ((p, rc) for p in (2, 4, 8) for rc in (False, True)):
        if (16, p) not in shapes(N):
            continue
        R, n = N // p, operators(profiles[16])
        layers = [n // p + (s < n % p) for s in range(p)]
        cfg = dict(ADAM, micro_batch_size=16, replication_factor=R,
                   gradient_accumulation_steps=GBS // (16 * R), layers_per_stage=layers,
                   schedule="1f1b", recompute_checkpoint_every_layer=rc)
        _, mine = simulate(repipe, c, profiles, cfg, tmp)
        _, theirs = aceso_fixtures.aceso_price(c, tmp, as_aceso(c, cfg, template))
        refs.append({"stages": p, "replicas": R, "recompute": rc, "repipe_mb": mine / 2 ** 20,
                     "aceso_mb": theirs, "ratio": mine / 2 ** 20 / theirs})
    return min(r["ratio"] for r in refs), refs


def priced(c, best, template, tmp):
    cfg = best["config"]
    ms, mem = aceso_fixtures.aceso_price(c, tmp, as_aceso(c, cfg, template))
    keys = ("micro_batch_size", "replication_factor", "gradient_accumulation_steps",
            "layers_per_stage", "recompute_checkpoint_every_layer")
    return {"plan": {k: cfg.get(k) for k in keys}, "micro_batch": best["micro_batch"],
            "pipeline": best["pipeline"],
            "memory_bytes": best["memory_bytes"],
            "seconds_per_update": best["seconds_per_update"],
            "worker_mb": best["worker_bytes"] / 2 ** 20,
            "seconds_to_plan": best["seconds_to_plan"], "by_aceso_ms": ms,
            "by_aceso_memory_mb": mem}


def one_case(aceso, repipe, row):
    c = Case(aceso, row)
    os.makedirs(PROFILES, exist_ok=True)
    profiles = {m: write_profile(c, m) for m in MICRO}
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "adam.json")
        json.dump(dict(ADAM, micro_batch_size=16), open(base, "w"))
        found, config = aceso_fixtures.aceso_search(c, tmp)
        case = {"name": c.name, "size": c.size, "nodes": c.nodes, "per_node": c.per_node,
                "global_batch": GBS, "memory_mb": MEMORY_MB,
                "aceso": dict(found, config={k: config[k] for k in (
                    "micro_batch_size", "num_stages", "num_gpus", "num_ops_in_each_stage")},
                    recomputed_ops=sum(map(sum, config["recompute_ops"])),
                    tensor_parallel=sorted({t for s in config["model_parallel_size_of_each_op"]
                                            for t in s}))}
        theirs = as_repipe(config)
        if theirs:  # Aceso's plan by repipe's model
            s, b = simulate(repipe, c, profiles, theirs, tmp)
            case["aceso"]["by_repipe"] = {"seconds_per_update": s, "worker_mb": b / 2 ** 20}
        ratio, refs = calibrate(repipe, c, profiles, tmp, config)
        case["calibration"] = {"ratio": ratio, "references": refs}
        limit = MEMORY_MB * 2 ** 20
        case["machines"] = machines(c)
        best = repipe_best(repipe, c.nodes * c.per_node, case["machines"], profiles, base,
                           limit)
        case["repipe"] = priced(c, best, config, tmp) if best else None
        case["repipe_fitted"], case["shares_tried"] = fitted(repipe, c, profiles, base, config,
                                                             tmp)
        case["repipe_space_best"] = space_best(c, operators(profiles[16]), config, tmp)
    return case


def fitted(repipe, c, profiles, base, config, tmp):
    """repipe's plan at the largest share of the limit, from all of it down to 30 % in steps
    of 2 %, at which the plan it makes fits Aceso's count; and every share tried."""
    limit, tried = MEMORY_MB * 2 ** 20, []
    for step in range(36):
        share = 1 - 0.02 * step
        plan = repipe_best(repipe, c.nodes * c.per_node, machines(c), profiles, base,
                           limit * share)
        got = priced(c, plan, config, tmp) if plan else None
        tried.append([round(share, 2), got and got["by_aceso_memory_mb"]])
        if got and got["by_aceso_memory_mb"] <= MEMORY_MB:
            return dict(got, share=share), tried
    return None, tried


def space_best(c, n, template, tmp):
    """The fastest plan of repipe's space in Aceso's form by Aceso's own model, among those
    that fit Aceso's memory by Aceso's count: each micro-batch and pipeline size of shapes(),
    recomputing nothing or all, its n operators cut evenly and then a boundary moved 1, 2 or 8
    operators at a time while Aceso's model says that helps (the least memory first where it
    does not fit, then the least time); None where no cut it reaches fits, with the least
    memory it reached. A local search: faster plans of the space may exist."""
    N, seen = c.nodes * c.per_node, {}

    def price(mbs, p, rc, layers):
        key = (mbs, p, rc, tuple(layers))
        if key not in seen:
            R = N // p
            cfg = dict(ADAM, micro_batch_size=mbs, replication_factor=R,
                       gradient_accumulation_steps=GBS // (mbs * R), layers_per_stage=layers,
                       schedule="1f1b", recompute_checkpoint_every_layer=rc)
            seen[key] = aceso_fixtures.aceso_price(c, tmp, as_aceso(c, cfg, template))
        ms, mem = seen[key]
        return (0, ms) if mem <= MEMORY_MB else (1, mem)

    best = None
    for mbs, p in shapes(N):
        for rc in (False, True):
            layers = [n // p + (s < n % p) for s in range(p)]
            now = price(mbs, p, rc, layers)
            for _ in range(40):
                moves = []
                for b in range(p - 1):
                    for d in (-8, -2, -1, 1, 2, 8):
                        cut = list(layers)
                        cut[b], cut[b + 1] = cut[b] + d, cut[b + 1] - d
                        if min(cut) >= 1:
                            moves.append((price(mbs, p, rc, cut), cut))
                if not moves or min(moves)[0] >= now:
                    break
                now, layers = min(moves)
            if best is None or now < best[0]:
                best = (now, {"micro_batch": mbs, "pipeline": p, "replicas": N // p,
                              "recompute": rc, "layers_per_stage": layers})
    (over, _), plan = best
    ms, mem = seen[(plan["micro_batch"], plan["pipeline"], plan["recompute"],
                    tuple(plan["layers_per_stage"]))]
    return dict(plan, fits=not over, by_aceso_ms=ms, by_aceso_memory_mb=mem,
                evaluations=len(seen))


def least_memory(repipe, N, where, profiles, base, hi):
    """The least memory a GPU (to 1 %, below hi bytes) at which repipe finds a plan of Aceso's
    form on N GPUs, by bisection; None where none fits hi."""
    def any_fits(memory):
        return any(subprocess.run([repipe] + plan_args(profiles, where, base, memory, mbs, pp),
                                  capture_output=True).returncode == 0 for mbs, pp in shapes(N))
    if not any_fits(hi):
        return None
    lo = 0.0
    while hi - lo > 0.01 * hi:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if any_fits(mid) else (mid, hi)
    return hi


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: aceso_resnet_fixtures.py ACESO_DIR REPIPE")
    aceso, repipe = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    cases = []
    for row in CASES:
        case = one_case(aceso, repipe, row)
        a, r, k, b = (case["aceso"], case["repipe"], case["repipe_fitted"],
                      case["repipe_space_best"])
        print("%s: Aceso %.2f s (%d MB, %.0f s to search); repipe %s; fitted %s; the best of "
              "repipe's space %.2f s (%d MB)" % (
                  case["name"], a["time_s"], a["memory_mb"], a["seconds"],
                  "%.2f s by Aceso (%d MB)" % (r["by_aceso_ms"] / 1e3, r["by_aceso_memory_mb"])
                  if r else "none fits", "%.2f s by Aceso (%d MB)" % (
                      k["by_aceso_ms"] / 1e3, k["by_aceso_memory_mb"]) if k else "none fits",
                  b["by_aceso_ms"] / 1e3, b["by_aceso_memory_mb"]), flush=True)
        cases.append(case)
    json.dump({"source": "microsoft/SuperScaler branch Aceso fa80ad0 (MIT): search/aceso_search.py "
                         "and search/aceso_cost_model.py on profiler/profiled-time-eurosys",
               "cases": cases}, open(OUT, "w"), indent=1)


if __name__ == "__main__":
    main()
