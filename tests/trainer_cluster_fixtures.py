"""Regenerates tests/fixtures/trainers/cluster_cases.json: what Megatron-LM's and torchtitan's own
code make of the settings `repipe plan --cluster ... --emit megatron|torchtitan` writes for
today's runs (GQA, SwiGLU, untied heads, sequence and context parallelism, the distributed
optimizer and FSDP, selective, full and some blocks' recomputation, fp8, interleaved stages cut
by a layout).
Run it where megatron-core 0.19 and torchtitan 0.3 are installed (a scratch environment, Python
3.12; neither is a dependency of repipe), with the repipe to record:

    python tests/trainer_cluster_fixtures.py build/repipe

tests/trainers_cluster_test.py checks the records in `make test` without either package.
Megatron-LM's validate_args asks the device's architecture only to warn about CUDA stream
settings and to check that grouped products (--moe-grouped-gemm) have kernels, and is told
Hopper's (9, compute capability 9.0); WORLD_SIZE is the plan's devices, as a launcher sets it."""
import contextlib
import importlib.metadata
import io
import json
import os
import subprocess
import sys
import tempfile
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "trainers", "cluster_cases.json")
sys.path.insert(0, HERE)
from trainer_fixtures import megatron_stages, settings_argv  # noqa: E402

QWEN3_235B = ("layers=94,hidden=4096,heads=64,kv_heads=4,head_dim=128,ffn=12288,seq=4096,"
              "vocab=151936,mlp=swiglu,norm=rmsnorm,position=rope,bias=none,tied=0,flash=1,"
              "dropout=0,qk_norm=1,experts=128,top_k=8,moe_ffn=1536")
# name, torchtitan's flavour of the model (None: Megatron-LM's reading only), the plan's arguments
CASES = [
    ("llama3-8b-fp8-fsdp", "8B",
     ["--cluster", "dgx-h100", "--devices", "8", "--global-batch", "128", "--transformer",
      "llama3-8b", "--tp", "1", "--pp", "1", "--sharding", "fsdp", "--precision", "fp8"]),
    ("llama3-70b-fp8-t4-p8-v5", "70B",
     ["--cluster", "dgx-h100", "--devices", "64", "--global-batch", "128", "--transformer",
      "llama3-70b", "--tp", "4", "--pp", "8", "--cp", "1", "--vp", "5", "--micro-batch", "1",
      "--sharding", "optimizer", "--precision", "fp8"]),
    ("llama3-405b-t8-p8-cp2-v8", "405B",
     ["--cluster", "dgx-h100", "--devices", "1024", "--global-batch", "512", "--transformer",
      "llama3-405b", "--tp", "8", "--pp", "8", "--cp", "2", "--vp", "8", "--micro-batch", "1",
      "--sharding", "optimizer"]),
    ("llama3-70b-selective-free", "70B",
     ["--cluster", "dgx-h100", "--devices", "128", "--global-batch", "256", "--transformer",
      "llama3-70b,flash=0", "--recompute", "selective"]),
    ("llama3-8b-blocks-50gb", "8B",
     ["--cluster", "dgx-h100", "--devices", "8", "--global-batch", "64", "--transformer",
      "llama3-8b", "--tp", "1", "--cp", "1", "--pp", "2", "--memory-size", "50e9",
      "--recompute", "blocks"]),
    ("llama3-8b-full-balanced", "8B",
     ["--cluster", "dgx-h100", "--devices", "32", "--global-batch", "64", "--transformer",
      "llama3-8b", "--tp", "2", "--pp", "4", "--recompute", "full", "--vp", "1"]),
    # mixtures of experts: the published H100 runs of Megatron-Bridge's summary, and repipe's
    # own plan for one; torchtitan reads the Qwen3 ones on its own Qwen3 MoE models
    # ("module:flavour"), whose shapes are the checkpoints'
    ("qwen3-30b-a3b-ep16", "qwen3:30B-A3B",
     ["--cluster", "dgx-h100", "--devices", "16", "--global-batch", "1024",
      "--transformer-config", os.path.join(HERE, "fixtures", "hf-configs", "qwen3-30b-a3b.json"),
      "--transformer", "seq=4096", "--tp", "1", "--pp", "1", "--cp", "1", "--vp", "1",
      "--micro-batch", "1", "--ep", "16", "--precision", "fp8"]),
    ("qwen3-235b-t2-p8-v4-ep32", "qwen3:235B-A22B",
     ["--cluster", "dgx-h100", "--devices", "256", "--global-batch", "8192", "--transformer",
      QWEN3_235B, "--tp", "2", "--pp", "8", "--cp", "1", "--vp", "4", "--micro-batch", "1",
      "--ep", "32", "--precision", "fp8", "--recompute", "none"]),
    ("deepseek-v3-t2-p8-v4-ep64", None,
     ["--cluster", "dgx-h100", "--devices", "1024", "--global-batch", "8192",
      "--transformer-config", os.path.join(HERE, "fixtures", "hf-configs", "deepseek-v3.json"),
      "--transformer", "seq=4096", "--tp", "2", "--pp", "8", "--cp", "1", "--vp", "4",
      "--micro-batch", "1", "--ep", "64", "--precision", "fp8", "--stages", "balanced"]),
    ("mixtral-capacity-1.25", None,
     ["--cluster", "dgx-h100", "--devices", "64", "--global-batch", "512",
      "--transformer-config", os.path.join(HERE, "fixtures", "hf-configs", "mixtral-8x7b.json"),
      "--transformer", "seq=4096", "--capacity", "1.25"]),
    ("mixtral-own-plan", None,
     ["--cluster", "dgx-h100", "--devices", "64", "--global-batch", "512",
      "--transformer-config", os.path.join(HERE, "fixtures", "hf-configs", "mixtral-8x7b.json"),
      "--transformer", "seq=4096"]),
]
MEGATRON_ARGS = [
    "num_layers", "hidden_size", "num_attention_heads", "group_query_attention",
    "num_query_groups", "kv_channels", "ffn_hidden_size", "swiglu", "normalization",
    "position_embedding_type", "add_bias_linear", "add_qkv_bias",
    "untie_embeddings_and_output_weights", "seq_length", "max_position_embeddings", "vocab_size",
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
    "virtual_pipeline_model_parallel_size", "data_parallel_size", "sequence_parallel",
    "use_distributed_optimizer", "use_megatron_fsdp", "data_parallel_sharding_strategy",
    "recompute_granularity", "recompute_method", "recompute_num_layers", "micro_batch_size",
    "global_batch_size", "bf16", "fp8", "fp8_recipe", "overlap_grad_reduce",
    "overlap_param_gather", "tp_comm_overlap", "attention_backend",
    "num_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
    "moe_layer_freq", "expert_model_parallel_size", "expert_tensor_parallel_size",
    "moe_token_dispatcher_type", "moe_grouped_gemm", "overlap_moe_expert_parallel_comm",
    "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
    "v_head_dim", "mtp_num_layers", "qk_layernorm", "moe_expert_capacity_factor",
    "moe_pad_expert_input_to_capacity"]


def emit(repipe, args, trainer, tmp):
    out = os.path.join(tmp, trainer + ".args")
    js = os.path.join(tmp, "plan.json")
    cmd = [repipe, "plan"] + args + ["--emit", trainer, "--emit-out", out, "--json", js]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit("%s failed: %s" % (" ".join(cmd), p.stderr))
    why = [l.strip()[1:-1] for l in p.stdout.splitlines() if l.startswith("  (")]
    return open(out).read(), json.load(open(js)), why


def megatron_reads(settings, devices):
    # as a launcher sets it: 1 for tensor and context parallelism (Megatron-LM asks it), unset
    # for FSDP (Megatron-LM refuses 1 there)
    if "--use-megatron-fsdp" in settings:
        os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    else:
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    os.environ["RANK"] = "0"
    os.environ["WORLD_SIZE"] = str(devices)
    import megatron.training.arguments as arguments
    arguments.get_device_arch_version = lambda: 9  # Hopper's, as on an H100: no GPU here
    # (and the grouped products' check of the same: an H100's compute capability)
    import torch
    torch.cuda.get_device_capability = lambda *a: (9, 0)
    sys.argv = ["pretrain_gpt.py"] + settings_argv(settings)
    with contextlib.redirect_stdout(io.StringIO()):
        args = arguments.validate_args(arguments.parse_args())
    rec = {k: (str(getattr(args, k)) if k == "attention_backend" else getattr(args, k, None))
           for k in MEGATRON_ARGS}
    if args.pipeline_model_parallel_layout is not None:
        rec["stages"] = megatron_stages(args)
    return rec


def titan_reads(settings, flavour):
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.pipeline_parallel import (
        _get_pp_rank_to_stage_indices_mapping, _split_module)
    import importlib
    import torch
    module, flavour = flavour.split(":") if ":" in flavour else ("llama3", flavour)
    model_registry = importlib.import_module("torchtitan.models." + module).model_registry
    # torchtitan's llama3_405b config turns on its Float8 converter, which refuses a machine
    # without an fp8 GPU, and it has no config for Qwen3-235B-A22B (a model flavour only): the
    # settings are read on its 70B and 30B-A3B configs (the same settings and checks), the
    # split made of the 405B and 235B models
    config = {"405B": "70b", "235B-A22B": "30b_a3b"}.get(flavour,
                                                         flavour.lower().replace("-", "_"))
    argv = ["--module", module, "--config", module + "_" + config]
    for line in settings.splitlines():
        argv += line.split(" ")
    cfg = ConfigManager().parse_args(argv)
    par = cfg.parallelism
    rec = {"tensor_parallel_degree": par.tensor_parallel_degree,
           "context_parallel_degree": par.context_parallel_degree,
           "pipeline_parallel_degree": par.pipeline_parallel_degree,
           "pipeline_parallel_schedule": par.pipeline_parallel_schedule,
           "pipeline_parallel_microbatch_size": par.pipeline_parallel_microbatch_size,
           "data_parallel_replicate_degree": par.data_parallel_replicate_degree,
           "data_parallel_shard_degree": par.data_parallel_shard_degree,
           "local_batch_size": cfg.training.local_batch_size,
           "global_batch_size": cfg.training.global_batch_size,
           "seq_len": cfg.training.seq_len,
           "mixed_precision_param": cfg.training.mixed_precision_param,
           "activation_checkpoint": type(cfg.activation_checkpoint).__qualname__,
           "expert_parallel_degree": par.expert_parallel_degree,
           "disable_cuda_graphs": cfg.training.disable_cuda_graphs}
    parts = par.module_fqns_per_model_part
    if parts:
        with torch.device("meta"):
            model = model_registry(flavour).model.build()
        pp = par.pipeline_parallel_degree
        rank_of = {}
        for r in range(pp):
            for s in _get_pp_rank_to_stage_indices_mapping(r, pp, par.pipeline_parallel_schedule,
                                                           len(parts)):
                rank_of[s] = r
        stages = []
        for s, names in enumerate(parts):
            part = _split_module(model, names)
            kept = []
            for name, child in part.named_children():
                if name == "layers":
                    kept += ["layers." + k for k in child.keys()]
                elif child is not None:
                    kept.append(name)
            stages.append({"stage": s, "rank": rank_of[s], "modules": kept})
        rec["stages"] = stages
    return rec


def main():
    warnings.filterwarnings("ignore")
    repipe = sys.argv[1]
    cases = []
    for name, flavour, args in CASES:
        case = {"name": name, "args": args, "torchtitan_flavour": flavour}
        for trainer in ("megatron", "torchtitan") if flavour else ("megatron",):
            with tempfile.TemporaryDirectory() as tmp:
                settings, plan, why = emit(repipe, args, trainer, tmp)
            reads = (megatron_reads(settings, plan["devices"]) if trainer == "megatron"
                     else titan_reads(settings, flavour))
            case[trainer] = {"settings": settings, "restrictions": why, "read": reads}
            case["plan"] = {k: plan[k] for k in (
                "tensor_parallel", "context_parallel", "pipeline_parallel", "data_parallel",
                "micro_batch", "micro_batches", "virtual_stages", "schedule", "sequence_parallel",
                "recompute", "recompute_blocks", "sharding", "precision", "overlap",
                "layers_per_stage",
                "transformer", "global_batch", "devices", "expert_parallel",
                "expert_tensor_parallel", "capacity")}
            print(name, trainer, "ok")
        cases.append(case)
    versions = {"megatron-core": importlib.metadata.version("megatron-core"),
                "torchtitan": importlib.metadata.version("torchtitan"),
                "torch": importlib.metadata.version("torch"), "python": sys.version.split()[0]}
    json.dump({"source": "tests/trainer_cluster_fixtures.py", "versions": versions,
               "licences": {"megatron-core": "Apache 2.0", "torchtitan": "BSD 3-Clause"},
               "cases": cases}, open(OUT, "w"), indent=1, default=str)
    print("wrote", OUT)


if __name__ == "__main__":
    main()
