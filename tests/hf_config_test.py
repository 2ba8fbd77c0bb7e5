"""`repipe plan --transformer-config` on config.json files written by Hugging Face transformers'
own config classes (tests/fixtures/hf-configs, made by tests/hf_config_fixtures.py): each reads
as the same shape typed by hand (the plan, its FLOPs and its memory equal), its parameters are
the model's as transformers builds it, a key repipe does not know is named, and one that changes
what it prices is refused naming it.

Usage: hf_config_test.py REPIPE SOURCE_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

from checks import check, finish

repipe, src = sys.argv[1], sys.argv[2]
fix = os.path.join(src, "tests", "fixtures", "hf-configs")
models = json.load(open(os.path.join(fix, "models.json")))["models"]
tmp = tempfile.mkdtemp(prefix="repipe-hf-")


def plan(*shape, devices=16):
    p = subprocess.run([repipe, "plan", "--cluster", "dgx-h100", "--devices", str(devices),
                        "--global-batch", str(2 * devices)] + list(shape) + ["--json", "-"],
                       capture_output=True, text=True)
    return p.returncode, (json.loads(p.stdout) if p.returncode == 0 else None), p.stderr


check(len(models) == 9, "nine models: LLaMA, Mistral, two Qwen2, GPT-2, Qwen3, and the mixtures "
      "of experts Mixtral 8x7B, Qwen3-30B-A3B and DeepSeek-V3")
for name, m in models.items():
    # the training sequence: 4096 for every model (GPT-2's own is 1024)
    seq = "seq=1024" if name.startswith("gpt2") else "seq=4096"
    # (DeepSeek-V3's 671B parameters on 512 devices)
    n = 512 if name.startswith("deepseek") else 16
    rc, a, err = plan("--transformer-config", os.path.join(fix, m["config"]), "--transformer", seq,
                      devices=n)
    check(rc == 0, "%s: planned from its config.json (%s)" % (name, err.strip()[-200:]))
    rc, b, err = plan("--transformer", m["spec"].replace(
        "seq=" + m["spec"].split("seq=")[1].split(",")[0], seq), devices=n)
    check(rc == 0, "%s: planned from the hand-typed shape" % name)
    if a is None or b is None:
        continue
    check(a["transformer"] == b["transformer"], "%s: the same shape (%s)" % (name, a["transformer"]))
    check(a["flops_per_update"] == b["flops_per_update"] and
          a["seconds_per_update"] == b["seconds_per_update"] and
          a["memory_by_rank"] == b["memory_by_rank"], "%s: the same plan, FLOPs and memory" % name)
    check(a["parameters"] == m["parameters"], "%s: %d parameters, transformers' %d" % (
        name, a["parameters"], m["parameters"]))
    # a mixture's parameters a token passes (transformers' experts, but top_k of them)
    active = m.get("active_parameters", m["parameters"])
    check(a["active_parameters"] == active, "%s: %d active parameters, transformers' %d" % (
        name, a["active_parameters"], active))

# a key repipe does not know is named; one it does not price is refused, naming it
cfg = json.load(open(os.path.join(fix, "llama3-8b.json")))
cfg["frobnicate_factor"] = 3
json.dump(cfg, open(os.path.join(tmp, "extra.json"), "w"))
rc, a, err = plan("--transformer-config", os.path.join(tmp, "extra.json"))
check(rc == 0 and "not used: frobnicate_factor" in err, "an unknown key is named: " + err.strip())
for key, value, says in [("num_local_experts", 8, '"num_local_experts"'),
                         ("sliding_window", 1024, '"sliding_window" 1024 is shorter'),
                         ("hidden_act", "gelu", '"hidden_act" \'gelu\''),
                         ("num_key_value_heads", 5, "5 key/value heads do not divide")]:
    c = dict(cfg, **{key: value})
    json.dump(c, open(os.path.join(tmp, "bad.json"), "w"))
    rc, a, err = plan("--transformer-config", os.path.join(tmp, "bad.json"))
    check(rc != 0 and says in err and "bad.json" in err, "%s %s: refused (%s)" % (key, value,
                                                                                err.strip()))
# a mixture's keys repipe cannot price as written: refused, naming them; dense first blocks read
moe = json.load(open(os.path.join(fix, "qwen3-30b-a3b.json")))
for key, value, says in [("kv_lora_rank", 512, '"kv_lora_rank": latent attention'),
                         ("decoder_sparse_step", 2, '"decoder_sparse_step" 2'),
                         ("mlp_only_layers", [1, 2], '"mlp_only_layers"'),
                         ("num_experts_per_tok", 200, "top_k 200 is more than the 128 experts")]:
    json.dump(dict(moe, **{key: value}), open(os.path.join(tmp, "bad.json"), "w"))
    rc, a, err = plan("--transformer-config", os.path.join(tmp, "bad.json"))
    check(rc != 0 and says in err and "bad.json" in err, "%s %s: refused (%s)" % (key, value,
                                                                                err.strip()))
json.dump(dict(moe, mlp_only_layers=[0, 1]), open(os.path.join(tmp, "dense.json"), "w"))
rc, a, err = plan("--transformer-config", os.path.join(tmp, "dense.json"), "--transformer",
                  "seq=4096")
check(rc == 0 and "dense_first=2" in a["transformer"] and
      a["parameters"] < models["qwen3-30b-a3b"]["parameters"],
      "mlp_only_layers [0, 1]: the first two blocks dense (%s)" % err.strip()[-200:])
finish()
