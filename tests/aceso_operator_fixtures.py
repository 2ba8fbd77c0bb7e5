"""Regenerates, for a family of Aceso's models, tests/fixtures/planners/aceso_FAMILY.json and the
profiles it plans from (tests/fixtures/planners/aceso_FAMILY/): Aceso (microsoft/SuperScaler,
branch Aceso, fa80ad0; EuroSys'24; MIT) and repipe on Aceso's cases of its Wide-ResNet (resnet),
T5 (t5) or GPT (gpt), each plan priced by both cost models.

Aceso's code runs as its search/scripts/search_FAMILY.sh runs it (search/aceso_search.py, budget
200 s, 7 hops; for Wide-ResNet and T5 a balanced start, for Wide-ResNet fine-tuning after each
trial and micro-batches of 16, 32, 48 and 64, for T5 and GPT micro-batches of 1, 2, 4 and 8; the
GPT's settings as tests/aceso_fixtures.py runs them), and its cost model on a configuration
(search/aceso_cost_model.py --initial-point CONFIG), from ACESO_DIR (its search/ and profiler/
folders), standard library only. Kept of it: the numbers it printed, and its per-operator
profiles as repipe profiles (data, MIT). Run:

    python3 tests/aceso_operator_fixtures.py resnet|t5|gpt ACESO_DIR build/repipe [CASE,...]

(with CASE numbers, those cases only, printed, the fixture kept.) The cases: the settings the
scripts list from Aceso's paper, on V100-32GB, 28 000 MB a GPU, profiler/profiled-time-eurosys.
Wide-ResNet of 2B parameters on 1 x 4, 4B on 1 x 8, 6.8B on 2 x 8 and 13B on 4 x 8, 1536 images
an update; T5 of 3B on 1 x 4, 6B on 1 x 8, 11B on 2 x 8 and 22B on 4 x 8 (the 11B's operators, 48
layers), 1024 sequences an update; GPT of 1.3B on 1 x 4, 2.6B on 1 x 8 and 6.7B on 2 x 8, 1024
sequences, and its README's case on profiler/profiled-time-miniset (1.3B on 1 x 4, 12 000 MB,
512 sequences): tests/aceso_fixtures.py's cases, which plan the GPT as a transformer shape.

The mapping (docs/planner.md): repipe's profile is Aceso's operators in order (a GPT's and a
T5's as Aceso lays them out: its one layer repeated, a T5's encoder layer and then its decoder
layer), one node each, at tensor 1: forward and backward times, as activation_size the
operator's output (what crosses a cut there, as Aceso prices a stage's messages), weights (a
GPT's and a T5's at twice their fp16 bytes: Aceso counts eight fp16 copies of their weights,
fp16 weights and gradients and fp32 master weights and Adam's two states, where repipe counts
four fp32 ones), as saved_bytes what Aceso's memory count keeps of the operator (its
activations; none for those it counts as sharing another's space: Wide-ResNet's bn1, each
block's bn3 and the later blocks' downsample, the attention softmax, whose dropout it counts one
and a half times), and as scratch_bytes its workspace, Aceso's reserved memory at its forward
and its backward summed (Aceso holds the most of each of a stage's operators; repipe the most
of their sums); one profile per micro-batch Aceso profiled, and one per micro-batch on a rank
of a tensor group of 2 and of 4 from Aceso's profile at that tensor size (tensor_parallel= in
its Input's description: the operators' times with their groups' all-reduces, as Aceso timed
them, weights and memory a rank's; every operator of a plan at its one tensor size, where Aceso
may give each its own). The links: Aceso's point-to-point
bandwidth at its largest size, within a node and between. The
optimizer: Adam. repipe plans with the engine objective in Aceso's form: whole pipelines
replicated (`--straight`: a stage's GPUs are its data-parallel ranks), the optimizer state whole
(`--sharding none`), 1F1B, at each micro-batch and pipeline size Aceso's form holds
(`--micro-batch B --pp P --tp T`: a stage's micro-batch over its replicas and each GPU's one
Aceso profiled, at tensor 1, 2 and 4), the fastest by repipe's model kept. Two memories: Aceso's limit, and the largest share
of it (in steps of 2 % down to 30 %, then the 1 % above the first that fits) at which the plan
repipe makes fits Aceso's count (fitted), and the least memory a GPU at which repipe's space in
Aceso's form holds any plan by repipe's own count (to 1 %, by bisection). Beside them, the two
counts compared on reference plans (2, 4 and 8 stages cut evenly where Aceso's form holds them,
the least micro-batch, recomputing nothing or all), Aceso's own plan priced by repipe's model
where repipe can run it, and for Wide-ResNet the best plan of repipe's space in Aceso's form by
Aceso's own model (space_best, a local search over the cuts; a T5's 821 operators and more, and
a GPT's 315 and more, are past what that search covers in the time).
"""
import csv
import functools
import json
import math
import os
import subprocess
import sys
import tempfile

import aceso_fixtures
import planner_runs

# the tensor groups repipe plans with from Aceso's profiles of a group's rank (those Aceso's
# choices take most; each adds a profile per micro-batch)
TENSORS = (2, 4)

HERE = os.path.dirname(os.path.abspath(__file__))
PLANNERS = os.path.join(HERE, "fixtures", "planners")
ADAM = {"optimizer": {"type": "adam", "lr": 0.001}}


class Family:
    """What differs between Aceso's models here: the cases (name, Aceso's model size, nodes, GPUs
    a node), the batch, memory and micro-batches of its script, its further search settings, the
    operators it never recomputes, and how its profile maps to repipe's."""

    def __init__(self, model, cases, gbs, micro, settings, fixed, weight_bytes, moves):
        self.model, self.cases, self.gbs, self.micro = model, cases, gbs, micro
        self.memory_mb, self.settings, self.fixed = 28000, settings, fixed
        self.db = "eurosys"
        self.weight_bytes = weight_bytes  # repipe's bytes a byte of Aceso's weights
        self.moves = moves                # space_best's moves of a boundary; () for none
        self.out = os.path.join(PLANNERS, "aceso_%s.json" % model)
        self.profiles = os.path.join(PLANNERS, "aceso_%s" % model)

    def kept_mb(self, op, mb):
        """What Aceso's memory count keeps of an operator's activations, mb (its
        consider_shared_space: these share the space of the operator before them, and the
        encoder's attention dropout counts one and a half)."""
        if op in ("enc-attention-softmax", "bn1") or "-bn3" in op or (
                "-downsample" in op and "0-0" not in op):
            return 0.0
        return mb * 1.5 if op == "enc-attention-dropout" else mb

    def csv(self, db, size, mbs, tp=1):
        """Aceso's profile of a size at micro-batch mbs, tensor tp (22B: the 11B's)."""
        name = "11B" if (self.model, size) == ("t5", "22B") else size
        return os.path.join(db, "%s_%s_mbs%d_tp%d_algo0.csv" % (self.model, name, mbs, tp))

    def rows(self, db, size, mbs, tp=1):
        """Aceso's operators in its order at tensor 1, micro-batch mbs: a GPT's or T5's profile
        holds one layer (a T5's one encoder and one decoder layer), repeated as its
        model_ops_info lays them out (a GPT of 1.3B 24 layers, of 2.6B and 6.7B 32; T5 22B 48)."""
        rows = list(csv.reader(open(self.csv(db, size, mbs, tp))))[1:]
        if self.model == "gpt":
            return rows[:1] + rows[1:14] * (24 if size == "1_3B" else 32) + rows[14:]
        if self.model != "t5":
            return rows
        n = 48 if size == "22B" else 24
        return (rows[:1] + rows[1:14] * n + rows[14:16] + rows[16:37] * n + rows[37:])


FAMILIES = {
    "resnet": Family("resnet", [("wide-resnet 2B, 1 x 4", "2B", 1, 4),
                                ("wide-resnet 4B, 1 x 8", "4B", 1, 8),
                                ("wide-resnet 6.8B, 2 x 8", "6_8B", 2, 8),
                                ("wide-resnet 13B, 4 x 8", "13B", 4, 8)],
                     1536, (16, 32, 48, 64),
                     ["--finetune-after-trial", "1", "--initial-point", "balance"], ("conv1",),
                     1, (-8, -2, -1, 1, 2, 8)),
    "t5": Family("t5", [("t5 3B, 1 x 4", "3B", 1, 4), ("t5 6B, 1 x 8", "6B", 1, 8),
                        ("t5 11B, 2 x 8", "11B", 2, 8), ("t5 22B, 4 x 8", "22B", 4, 8)],
                 1024, (1, 2, 4, 8), ["--initial-point", "balance"],
                 ("encoder-embedding", "decoder-embedding", "t5-post-process"), 2, ()),
    # the cases of aceso_fixtures (its README's on the miniset: 12 000 MB, 512 sequences)
    "gpt": Family("gpt", [("gpt 1.3B, 1 x 4, 12000 MB, batch 512", "1_3B", 1, 4, "miniset",
                           12000, 512),
                          ("gpt 1.3B, 1 x 4", "1_3B", 1, 4), ("gpt 2.6B, 1 x 8", "2_6B", 1, 8),
                          ("gpt 6.7B, 2 x 8", "6_7B", 2, 8)],
                  1024, (1, 2, 4, 8), [], ("encoder-embedding", "gpt-post-process"), 2, ()),
}


class Case:
    """A case in the form aceso_fixtures' helpers read."""

    def __init__(self, f, aceso, row):
        self.f = f
        self.name, self.size, self.nodes, self.per_node = row[:4]
        db, self.memory_mb, self.gbs = row[4:] or (f.db, f.memory_mb, f.gbs)
        self.model, self.micro_batches = f.model, f.micro
        self.search_settings = f.settings
        self.db = os.path.join(aceso, "profiler", "profiled-time-" + db)
        self.tag = self.size if db == f.db else "%s_%s" % (self.size, db)
        self.aceso = aceso
        # the micro-batches Aceso profiled this size at (T5 11B: not 8), and the tensor groups
        # (of TENSORS, inside a node) it profiled at each
        self.micro = tuple(m for m in f.micro if os.path.exists(f.csv(self.db, self.size, m)))
        self.tensors = tuple(t for t in TENSORS if t <= self.per_node and all(
            os.path.exists(f.csv(self.db, self.size, m, t)) for m in self.micro))


def write_profile(c, mbs, tp=1):
    """Aceso's operators at tensor tp, micro-batch mbs, as a repipe profile (at tp > 1 a
    rank's: its times with the group's all-reduces, as Aceso timed them, its weights and memory
    the rank's); its path."""
    rows = c.f.rows(c.db, c.size, mbs, tp)
    mb = 2 ** 20  # (Aceso's MB)
    path = os.path.join(c.f.profiles, tensor_profile_name(c.tag, mbs, tp))
    with open(path, "w") as out:
        out.write("node0 -- Input0 micro_batch=%d%s -- forward_compute_time=0, "
                  "backward_compute_time=0, activation_size=%d, parameter_size=0\n" %
                  (mbs, " tensor_parallel=%d" % tp if tp > 1 else "",
                   round(float(rows[0][3]) * mb)))
        for i, r in enumerate(rows, 1):
            out.write("node%d -- %s saved_bytes=%d scratch_bytes=%d -- forward_compute_time=%.6f, "
                      "backward_compute_time=%.6f, activation_size=%d, parameter_size=%d\n" %
                      (i, r[0], round(c.f.kept_mb(r[0], float(r[6])) * mb),
                       round((float(r[7]) + float(r[8])) * mb), float(r[1]) / 1e3,
                       float(r[2]) / 1e3, round(float(r[4]) * mb),
                       round(float(r[5]) * mb * c.f.weight_bytes)))
        for i in range(len(rows)):
            out.write("\tnode%d -- node%d\n" % (i, i + 1))
    return path


def operators(path):
    """The operators of a profile this script wrote: an edge each, into it."""
    return open(path).read().count("\t")


def op_names(path):
    """The operators' names of a profile this script wrote, in order."""
    return [line.split(" -- ")[1].split()[0] for line in open(path) if line.startswith("node")][1:]


def machines(c):
    """repipe's --machines and --bandwidth for the case (innermost level first)."""
    if c.nodes == 1:
        return ["--machines", str(c.per_node), "--bandwidth",
                repr(aceso_fixtures.link_bandwidth(c, "intra"))]
    return ["--machines", str(c.per_node), str(c.nodes), "--bandwidth",
            repr(aceso_fixtures.link_bandwidth(c, "intra")),
            repr(aceso_fixtures.link_bandwidth(c, "inter"))]


def tensor_profile_name(tag, mbs, tp):
    """The file of a size's profile at micro-batch mbs, on a rank of a tensor group of tp."""
    return "%s_mbs%d%s.txt" % (tag, mbs, "_tp%d" % tp if tp > 1 else "")


def tensor_sizes(tprofiles):
    """The tensor groups of tprofiles ((micro-batch, tp) -> path; None: none)."""
    return sorted({t for _, t in tprofiles or ()})


def shapes(micro, N, tensors=()):
    """The micro-batches, pipeline sizes and tensor groups of Aceso's form on N GPUs: a stage's
    micro-batch over its replicas (B R, R = N / (p t)) one Aceso profiled (of micro), as is each
    GPU's (B); pipelines of at most 8 stages; tensor 1 and those of tensors."""
    return [(mbs, p, t) for t in (1,) + tuple(tensors) for mbs in micro for p in (1, 2, 4, 8)
            if N % (p * t) == 0 and N // (p * t) * mbs in micro]


def plan_args(gbs, profiles, where, base, memory_bytes, mbs, pp, tp=1, tprofiles=None):
    """repipe plan's arguments for a case: its batch, its profiles (micro-batch -> path), its
    machines (machines(c)), the base configuration's path, the micro-batch and pipeline size;
    at tp > 1 tensor groups of tp only, from tprofiles ((micro-batch, tp) -> path)."""
    args = ["plan", "--objective", "engine"]
    for m in sorted(profiles):
        args += ["--profile", profiles[m]]
    if tp > 1:
        for m in sorted(profiles):
            args += ["--profile", tprofiles[(m, tp)]]
        args += ["--tp", str(tp)]
    return args + where + [
        "--global-batch", str(gbs), "--memory-size", "%d" % memory_bytes, "--base-config",
        base, "--schedules", "1f1b", "--straight", "--sharding", "none", "--micro-batch",
        str(mbs), "--pp", str(pp)]


def repipe_best(gbs, repipe, N, where, profiles, base, memory_bytes, tprofiles=None):
    """The fastest of repipe's plans at each shape of Aceso's form on N GPUs (where: their
    --machines and --bandwidth), by repipe's model, with tensor groups where tprofiles holds
    their ranks' profiles: the plan's engine entry, its micro-batch, pipeline size, tensor
    group and memory, and the time to plan them all (s)."""
    best, total = None, 0.0
    tensors = tensor_sizes(tprofiles)
    for mbs, pp, tp in shapes(sorted(profiles), N, tensors):
        args = plan_args(gbs, profiles, where, base, memory_bytes, mbs, pp, tp, tprofiles)
        try:
            plan, seconds = planner_runs.plan(repipe, args)
        except subprocess.CalledProcessError:
            continue  # nothing fits at this micro-batch
        total += seconds
        entry = plan["engine"]["best"]
        if best is None or entry["seconds_per_update"] < best["seconds_per_update"]:
            best = dict(entry, micro_batch=mbs, pipeline=pp, tensor=tp,
                        memory_bytes=memory_bytes)
    if best:
        best["seconds_to_plan"] = total
    return best


# the keys of Aceso's configuration that as_aceso writes; the others are the model's
PLAN_KEYS = ("global_batch_size", "micro_batch_size", "num_stages", "num_gpus",
             "checkpoint_activations", "resharding_stages", "num_ops_in_each_stage",
             "model_parallel_size_of_each_op", "data_parallel_size_of_each_op", "recompute_ops",
             "algo_of_each_op")


def recomputed(c, layers, rc, named=()):
    """Aceso's recompute_ops for repipe's recomputation: every operator of each stage, but those
    Aceso never recomputes, or none; by layer (named: recompute_layers), each layer named and
    the one after it in its stage (Aceso's count drops an operator's activations where it and
    the next are recomputed, and makes both again: the one after once more than repipe)."""
    ops, out, at = c.ops, [], 0
    for n in layers:
        row = [int(rc and ops[at + k] not in c.f.fixed) for k in range(n)]
        for k in range(n):
            if at + k in named:
                row[k] = 1
                row[min(k + 1, n - 1)] = 1
        out.append(row)
        at += n
    return out


def as_aceso(c, cfg, template):
    """repipe's configuration as Aceso's: its stages (an operator a layer of repipe's), each on
    its replicas' GPUs (Aceso's micro-batch is a stage's, over its data-parallel ranks: a
    stage replicated r times in each of R pipelines has R r ranks, each of a micro-batch over
    r), every operator at the plan's tensor group; recomputation as repipe's."""
    layers, R = cfg["layers_per_stage"], cfg["replication_factor"]
    width = [R * r for r in cfg.get("stage_replication", [1] * len(layers))]
    tp = cfg.get("tensor_parallel", 1)
    rc = cfg.get("recompute_checkpoint_every_layer", False)
    ops = recomputed(c, layers, rc, set(cfg.get("recompute_layers", ())))
    out = {k: v for k, v in template.items() if k not in PLAN_KEYS}
    out.update(global_batch_size=c.gbs, micro_batch_size=cfg["micro_batch_size"] * R,
               num_stages=len(layers), num_gpus=[w * tp for w in width],
               checkpoint_activations=[rc or any(s) for s in ops],
               resharding_stages=[False] * len(layers),
               num_ops_in_each_stage=list(layers),
               model_parallel_size_of_each_op=[[tp] * n for n in layers],
               data_parallel_size_of_each_op=[[w] * n for n, w in zip(layers, width)],
               recompute_ops=ops,
               algo_of_each_op=[[0] * n for n in layers])
    return out


def as_repipe(c, config):
    """Aceso's configuration as repipe's, where repipe runs it: every operator at one tensor
    group (1 or one of c.tensors) and its stage's width; stages of one width as replicas of whole pipelines, of several as
    stages replicated (each of its GPUs a micro-batch over its width, a replica of repipe's a
    whole one in turn); recomputing nothing, every operator it can, or by operator
    (recompute_layers: those whose activations Aceso's count drops, each with the next
    recomputed); None elsewhere."""
    flat = lambda k: [x for s in config[k] for x in s]
    tps = set(flat("model_parallel_size_of_each_op"))
    tp = min(tps)
    widths = [g // tp for g in config["num_gpus"]]
    R = functools.reduce(math.gcd, widths)
    rc, layers = config["recompute_ops"], config["num_ops_in_each_stage"]
    every = any(map(any, rc)) and rc == recomputed(c, layers, True)
    if len(tps) > 1 or (tp > 1 and tp not in c.tensors) or any(
            d != w for s, w in zip(config["data_parallel_size_of_each_op"], widths) for d in s):
        return None
    named, at = [], 0
    for row in rc:
        named += [at + k for k in range(len(row) - 1) if row[k] and row[k + 1]]
        at += len(row)
    out = dict(ADAM, micro_batch_size=config["micro_batch_size"] // R, replication_factor=R,
               gradient_accumulation_steps=c.gbs // config["micro_batch_size"],
               layers_per_stage=layers, schedule="1f1b", recompute_checkpoint_every_layer=every)
    if len(set(widths)) > 1:
        out["stage_replication"] = [w // R for w in widths]
    if tp > 1:
        out["tensor_parallel"] = tp
    if named and not every:
        out["recompute_layers"] = named
    return out


def simulate(repipe, c, profiles, cfg, tmp):
    """repipe's model of a configuration: seconds an update, and its busiest stage's bytes."""
    path = os.path.join(tmp, "simulate.json")
    json.dump(cfg, open(path, "w"))
    tp, mbs = cfg.get("tensor_parallel", 1), cfg["micro_batch_size"]
    path_p = profiles[mbs] if tp == 1 else c.tprofiles[(mbs, tp)]
    out = subprocess.run([repipe, "simulate", "--profile", path_p,
                          "--config", path] + machines(c) + ["--json", "-"],
                         capture_output=True, text=True, check=True).stdout
    got = json.loads(out)
    return got["seconds_per_update"], max(got["stage_memory_bytes"])


def calibrate(repipe, c, profiles, tmp, template):
    """The least, over the reference plans, of repipe's count of the busiest stage over
    Aceso's; and the references."""
    refs, N, m = [], c.nodes * c.per_node, c.micro[0]
    for p, rc in ((p, rc) for p in (2, 4, 8) for rc in (False, True)):
        if (m, p, 1) not in shapes(c.micro, N):
            continue
        R, n = N // p, operators(profiles[m])
        layers = [n // p + (s < n % p) for s in range(p)]
        cfg = dict(ADAM, micro_batch_size=m, replication_factor=R,
                   gradient_accumulation_steps=c.gbs // (m * R), layers_per_stage=layers,
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
            "layers_per_stage", "recompute_checkpoint_every_layer", "recompute_layers",
            "tensor_parallel")
    return {"plan": {k: cfg.get(k) for k in keys}, "micro_batch": best["micro_batch"],
            "pipeline": best["pipeline"], "tensor": best["tensor"],
            "memory_bytes": best["memory_bytes"],
            "seconds_per_update": best["seconds_per_update"],
            "worker_mb": best["worker_bytes"] / 2 ** 20,
            "seconds_to_plan": best["seconds_to_plan"], "by_aceso_ms": ms,
            "by_aceso_memory_mb": mem}


def one_case(f, aceso, repipe, row):
    c = Case(f, aceso, row)
    os.makedirs(f.profiles, exist_ok=True)
    profiles = {m: write_profile(c, m) for m in c.micro}
    c.tprofiles = {(m, t): write_profile(c, m, t) for m in c.micro for t in c.tensors}
    c.ops = op_names(profiles[c.micro[0]])
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "adam.json")
        json.dump(dict(ADAM, micro_batch_size=c.micro[0]), open(base, "w"))
        found, config = aceso_fixtures.aceso_search(c, tmp)
        case = {"name": c.name, "size": c.size, "profile": c.tag, "nodes": c.nodes,
                "per_node": c.per_node,
                "global_batch": c.gbs, "memory_mb": c.memory_mb,
                "aceso": dict(found, config={k: config[k] for k in (
                    "micro_batch_size", "num_stages", "num_gpus", "num_ops_in_each_stage")},
                    recomputed_ops=sum(map(sum, config["recompute_ops"])),
                    tensor_parallel=sorted({t for s in config["model_parallel_size_of_each_op"]
                                            for t in s}))}
        theirs = as_repipe(c, config)
        if theirs:  # Aceso's plan by repipe's model
            s, b = simulate(repipe, c, profiles, theirs, tmp)
            case["aceso"]["by_repipe"] = {"seconds_per_update": s, "worker_mb": b / 2 ** 20}
        ratio, refs = calibrate(repipe, c, profiles, tmp, config)
        case["calibration"] = {"ratio": ratio, "references": refs}
        limit = c.memory_mb * 2 ** 20
        case["machines"] = machines(c)
        best = repipe_best(c.gbs, repipe, c.nodes * c.per_node, case["machines"], profiles, base,
                           limit, c.tprofiles)
        case["repipe"] = priced(c, best, config, tmp) if best else None
        case["repipe_fitted"], case["shares_tried"] = fitted(repipe, c, profiles, base, config,
                                                             tmp)
        case["repipe_least_memory_bytes"] = least_memory(
            c.gbs, repipe, c.nodes * c.per_node, case["machines"], profiles, base, 2 ** 40,
            c.tprofiles)
        if f.moves:
            case["repipe_space_best"] = space_best(c, operators(profiles[c.micro[0]]), config,
                                                   tmp)
    return case


def fitted(repipe, c, profiles, base, config, tmp):
    """repipe's plan at the largest share of the limit, from all of it down to 30 % in steps
    of 2 % and then the 1 % above the first that fits, at which the plan it makes fits Aceso's
    count; and every share tried."""
    limit, tried, found = c.memory_mb * 2 ** 20, [], None

    def at(share):
        plan = repipe_best(c.gbs, repipe, c.nodes * c.per_node, machines(c), profiles, base,
                           limit * share, c.tprofiles)
        got = priced(c, plan, config, tmp) if plan else None
        tried.append([round(share, 2), got and got["by_aceso_memory_mb"]])
        return dict(got, share=share) if got and got["by_aceso_memory_mb"] <= c.memory_mb else None

    for step in range(36):
        found = at(1 - 0.02 * step)
        if found:
            return (at(1.01 - 0.02 * step) if step else None) or found, tried
    return None, tried


def space_best(c, n, template, tmp):
    """The fastest plan of repipe's space in Aceso's form by Aceso's own model, among those
    that fit Aceso's memory by Aceso's count: each micro-batch and pipeline size of shapes(),
    recomputing nothing or all, its n operators cut evenly and then a boundary moved by one of
    the family's moves at a time while Aceso's model says that helps (the least memory first
    where it does not fit, then the least time); None where no cut it reaches fits, with the
    least memory it reached. A local search: faster plans of the space may exist."""
    N, seen, f = c.nodes * c.per_node, {}, c.f

    def price(mbs, p, rc, layers):
        key = (mbs, p, rc, tuple(layers))
        if key not in seen:
            R = N // p
            cfg = dict(ADAM, micro_batch_size=mbs, replication_factor=R,
                       gradient_accumulation_steps=c.gbs // (mbs * R), layers_per_stage=layers,
                       schedule="1f1b", recompute_checkpoint_every_layer=rc)
            seen[key] = aceso_fixtures.aceso_price(c, tmp, as_aceso(c, cfg, template))
        ms, mem = seen[key]
        return (0, ms) if mem <= c.memory_mb else (1, mem)

    best = None
    for mbs, p, _ in shapes(c.micro, N):
        for rc in (False, True):
            layers = [n // p + (s < n % p) for s in range(p)]
            now = price(mbs, p, rc, layers)
            for _ in range(40):
                moves = []
                for b in range(p - 1):
                    for d in f.moves:
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


def fits_somewhere(gbs, repipe, N, where, profiles, base, memory, tprofiles=None):
    """Whether repipe finds a plan of Aceso's form on N GPUs with memory bytes a GPU (with
    tensor groups where tprofiles holds their ranks' profiles)."""
    tensors = tensor_sizes(tprofiles)
    return any(subprocess.run([repipe] + plan_args(gbs, profiles, where, base, memory, mbs, pp,
                                                   tp, tprofiles),
                              capture_output=True).returncode == 0
               for mbs, pp, tp in shapes(sorted(profiles), N, tensors))


def least_memory(gbs, repipe, N, where, profiles, base, hi, tprofiles=None):
    """The least memory a GPU (to 1 %, below hi bytes) at which repipe finds a plan of Aceso's
    form on N GPUs, by bisection; None where none fits hi."""
    fits = lambda memory: fits_somewhere(gbs, repipe, N, where, profiles, base, memory,
                                         tprofiles)
    if not fits(hi):
        return None
    lo = 0.0
    while hi - lo > 0.01 * hi:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def main():
    if len(sys.argv) not in (4, 5) or sys.argv[1] not in FAMILIES:
        sys.exit("usage: aceso_operator_fixtures.py resnet|t5|gpt ACESO_DIR REPIPE [CASE,...]\n"
                 "(with CASE, the cases of those numbers from 0, printed, the fixture kept)")
    f = FAMILIES[sys.argv[1]]
    aceso, repipe = os.path.abspath(sys.argv[2]), os.path.abspath(sys.argv[3])
    only = [int(k) for k in sys.argv[4].split(",")] if len(sys.argv) == 5 else None
    cases = []
    for row in ([f.cases[k] for k in only] if only else f.cases):
        case = one_case(f, aceso, repipe, row)
        a, r, k, b = (case["aceso"], case["repipe"], case["repipe_fitted"],
                      case.get("repipe_space_best"))
        print("%s: Aceso %.2f s (%d MB, %.0f s to search); repipe %s; fitted %s%s" % (
            case["name"], a["time_s"], a["memory_mb"], a["seconds"],
            "%.2f s by Aceso (%d MB)" % (r["by_aceso_ms"] / 1e3, r["by_aceso_memory_mb"])
            if r else "none fits", "%.2f s by Aceso (%d MB)" % (
                k["by_aceso_ms"] / 1e3, k["by_aceso_memory_mb"]) if k else "none fits",
            "; the best of repipe's space %.2f s (%d MB)" % (
                b["by_aceso_ms"] / 1e3, b["by_aceso_memory_mb"]) if b else ""), flush=True)
        cases.append(case)
    if only:
        json.dump(cases, sys.stdout, indent=1)
        return
    json.dump({"source": "microsoft/SuperScaler branch Aceso fa80ad0 (MIT): search/aceso_search.py "
                         "and search/aceso_cost_model.py on profiler/profiled-time-eurosys",
               "cases": cases}, open(f.out, "w"), indent=1)


if __name__ == "__main__":
    main()
