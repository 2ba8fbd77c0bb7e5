"""The settings `repipe plan --emit` writes for torchtitan and Megatron-LM, held to what
those trainers' own code made of them (tests/fixtures/trainers/cases.json, recorded by
tests/trainer_fixtures.py where torchtitan and megatron-core are installed).

For every case: repipe writes today exactly the settings that were read back (else the
records are about another writer: regenerate them), and what the trainers' code read places
every layer where repipe's plan (its configuration, beside the settings) puts it: torchtitan's
split of its Llama 3 model keeps each stage's modules on the stage's rank; Megatron-LM's layout
gives each pipeline rank and virtual stage the plan's embedding, transformer layers and
loss — every layer once, none dropped. Then the restrictions: a plan that replicates a stage
is not written; the trainer's best plan is, with both predicted times.

Usage: trainers_test.py REPIPE SOURCE_DIR
"""
import json
import os
import re
import subprocess
import sys
import tempfile

from checks import check, finish

repipe, src = sys.argv[1], sys.argv[2]
fix = os.path.join(src, "tests", "fixtures", "trainers")


def layers_of(profile):
    """The profile's layers (after its Input), each its module name: a chain in file order."""
    names = []
    for line in open(profile):
        if line.startswith("\t") or " -- " not in line:
            continue
        desc = line.split(" -- ")[1]
        if not desc.startswith("Input"):
            names.append(desc.split(": ")[0])
    return names


def placement(cfg, names):
    """The plan's stages from its configuration: (rank, module names) per stage, in order."""
    counts = cfg.get("layers_per_stage") or [len(names)]
    chunked = cfg.get("schedule") in ("interleaved-1f1b", "zb-v")
    P = len(counts) // cfg.get("virtual_stages", 1) if chunked else len(counts)
    out, at = [], 0
    for c, n in enumerate(counts):
        if cfg.get("schedule") == "zb-v":
            rank = c if c < P else 2 * P - 1 - c
        else:
            rank = c % P
        out.append((rank, names[at:at + n]))
        at += n
    return out, P


def block(name):
    m = re.fullmatch(r"[A-Za-z_]\w*\.(\d+)", name)
    return int(m.group(1)) if m else None


def emit(case, trainer, tmp):
    out = os.path.join(tmp, trainer + ".args")
    cmd = [repipe, "plan", "--profile", os.path.join(fix, case["profile"])] + case["args"] + \
        ["--emit", trainer, "--emit-out", out]
    p = subprocess.run(cmd, capture_output=True, text=True)
    return p, out


data = json.load(open(os.path.join(fix, "cases.json")))
check(len(data["cases"]) >= 6, "%d plans recorded (%s)" % (len(data["cases"]), data["versions"]))
for case in data["cases"]:
    names = layers_of(os.path.join(fix, case["profile"]))
    blocks = [block(n) for n in names if block(n) is not None]
    for trainer in ("torchtitan", "megatron"):
        rec = case[trainer]
        what = "%s, %s:" % (case["name"], trainer)
        with tempfile.TemporaryDirectory() as tmp:
            p, out = emit(case, trainer, tmp)
            check(p.returncode == 0, what + " repipe plan --emit runs (%s)" % p.stderr.strip())
            if p.returncode:
                continue
            settings = open(out).read().replace(tmp + "/", "")
            cfg = json.load(open(out + ".config.json"))
        check(settings == rec["settings"],
              what + " the settings are those the trainer read back")
        check(cfg == rec["config"], what + " the plan is the one recorded")
        stages, P = placement(cfg, names)
        read = rec["read"]
        if trainer == "torchtitan":
            got = [(s["rank"], s["modules"]) for s in sorted(read["stages"], key=lambda s: s["stage"])]
            check(got == stages, what + " torchtitan's split keeps each stage's modules on its "
                  "rank: %s" % ["%d:%s-%s" % (r, m[0], m[-1]) for r, m in got])
            placed = [m for _, ms in got for m in ms]
            check(sorted(placed) == sorted(names) and len(placed) == len(set(placed)),
                  what + " every module placed once (%d)" % len(placed))
            check(read["pipeline_parallel_degree"] == P and
                  read["global_batch_size"] == cfg["micro_batch_size"] *
                  cfg["gradient_accumulation_steps"] * cfg.get("replication_factor", 1),
                  what + " pipeline degree %d, global batch %d" % (P, read["global_batch_size"]))
        else:
            want = {}
            for c, (rank, ms) in enumerate(stages):
                idx = [block(m) for m in ms if block(m) is not None]
                # the embedding: the stage of the model's first module; the loss: its last's
                want[(rank, c // P)] = (names[0] in ms, names[-1] in ms, idx)
            got = {(s["pp_rank"], s["vp_stage"]): (s["embedding"], s["loss"], s["layers"])
                   for s in read["stages"]}
            check(got == want, what + " Megatron-LM's layout gives each rank and virtual stage "
                  "the plan's layers: %s" % sorted(got.items())[:3])
            ids = [i for _, _, ls in got.values() for i in ls]
            check(sorted(ids) == sorted(blocks) and len(ids) == len(set(ids)) ==
                  read["num_layers"] == len(blocks),
                  what + " every one of %d transformer layers placed once" % len(blocks))
            check(read["pipeline_model_parallel_size"] == P and
                  read["data_parallel_size"] == cfg.get("replication_factor", 1),
                  what + " pipeline size %d, data-parallel size %d" % (P, read["data_parallel_size"]))

# The restrictions: where repipe's plan replicates a stage, neither trainer gets it; each gets
# its own best plan, both predicted times side by side.
replicated = [c for c in data["cases"] if "replicated" in c["name"]]
check(len(replicated) == 1, "a case whose plan replicates a stage")
for case in replicated:
    for trainer in ("torchtitan", "megatron"):
        with tempfile.TemporaryDirectory() as tmp:
            p, _ = emit(case, trainer, tmp)
        check("cannot run repipe's plan" in p.stdout and "replicates stage" in p.stdout and
              p.stdout.count(" s per update:") == 2 and "x repipe's time per update" in p.stdout,
              "%s, %s: the restriction and both predicted times are said" % (case["name"], trainer))

# The seed's VGG-16 on 2 servers of 8 (PipeDream's plan, run synchronously): stage 0 replicated
# 7 ways. Said, with the alternative's time; its settings cannot be written (a profile of
# PipeDream's has no module names), and the command says so.
vgg = os.path.join(src, "tests", "fixtures", "pipedream", "profiles", "vgg16", "graph.txt")
for trainer in ("torchtitan", "megatron"):
    p = subprocess.run([repipe, "plan", "--profile", vgg, "--machines", "8", "2", "--bandwidth",
                        "4294967296", "2147483648", "--activation-compression", "1",
                        "--objective", "pipedream", "--profile-batch", "64", "--emit", trainer],
                       capture_output=True, text=True)
    said = p.stdout[p.stdout.find("\n" + ("torchtitan" if trainer == "torchtitan"
                                           else "Megatron-LM") + "\n"):]
    check("replicates stage 0 7 ways" in said and said.count(" s per update:") == 2,
          "VGG-16 2 x 8, %s: the stage replication and the alternative's time are said" % trainer)
    check(p.returncode == 1 and "no module name" in p.stderr,
          "VGG-16 2 x 8, %s: no settings without module names, and why (%s)"
          % (trainer, p.stderr.strip()[-80:]))

# docs/planner.md's example of a restriction: its lines are what the command prints.
doc = open(os.path.join(src, "docs", "planner.md")).read()
at = doc.index("repipe plan --profile tests/fixtures/trainers/llama8-v32k.txt")
shown = doc[doc.index("    Megatron-LM\n", at):doc.index("time per update\n", at) + 16]
p = subprocess.run([repipe, "plan", "--profile", os.path.join(fix, "llama8-v32k.txt"),
                    "--machines", "3", "--global-batch", "12", "--emit", "megatron"],
                   capture_output=True, text=True)
lines = [l[4:] for l in shown.splitlines()]
check(len(lines) == 6 and all(l in p.stdout.splitlines() for l in lines),
      "docs/planner.md's restriction example is what repipe prints")

finish()
