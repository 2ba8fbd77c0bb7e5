"""repipe beside Metis (SamsungLabs/Metis, ATC'24) on Metis's own case, held to the numbers its
code printed (tests/fixtures/planners/metis.json, written by tests/metis_fixtures.py where Metis
runs): repipe still plans what was priced, its plan in Metis's form is the one Metis's estimator
priced, that price is no slower than Metis's own choice, and repipe planned at least 10 times
faster than Metis searched.

    python3 tests/planners_metis_test.py build/repipe SOURCE_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

from checks import check, finish

repipe, src = sys.argv[1], sys.argv[2]
data = json.load(open(os.path.join(src, "tests", "fixtures", "planners", "metis.json")))
check(len(data["cases"]) >= 3, "%d cases of Metis %s" % (len(data["cases"]), data["metis"]))
KEYS = ("tensor_parallel", "pipeline_parallel", "data_parallel", "context_parallel",
        "micro_batch", "micro_batches", "virtual_stages", "recompute", "sharding",
        "layers_per_stage")
for case in data["cases"]:
    name, r, m = case["name"], case["repipe"], case["metis"]
    with tempfile.TemporaryDirectory() as tmp:
        cluster, js = os.path.join(tmp, "cluster.json"), os.path.join(tmp, "plan.json")
        json.dump(case["cluster"], open(cluster, "w"))
        args = list(r["args"])
        args[args.index("--cluster") + 1] = cluster
        subprocess.run([repipe] + args + ["--json", js], check=True, capture_output=True)
        plan = json.load(open(js))
    check(all(plan[k] == r["plan"][k] for k in KEYS),
          "%s: repipe plans the shape Metis's estimator priced (%s)" % (
              name, ", ".join("%s %s" % (k, plan[k]) for k in KEYS[:6])))
    # the plan in Metis's form: t d GPUs a stage, (d, t) each, the micro-batches, the cuts
    p, d, t = plan["pipeline_parallel"], plan["data_parallel"], plan["tensor_parallel"]
    counts = [10 - sum(c for c in plan["layers_per_stage"] if c > 0) if c < 0 else c
              for c in plan["layers_per_stage"]]
    cuts = [sum(counts[:i]) for i in range(len(counts) + 1)]
    mine = {"device_groups": [d * t] * p, "strategies": [[d, t]] * p,
            "batches": plan["micro_batches"], "layer_partition": cuts,
            "gbs": plan["global_batch"]}
    check(mine == r["as_metis"], "%s: that plan in Metis's form is the one it priced" % name)
    check(r["by_metis_ms"] <= m["het"]["best_ms"] * (1 + 1e-9),
          "%s: by Metis's own estimator repipe's plan takes %.1f ms, Metis's choice %.1f" % (
              name, r["by_metis_ms"], m["het"]["best_ms"]))
    check(m["het"]["seconds"] >= 10 * r["seconds_to_plan"],
          "%s: Metis searched %d plans in %.3f s, repipe planned in %.4f s" % (
              name, m["het"]["plans"], m["het"]["seconds"], r["seconds_to_plan"]))
    # both plans need more than an 80 GB GPU by Metis's own per-layer memory profile
    check(m["best_memory_mb"] > 80 * 1024 and r["memory_by_metis_profile_mb"] > 80 * 1024,
          "%s: Metis's choice needs %.0f MB a GPU by its own profile, more than its 81920" % (
              name, m["best_memory_mb"]))
finish()
