"""docs/simulate.md's table of Megatron-LM's published runs, held to what repipe predicts today.

Each row's command, as the page gives it, runs here: its TFLOP/s a GPU is the page's (to the
digit shown) and within 15 % of the published figure (Narayanan et al., SC'21, Table 1), the
shape fits 80 GB, and repipe's own plan (the command without --tp, --pp and --recompute) fits
80 GB and is no slower than the published shape as repipe predicts it.

Usage: scale_test.py REPIPE SOURCE_DIR
"""
import json
import re
import shlex
import subprocess
import sys

from checks import check, finish

repipe, src = sys.argv[1], sys.argv[2]
doc = open(src + "/docs/simulate.md").read()
section = doc[doc.index("### Against Megatron-LM's published runs"):]
rows = [l for l in section.splitlines() if re.match(r"\| [0-9.]+ \|", l)]
cmds = [l.strip() for l in section.splitlines() if l.startswith("    repipe plan --cluster")]


def plan(cmd):
    argv = shlex.split(cmd)[2:]
    p = subprocess.run([repipe, "plan"] + argv + ["--json", "-"], capture_output=True, text=True)
    if p.returncode:
        return None
    return json.loads(p.stdout)


check(len(rows) == 10 and len(cmds) == 10, "ten rows and ten commands on the page")
for row, cmd in zip(rows, cmds):
    cells = [c.strip() for c in row.strip("|").split("|")]
    name, published = cells[0] + "B", float(cells[8])
    shown = float(cells[9].split()[0])
    a = plan(cmd)
    check(a is not None, name + ": the command runs")
    if a is None:
        continue
    got = a["tflops_per_device"]
    check(abs(got - shown) < 0.051, "%s: %.1f TFLOP/s a GPU, as the page says (%.1f)" % (name, got, shown))
    check(abs(got - published) <= 0.15 * published,
          "%s: within 15 %% of the published %.0f (%+.1f %%)" % (name, published,
                                                                 100 * (got - published) / published))
    check(a["peak_memory_bytes"] <= 80e9, "%s: the published shape fits 80 GB" % name)
    own = plan(re.sub(r" --tp \d+ --pp \d+ --recompute on", "", cmd))
    check(own is not None and own["peak_memory_bytes"] <= 80e9 and
          own["seconds_per_update"] <= a["seconds_per_update"] * (1 + 1e-9),
          "%s: repipe's own plan fits and is no slower (%.2f of %.2f s)"
          % (name, own["seconds_per_update"] if own else 0, a["seconds_per_update"]))
finish()
