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


def block_ms(repipe, shape, device):
    """A block's forward and backward at micro-batch 1, tensor 1, as 'repipe profile
    --transformer' prices it on the device (ms)."""
    with tempfile.TemporaryDirectory() as tmp:
        prof = os.path.join(tmp, "block.txt")
        subprocess.run([repipe, "profile", "--transformer", shape, "--device", device, "--out",
                        prof], check=True, capture_output=True)
        line = [l for l in open(prof) if "layers.0:" in l][0]
    return sum(float(x) for x in re.findall(r"(?:forward|backward)_compute_time=([\d.]+)", line))
