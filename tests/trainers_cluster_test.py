"""The settings `repipe plan --cluster ... --emit megatron|torchtitan` writes, held to what
Megatron-LM's and torchtitan's own code made of them (tests/fixtures/trainers/cluster_cases.json,
recorded by tests/trainer_cluster_fixtures.py where megatron-core and torchtitan are installed).

For every case repipe writes today exactly the settings that were read back (else the records
are about another writer: regenerate them), and what the trainers read carries every feature of
the plan: its tensor, context, pipeline, virtual and data-parallel sizes, sequence parallelism,
sharding, recomputation, precision, the model's GQA, SwiGLU, norm, positions and untied head,
and its stages (Megatron-LM's layout and torchtitan's own split of its Llama 3 model give every
rank the plan's layers, each once). What a trainer cannot express is said beside the settings.

Usage: trainers_cluster_test.py REPIPE SOURCE_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

from checks import check, finish

repipe, src = sys.argv[1], sys.argv[2]
data = json.load(open(os.path.join(src, "tests", "fixtures", "trainers", "cluster_cases.json")))
tmp = tempfile.mkdtemp(prefix="repipe-cluster-trainers-")


def emit(args, trainer):
    out = os.path.join(tmp, trainer + ".args")
    p = subprocess.run([repipe, "plan"] + args + ["--emit", trainer, "--emit-out", out],
                       capture_output=True, text=True)
    if p.returncode:
        return None, []
    why = [l.strip()[1:-1] for l in p.stdout.splitlines() if l.startswith("  (")]
    return open(out).read(), why


def spec_of(text):
    return dict(kv.split("=") for kv in text.split(","))


def chunks(plan):
    """The plan's chunks in order: (rank, [layer kinds: 'E', block index, 'L'])."""
    L = int(spec_of(plan["transformer"])["layers"])
    counts = plan["layers_per_stage"] or [L + 2]
    out, at = [], 0
    for c, n in enumerate(counts):
        kinds = ["E" if l == 0 else "L" if l == L + 1 else l - 1 for l in range(at, at + n)]
        out.append((c % plan["pipeline_parallel"], kinds))
        at += n
    return out


check(len(data["cases"]) >= 5, "%d cases, megatron-core %s, torchtitan %s" % (
    len(data["cases"]), data["versions"]["megatron-core"], data["versions"]["torchtitan"]))
for case in data["cases"]:
    name, plan = case["name"], case["plan"]
    shape = spec_of(plan["transformer"])
    for trainer in ("megatron", "torchtitan") if "torchtitan" in case else ("megatron",):
        settings, why = emit(case["args"], trainer)
        check(settings == case[trainer]["settings"],
              "%s, %s: repipe writes the settings that were read back" % (name, trainer))
        check(why == case[trainer]["restrictions"], "%s, %s: the same restrictions said" % (
            name, trainer))
    m = case["megatron"]["read"]
    want = {"tensor_model_parallel_size": plan["tensor_parallel"],
            "context_parallel_size": plan["context_parallel"],
            "pipeline_model_parallel_size": plan["pipeline_parallel"],
            "virtual_pipeline_model_parallel_size":
                plan["virtual_stages"] if plan["virtual_stages"] > 1 else None,
            "data_parallel_size": plan["data_parallel"],
            "sequence_parallel": plan["sequence_parallel"],
            "use_distributed_optimizer": plan["sharding"] != "none",
            "use_megatron_fsdp": plan["sharding"] == "fsdp",
            "recompute_granularity": {"none": None, "blocks": "full"}.get(plan["recompute"],
                                                                         plan["recompute"]),
            "fp8": "hybrid" if plan["precision"] == "fp8" else None,
            "micro_batch_size": plan["micro_batch"], "global_batch_size": plan["global_batch"],
            "num_layers": int(shape["layers"]), "hidden_size": int(shape["hidden"]),
            "num_attention_heads": int(shape["heads"]),
            "num_query_groups": int(shape["kv_heads"]),
            "group_query_attention": shape["kv_heads"] != shape["heads"],
            "ffn_hidden_size": int(shape["ffn"]), "swiglu": shape["mlp"] == "swiglu",
            "normalization": "RMSNorm" if shape["norm"] == "rmsnorm" else "LayerNorm",
            "position_embedding_type": "rope" if shape["position"] == "rope" else "learned_absolute",
            "add_bias_linear": shape["bias"] == "all",
            "untie_embeddings_and_output_weights": shape["tied"] == "0",
            "seq_length": int(shape["seq"]), "bf16": True}
    if "experts" in shape:  # a mixture: its shape, which blocks, its expert groups
        layers, dense = int(shape["layers"]), int(shape["dense_first"])
        every = int(shape["moe_every"])
        pattern = [int(i >= dense and i % every == 0) for i in range(layers)]
        shared = int(shape["shared_ffn"])
        want.update({"num_experts": int(shape["experts"]), "moe_router_topk": int(shape["top_k"]),
                     "moe_ffn_hidden_size": int(shape["moe_ffn"]),
                     "moe_shared_expert_intermediate_size": shared or None,
                     "expert_model_parallel_size": plan["expert_parallel"],
                     "expert_tensor_parallel_size": plan["expert_tensor_parallel"],
                     "moe_token_dispatcher_type": "alltoall",
                     "moe_expert_capacity_factor": plan["capacity"] or None,
                     "moe_pad_expert_input_to_capacity": plan["capacity"] > 0})
        got = m["moe_layer_freq"]
        check((got if isinstance(got, list) else [int(i % got == 0) for i in range(layers)]) ==
              pattern, "%s: Megatron-LM's mixtures in the plan's blocks" % name)
    if "kv_lora" in shape:  # latent attention
        want.update({"multi_latent_attention": True, "q_lora_rank": int(shape["q_lora"]) or None,
                     "kv_lora_rank": int(shape["kv_lora"]), "qk_head_dim": int(shape["head_dim"]),
                     "qk_pos_emb_head_dim": int(shape["rope_dim"]),
                     "v_head_dim": int(shape["v_dim"])})
        del want["num_query_groups"]  # (latent attention has no groups)
    if "mtp" in shape:
        want["mtp_num_layers"] = int(shape["mtp"])
    want["qk_layernorm"] = shape.get("qk_norm") == "1"
    if plan["recompute"] == "blocks":  # the first n blocks of each chunk (its block method)
        want.update({"recompute_method": "block",
                     "recompute_num_layers": plan["recompute_blocks"]})
    for k, v in want.items():
        check(m[k] == v, "%s: Megatron-LM read %s %r (the plan's %r)" % (name, k, m[k], v))
    if plan["pipeline_parallel"] > 1:
        # Megatron-LM's stages, virtual stage by virtual stage and rank by rank: chunk v p + r
        got = [(s["pp_rank"], (["E"] if s["embedding"] else []) + s["layers"] +
                (["L"] if s["loss"] else [])) for s in m["stages"]]
        check(got == chunks(plan), "%s: Megatron-LM's layout puts every layer where the plan "
              "does" % name)
        mtp = [s.get("mtp", 0) for s in m["stages"]]
        check(sum(mtp) == int(shape.get("mtp", 0)) and (not sum(mtp) or m["stages"][
            mtp.index(max(mtp))]["loss"]), "%s: multi-token prediction beside the loss" % name)
    if "torchtitan" not in case:
        continue
    t = case["torchtitan"]["read"]
    sharded = plan["sharding"] != "none" and plan["data_parallel"] > 1
    want = {"tensor_parallel_degree": plan["tensor_parallel"],
            "context_parallel_degree": plan["context_parallel"],
            "pipeline_parallel_degree": plan["pipeline_parallel"],
            "data_parallel_shard_degree": plan["data_parallel"] if sharded else 1,
            "data_parallel_replicate_degree": 1 if sharded else plan["data_parallel"],
            "global_batch_size": plan["global_batch"],
            "local_batch_size": plan["micro_batch"] * plan["micro_batches"],
            "seq_len": int(shape["seq"]),
            "activation_checkpoint": {"none": "NoneType", "full": "FullAC.Config",
                                      "blocks": "FullAC.Config",  # (every block: said)
                                      "selective": "SelectiveAC.Config"}[plan["recompute"]]}
    if plan.get("expert_parallel", 1) > 1:
        # torchtitan's own Qwen3 MoE models; its CUDA graphs refuse the all-to-all dispatcher
        want.update({"expert_parallel_degree": plan["expert_parallel"],
                     "disable_cuda_graphs": True})
    if plan["pipeline_parallel"] > 1:
        want["pipeline_parallel_schedule"] = ("Interleaved1F1B" if plan["virtual_stages"] > 1
                                              else "1F1B")
        want["pipeline_parallel_microbatch_size"] = plan["micro_batch"]
    for k, v in want.items():
        check(t[k] == v, "%s: torchtitan read %s %r (the plan's %r)" % (name, k, t[k], v))
    if plan["pipeline_parallel"] > 1:
        names = [(s["rank"], s["modules"]) for s in t["stages"]]
        mine = [(r, [{"E": "tok_embeddings", "L": None}.get(k, "layers.%s" % k) for k in kinds])
                for r, kinds in chunks(plan)]
        mine = [(r, [x for x in ms if x] + (["norm", "lm_head"] if "L" in kinds else []))
                for (r, ms), (_, kinds) in zip(mine, chunks(plan))]
        check(names == mine, "%s: torchtitan's split keeps each stage's modules on its rank" % name)
    restricted = case["torchtitan"]["restrictions"]
    check(("fp8" in " ".join(restricted)) == (plan["precision"] == "fp8") and
          ("ZeRO-1" in " ".join(restricted)) == (plan["sharding"] == "optimizer" and
                                                 plan["data_parallel"] > 1),
          "%s: torchtitan's restrictions said where they apply" % name)
finish()
