"""repipe's FLOPs and memory of a run against Megatron-LM's own arithmetic
(tests/fixtures/megatron/arithmetic.json, made by tests/megatron_fixtures.py with megatron-core's
code; no Megatron here).

For each record `repipe plan --cluster` plans the record's run exactly (its tensor, pipeline,
virtual and data-parallel sizes, micro-batch, sequence parallelism, distributed optimizer,
recomputation, Megatron-LM's even stages) and its JSON is held to:

- FLOPs of the global batch: Megatron-LM's num_floating_point_operations, to 1e-9 (its MoE
  terms too: the top_k experts and the shared expert of each mixture block);
- weights and optimizer state of the first pipeline rank (Megatron-LM's "most loaded shard"):
  within 1 % (a mixture's experts split over expert groups of ep x etp and sharded over t d / (ep
  etp) by the distributed optimizer). Latent attention's down products and the latents' norms
  are whole on every rank of a tensor group, as megatron-core builds them with Transformer Engine
  (multi_latent_attention.py: parallel_mode "duplicated"), where the report divides them by t:
  the record's bytes are held with that share added back;
- activations of the first pipeline rank, within 5 %, wherever Megatron-LM's report applies: a
  GPT block (4h GELU MLP, heads = key/value heads, dropout), with sequence parallelism and
  selective recomputation (compute_activation_memory, Korthikanti et al.'s 34 s b h / t), or without
  sequence parallelism and without full recomputation, the head on another rank
  (compute_activation_memory_without_sp, which leaves attention's scores out as a fused kernel
  does, and adds 5 % for temporaries). The report counts every other run with the latter, which
  does not see sequence parallelism or full recomputation: those it does not apply to. Its SwiGLU, GQA and no-dropout blocks (the LLaMA records)
  it does not count (its own TODO); repipe's count of those is held to PyTorch's saved tensors
  (tests/activation_test.py).

Usage: megatron_arithmetic_test.py REPIPE SOURCE_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

from checks import check, finish

repipe, src = sys.argv[1], sys.argv[2]
data = json.load(open(os.path.join(src, "tests", "fixtures", "megatron", "arithmetic.json")))
records = data["records"]
check(len(records) > 900, "%d records of megatron-core %s" % (len(records), data["megatron-core"]))
check(sum(1 for r in records if r.get("ep")) > 300, "records of mixtures of experts")

tmp = tempfile.mkdtemp(prefix="repipe-megatron-")
cluster = os.path.join(tmp, "big.json")
# memory no record could fill: the records' runs are planned as given, fitting or not
json.dump({"name": "big", "device": {"peak_flops": 1e15, "memory_bytes": 1e15,
                                     "memory_bandwidth": 3e12},
           "per_node": 8, "node_bandwidth": 3e11, "network_bandwidth": 4e10}, open(cluster, "w"))

worst = {"flops": 0, "weights": 0, "activations": 0}
compared = {"activations": 0}
for r in records:
    cmd = [repipe, "plan", "--cluster", cluster, "--devices", str(r["world_size"]),
           "--global-batch", str(r["batch"]), "--transformer", r["spec"], "--tp", str(r["t"]),
           "--pp", str(r["p"]), "--cp", "1", "--vp", str(r["v"]), "--micro-batch", str(r["b"]),
           "--sequence-parallel", "on" if r["sp"] else "off",
           "--sharding", "optimizer" if r["do"] else "none", "--recompute", r["rc"],
           "--stages", "even", "--precision", "bf16", "--json", "-"]
    if r.get("ep"):
        cmd += ["--ep", str(r["ep"]), "--etp", str(r["etp"])]
    p = subprocess.run(cmd, capture_output=True, text=True)
    name = "%s t%d p%d v%d sp%d do%d %s" % (r["shape"], r["t"], r["p"], r["v"], r["sp"], r["do"],
                                            r["rc"]) + (" ep%d etp%d" % (r["ep"], r["etp"])
                                                        if r.get("ep") else "")
    if p.returncode:
        check(False, name + ": planned (%s)" % p.stderr.strip()[-300:])
        continue
    a = json.loads(p.stdout)
    same = (a["tensor_parallel"] == r["t"] and a["pipeline_parallel"] == r["p"] and
            a["data_parallel"] == r["data_parallel_size"] and a["virtual_stages"] == r["v"] and
            a["micro_batches"] == r["micro_batches"] and
            a["expert_parallel"] == r.get("ep", 1) and a["expert_tensor_parallel"] == r.get("etp", 1))
    check(same, name + ": the record's run")
    if not same:
        continue
    e = abs(a["flops_per_update"]["megatron"] - r["flops"]) / r["flops"]
    worst["flops"] = max(worst["flops"], e)
    check(e < 1e-9, "%s: FLOPs %.6g, Megatron-LM's %.6g" % (name, a["flops_per_update"]["megatron"],
                                                            r["flops"]))
    first = a["memory_by_rank"][0]
    want = r["weight_and_optimizer_bytes"]
    args = r["megatron_args"]
    if "--multi-latent-attention" in args and r["t"] > 1:
        h = int(args[args.index("--hidden-size") + 1])
        ql, kl, rope = (int(args[args.index(k) + 1]) for k in ("--q-lora-rank", "--kv-lora-rank",
                                                               "--qk-pos-emb-head-dim"))
        layers = int(args[args.index("--num-layers") + 1]) // r["p"]
        if "--mtp-num-layers" in args:  # (the report's most loaded rank holds them too)
            layers += int(args[args.index("--mtp-num-layers") + 1])
        dp = r["data_parallel_size"]
        per = 6 + 12 / dp if r["do"] else 18
        want += (1 - 1 / r["t"]) * layers * (h * (ql + kl + rope) + ql + kl) * per
    e = abs(first["weights_and_optimizer"] - want) / want
    worst["weights"] = max(worst["weights"], e)
    check(e < 0.01, "%s: weights and optimizer %.4g bytes, Megatron-LM's %.4g (%.4g)" % (
        name, first["weights_and_optimizer"], r["weight_and_optimizer_bytes"], want))
    gpt = r["shape"].startswith("gpt")
    applies = gpt and (r["activation_formula"] == "with_sp" or
                       (not r["sp"] and r["p"] > 1 and r["rc"] != "full"))
    if applies:
        compared["activations"] += 1
        e = abs(first["activations"] - r["activation_bytes"]) / r["activation_bytes"]
        worst["activations"] = max(worst["activations"], e)
        check(e < 0.05, "%s: activations %.4g bytes, Megatron-LM's %.4g (%s)" % (
            name, first["activations"], r["activation_bytes"], r["activation_formula"]))
print("worst relative differences: FLOPs %.2g, weights %.3f %%, activations %.2f %% (%d records "
      "where the report applies)" % (worst["flops"], 100 * worst["weights"],
                                     100 * worst["activations"], compared["activations"]))
check(compared["activations"] > 100, "activations compared on %d records" % compared["activations"])
finish()
