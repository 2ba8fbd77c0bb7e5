"""The PipeDream commands `repipe plan` prints, read as PipeDream reads them.

The seed's VGG-16 case on 2 servers of 8: `repipe plan` prints a
convert_graph_to_model.py and a main_with_runtime.py command line. Each is
parsed here by an argparse parser declared with the options, short names,
types and required flags of that script (msr-fiddle/pipedream, files
optimizer/convert_graph_to_model.py and
runtime/image_classification/main_with_runtime.py), and then
--stage_to_num_ranks_map is read the way the script reads it: entries split
at commas, each split at a colon into two integers, one entry per stage of the
graph file. The graph file must be the one --graph-out wrote, with as many
stages; the rank layout the script derives from the map must equal the
hybrid_conf.json that PipeDream's own script wrote from this very command
(tests/fixtures/pipedream/commands, made by running it unmodified); the
runtime's --config_path must be --pipedream-conf's file, with repipe's
layout.

Usage: pipedream_commands.py REPIPE SOURCE_DIR
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

from checks import check, finish

repipe, src = sys.argv[1], sys.argv[2]


def convert_parser():
    p = argparse.ArgumentParser(prog="convert_graph_to_model.py")
    p.add_argument("-f", "--profile_filename", required=True)
    p.add_argument("--model_template_filename", default="templates/model.py.template")
    p.add_argument("--init_template_filename", default="templates/__init__.py.template")
    p.add_argument("--conf_template_filename", default="templates/conf.json.template")
    p.add_argument("--stage_to_num_ranks_map", type=str, default=None)
    p.add_argument("-n", "--model_name", required=True)
    p.add_argument("-a", "--arch", required=True)
    p.add_argument("-o", "--output_directory", required=True)
    return p


def runtime_parser():
    p = argparse.ArgumentParser(prog="main_with_runtime.py")
    p.add_argument("--data_dir", type=str)
    p.add_argument("--distributed_backend", type=str)
    p.add_argument("--module", "-m", required=True)
    p.add_argument("-b", "--batch-size", default=256, type=int)
    p.add_argument("--master_addr", default=None, type=str)
    p.add_argument("--config_path", default=None, type=str)
    p.add_argument("--rank", default=None, type=int)
    p.add_argument("--local_rank", default=0, type=int)
    p.add_argument("--num_ranks_in_server", default=1, type=int)
    return p


def stage_map(text):
    """--stage_to_num_ranks_map as the script reads it."""
    return [(int(x.split(":")[0]), int(x.split(":")[1])) for x in text.split(",")]


with tempfile.TemporaryDirectory() as tmp:
    graph = os.path.join(tmp, "gpus=16.txt")
    conf = os.path.join(tmp, "hybrid_conf.json")
    plan_json = os.path.join(tmp, "plan.json")
    profile = os.path.join(src, "tests/fixtures/pipedream/profiles/vgg16/graph.txt")
    out = subprocess.run(
        [repipe, "plan", "--profile", profile, "--machines", "8", "2", "--bandwidth",
         "4294967296", "2147483648", "--activation-compression", "1", "--graph-out", graph,
         "--pipedream-conf", conf, "--profile-batch", "64", "--json", plan_json],
        check=True, capture_output=True, text=True).stdout
    lines = [l.strip() for l in out.splitlines()]
    convert = [l for l in lines if l.startswith("python convert_graph_to_model.py")]
    runtime = [l for l in lines if l.startswith("python main_with_runtime.py")]
    check(len(convert) == 1 and len(runtime) == 1, "one command line of each script")
    plan = json.load(open(plan_json))

    args = convert_parser().parse_args(shlex.split(convert[0])[2:])
    check(args.profile_filename == graph, "-f is the file --graph-out wrote")
    stages = set()
    for line in open(args.profile_filename):
        m = re.search(r" -- stage_id=(\d+)\s*$", line)
        if not line.startswith("\t") and line.strip():
            check(m is not None, "every node of the graph has a stage_id: " + line[:40])
            stages.add(int(m.group(1)))
    pairs = stage_map(args.stage_to_num_ranks_map)
    check(len(pairs) == len(stages), "one map entry per stage of the graph (%d)" % len(stages))
    check([s for s, _ in pairs] == sorted(stages), "the entries name the stages in order")
    check([n for _, n in pairs] == plan["stage_to_num_ranks"], "the map's counts are the plan's")
    check(sum(n for _, n in pairs) == 16, "16 ranks in all")
    # the layout the script writes from the map, against what it wrote
    layout, first = {}, 0
    for s, n in pairs:
        layout[str(s)] = list(range(first, first + n))
        first += n
    written = json.load(open(os.path.join(src, "tests/fixtures/pipedream/commands",
                                          "vgg16_8x2_seed.hybrid_conf.json")))
    check(layout == written["stage_to_rank_map"], "the layout derived from the map is the one "
          "convert_graph_to_model.py wrote")
    check(plan["pipedream"]["converted_stage_to_rank_map"] == written["stage_to_rank_map"],
          "the plan's JSON states that layout")
    words = "stage 0: ranks %d\u2013%d, stage 1: ranks %d\u2013%d" % (
        layout["0"][0], layout["0"][-1], layout["1"][0], layout["1"][-1])
    check(words in out, "the printout says which layout the script writes")
    # the old form, counts without stage numbers, fails the script's reading
    try:
        stage_map("14,2")
        check(False, "'14,2' fails as the script reads it")
    except IndexError:
        check(True, "'14,2' fails as the script reads it (IndexError)")

    line = runtime[0].replace(" --rank R ", " --rank 9 ").replace(" --local_rank L ",
                                                                 " --local_rank 1 ")
    rargs = runtime_parser().parse_args(shlex.split(line)[2:])
    check(rargs.module == "models.vgg16.gpus=16" and
          args.output_directory.endswith("models/vgg16/gpus=16"),
          "--module names the directory convert_graph_to_model.py writes")
    check(rargs.batch_size == 64 and rargs.rank == 9, "-b and --rank are integers")
    check(rargs.config_path == conf, "--config_path is --pipedream-conf's file")
    hybrid = json.load(open(conf))
    check(hybrid["stage_to_rank_map"] == plan["stage_to_rank_map"] and
          hybrid["stage_to_rank_map"]["1"] == [7, 15],
          "--pipedream-conf's layout is the plan's, replica-major (stage 1 on ranks 7 and 15)")
    check(hybrid["module_to_stage_map"] == written["module_to_stage_map"],
          "its module_to_stage_map is the script's")

finish()
