"""What tests/metis_fixtures.py and tests/aceso_fixtures.py both ask of repipe: a plan with its
time to plan, and a block's time as repipe prices it on a device."""
import json
import os
import re
import subprocess
import tempfile
import time


def plan(repipe, args):
    """repipe plan ARGS: its --json, and the least of 5 runs' wall time (a process's start is
    most of it)."""
    with tempfile.TemporaryDirectory() as tmp:
        js = os.path.join(tmp, "plan.json")
        seconds = []
        for _ in range(5):
            t0 = time.time()
            subprocess.run([repipe] + list(args) + ["--json", js], check=True,
                           capture_output=True)
            seconds.append(time.time() - t0)
        return json.load(open(js)), min(seconds)


def block_ms(repipe, shape, device=None, cluster=None, tensor=1):
    """A block's forward and backward at micro-batch 1 on a rank of a tensor group of `tensor`,
    as 'repipe profile --transformer' prices it on the device (a preset's name), or on the
    cluster (a cluster file's contents: its devices and its node's link) (ms)."""
    with tempfile.TemporaryDirectory() as tmp:
        prof = os.path.join(tmp, "block.txt")
        where = ["--device", device]
        if cluster is not None:
            where = ["--cluster", os.path.join(tmp, "cluster.json")]
            json.dump(cluster, open(where[1], "w"))
        subprocess.run([repipe, "profile", "--transformer", shape] + where +
                       ["--tensor-parallel", str(tensor), "--out", prof], check=True,
                       capture_output=True)
        line = [l for l in open(prof) if "layers.0:" in l][0]
    return sum(float(x) for x in re.findall(r"(?:forward|backward)_compute_time=([\d.]+)", line))
