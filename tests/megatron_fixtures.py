"""Regenerates tests/fixtures/megatron/arithmetic.json: Megatron-LM's own arithmetic run on
argument namespaces its own parser made, over a grid of GPT and LLaMA shapes, tensor sizes 1/2/4/8,
sequence parallelism, the distributed optimizer, recomputation and pipeline and virtual sizes:

- num_floating_point_operations (megatron/training/training.py): FLOPs of a global batch;
- compute_weight_and_optimizer_memory (megatron/training/theoretical_memory_usage.py): the bytes of
  weights and optimizer state on the most loaded rank (the first pipeline stage's);
- compute_activation_memory (sequence parallelism with selective recomputation) or
  compute_activation_memory_without_sp (everything else), as report_theoretical_memory chooses.

Run it where megatron-core is installed (not a dependency of repipe: a scratch environment; 0.19
asks for Python 3.12), then `make test` holds repipe to the records without it
(tests/megatron_arithmetic_test.py):

    python tests/megatron_fixtures.py

No GPU is needed: validate_args asks the device's architecture only to warn about CUDA stream
settings, and is told Hopper's (9); WORLD_SIZE and CUDA_DEVICE_MAX_CONNECTIONS are set as a
launcher sets them."""
import importlib.metadata
import itertools
import json
import os
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "megatron", "arithmetic.json")

# (name, repipe's spec, Megatron-LM's model arguments). Biases and learned positions are left out
# (--disable-bias-linear, rope): Megatron-LM's memory report counts neither, and repipe does; the
# GPT shapes keep GPT-2's GELU MLP of 4h, LayerNorm, a tied head and dropout, the LLaMA ones
# SwiGLU, RMSNorm, an untied head, GQA and no dropout.
SHAPES = [
    ("gpt-1.7b", "layers=24,hidden=2304,heads=24,seq=2048,vocab=51200,bias=none,position=rope,flash=1",
     ["--num-layers", "24", "--hidden-size", "2304", "--num-attention-heads", "24",
      "--seq-length", "2048", "--vocab-size", "51200"]),
    ("gpt-18b", "layers=40,hidden=6144,heads=48,seq=2048,vocab=51200,bias=none,position=rope,flash=1",
     ["--num-layers", "40", "--hidden-size", "6144", "--num-attention-heads", "48",
      "--seq-length", "2048", "--vocab-size", "51200"]),
    ("gpt3-175b", "gpt3-175b,bias=none,position=rope,flash=1",
     ["--num-layers", "96", "--hidden-size", "12288", "--num-attention-heads", "96",
      "--seq-length", "2048", "--vocab-size", "51200"]),
    ("llama3-8b", "llama3-8b",
     ["--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "32",
      "--group-query-attention", "--num-query-groups", "8", "--ffn-hidden-size", "14336",
      "--swiglu", "--normalization", "RMSNorm", "--untie-embeddings-and-output-weights",
      "--seq-length", "8192", "--vocab-size", "128256", "--hidden-dropout", "0",
      "--attention-dropout", "0"]),
    ("llama3-70b", "llama3-70b",
     ["--num-layers", "80", "--hidden-size", "8192", "--num-attention-heads", "64",
      "--group-query-attention", "--num-query-groups", "8", "--ffn-hidden-size", "28672",
      "--swiglu", "--normalization", "RMSNorm", "--untie-embeddings-and-output-weights",
      "--seq-length", "8192", "--vocab-size", "128256", "--hidden-dropout", "0",
      "--attention-dropout", "0"]),
    ("llama2-7b", "llama2-7b",
     ["--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "32",
      "--ffn-hidden-size", "11008", "--swiglu", "--normalization", "RMSNorm",
      "--untie-embeddings-and-output-weights", "--seq-length", "4096", "--vocab-size", "32000",
      "--hidden-dropout", "0", "--attention-dropout", "0"]),
]
COMMON = ["--disable-bias-linear", "--position-embedding-type", "rope", "--bf16",
          "--make-vocab-size-divisible-by", "128"]

# Mixtures of experts: (name, repipe's spec, Megatron-LM's model arguments, dense first blocks).
# Mixtral 8x7B's shape and Qwen3-30B-A3B's at 8 blocks (their experts, widths and routing as
# released), a shape with a shared expert and a mixture every other block (Megatron-LM's
# --moe-layer-freq 2), and DeepSeek's dense first blocks (as a --moe-layer-freq pattern).
LLAMA_KIND = ["--swiglu", "--normalization", "RMSNorm", "--untie-embeddings-and-output-weights",
              "--hidden-dropout", "0", "--attention-dropout", "0"]
# DeepSeek-V3's attention at 8 blocks (latent attention), as repipe's shape and as Megatron-LM's
DSV3_SHAPE = ("layers=8,hidden=7168,heads=128,ffn=18432,seq=4096,vocab=129280,mlp=swiglu,"
              "norm=rmsnorm,position=rope,bias=none,tied=0,flash=1,dropout=0,kv_lora=512,"
              "q_lora=1536,head_dim=128,rope_dim=64,v_dim=128")
DSV3_ARGS = ["--num-layers", "8", "--hidden-size", "7168", "--num-attention-heads", "128",
             "--ffn-hidden-size", "18432", "--seq-length", "4096", "--vocab-size", "129280",
             "--multi-latent-attention", "--q-lora-rank", "1536", "--kv-lora-rank", "512",
             "--qk-head-dim", "128", "--qk-pos-emb-head-dim", "64", "--v-head-dim", "128"]
MOE_SHAPES = [
    ("mixtral-8x7b-l8", "layers=8,hidden=4096,heads=32,kv_heads=8,ffn=14336,seq=4096,vocab=32000,"
     "mlp=swiglu,norm=rmsnorm,position=rope,bias=none,tied=0,flash=1,dropout=0,experts=8,top_k=2",
     ["--num-layers", "8", "--hidden-size", "4096", "--num-attention-heads", "32",
      "--group-query-attention", "--num-query-groups", "8", "--ffn-hidden-size", "14336",
      "--seq-length", "4096", "--vocab-size", "32000", "--num-experts", "8",
      "--moe-router-topk", "2"] + LLAMA_KIND, 0),
    ("qwen3-moe-l8", "layers=8,hidden=2048,heads=32,kv_heads=4,head_dim=128,ffn=6144,seq=4096,"
     "vocab=151936,mlp=swiglu,norm=rmsnorm,position=rope,bias=none,tied=0,flash=1,dropout=0,"
     "experts=128,top_k=8,moe_ffn=768",
     ["--num-layers", "8", "--hidden-size", "2048", "--num-attention-heads", "32",
      "--group-query-attention", "--num-query-groups", "4", "--kv-channels", "128",
      "--ffn-hidden-size", "6144", "--seq-length", "4096", "--vocab-size", "151936",
      "--num-experts", "128", "--moe-router-topk", "8", "--moe-ffn-hidden-size", "768"] +
     LLAMA_KIND, 0),
    ("shared-every2-l8", "layers=8,hidden=2048,heads=16,kv_heads=16,ffn=5632,seq=2048,vocab=50000,"
     "mlp=swiglu,norm=rmsnorm,position=rope,bias=none,tied=0,flash=1,dropout=0,experts=16,top_k=4,"
     "moe_ffn=1408,shared_ffn=2816,moe_every=2",
     ["--num-layers", "8", "--hidden-size", "2048", "--num-attention-heads", "16",
      "--ffn-hidden-size", "5632", "--seq-length", "2048", "--vocab-size", "50000",
      "--num-experts", "16", "--moe-router-topk", "4", "--moe-ffn-hidden-size", "1408",
      "--moe-shared-expert-intermediate-size", "2816", "--moe-layer-freq", "2"] + LLAMA_KIND, 0),
    ("dense-first-l8", "layers=8,hidden=2048,heads=16,kv_heads=16,ffn=5632,seq=2048,vocab=50000,"
     "mlp=swiglu,norm=rmsnorm,position=rope,bias=none,tied=0,flash=1,dropout=0,experts=16,top_k=2,"
     "moe_ffn=1408,shared_ffn=1408,dense_first=2",
     ["--num-layers", "8", "--hidden-size", "2048", "--num-attention-heads", "16",
      "--ffn-hidden-size", "5632", "--seq-length", "2048", "--vocab-size", "50000",
      "--num-experts", "16", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "1408",
      "--moe-shared-expert-intermediate-size", "1408", "--moe-layer-freq", "([0]*2+[1]*6)"] +
     LLAMA_KIND, 2),
    # DeepSeek-V3's blocks at 8 (latent attention, 256 experts of 2048, 8 a token, a shared expert;
    # with its dense first block and multi-token prediction on one pipeline rank, without them
    # on several)
    ("deepseek-v3-l8", DSV3_SHAPE + ",mtp=1,experts=256,top_k=8,moe_ffn=2048,shared_ffn=2048,"
     "dense_first=1",
     DSV3_ARGS + ["--mtp-num-layers", "1", "--num-experts", "256", "--moe-router-topk", "8",
                  "--moe-ffn-hidden-size", "2048", "--moe-shared-expert-intermediate-size",
                  "2048", "--moe-layer-freq", "([0]*1+[1]*7)"] + LLAMA_KIND, 1),
    ("mla-moe-l8", DSV3_SHAPE + ",experts=256,top_k=8,moe_ffn=2048,shared_ffn=2048",
     DSV3_ARGS + ["--num-experts", "256", "--moe-router-topk", "8", "--moe-ffn-hidden-size",
                  "2048", "--moe-shared-expert-intermediate-size", "2048"] + LLAMA_KIND, 0),
]


def grid():
    for (name, spec, model), t, p, v, sp, do, rc in itertools.product(
            SHAPES, (1, 2, 4, 8), (1, 2, 4), (1, 2), (False, True), (False, True),
            ("none", "selective", "full")):
        layers = int(model[model.index("--num-layers") + 1])
        if (sp and t == 1) or (v > 1 and (p == 1 or layers % (p * v))):
            continue
        if rc == "full" and (do or v > 1):  # (fewer points where the report does not apply)
            continue
        d = 2
        b = 1
        batch = b * d * 2 * p  # two rounds of the pipeline a replica
        yield name, spec, model, dict(t=t, p=p, v=v, sp=sp, do=do, rc=rc, d=d, b=b, batch=batch)


def moe_grid():
    """Tensor 1/2/4, pipeline 1/2/4, expert groups 1/2/4/8 with expert tensor groups of 1 or t,
    over 4 replicas; with tensor groups, sequence parallel (Megatron-LM's rule for experts).
    Dense first blocks on one pipeline rank only: Megatron-LM's report spreads every block's
    parameters evenly over the pipeline, where the first rank holds the dense ones."""
    for (name, spec, model, dense), t, p, ep, etp_t, do in itertools.product(
            MOE_SHAPES, (1, 2, 4), (1, 2, 4), (1, 2, 4, 8), (False, True), (False, True)):
        etp = t if etp_t else 1
        d = 4
        experts = int(model[model.index("--num-experts") + 1])
        if (etp_t and t == 1) or experts % ep or (t * d) % (ep * etp) or (dense and p > 1):
            continue
        yield name, spec, model, dict(t=t, p=p, v=1, sp=t > 1, do=do, rc="none", d=d, b=1,
                                      batch=d * 2 * p, ep=ep, etp=etp)


def main():
    warnings.filterwarnings("ignore")
    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    os.environ["RANK"] = "0"
    import megatron.training.arguments as arguments
    arguments.get_device_arch_version = lambda: 9  # Hopper's, as on an H100: no GPU here
    from megatron.training.arguments import parse_args, validate_args
    from megatron.training.training import num_floating_point_operations
    from megatron.training import theoretical_memory_usage as tm
    from megatron.training.vocab_utils import calculate_padded_vocab_size
    import contextlib
    import io
    records = []
    for name, spec, model, g in itertools.chain(grid(), moe_grid()):
        argv = model + COMMON + [
            "--max-position-embeddings", model[model.index("--seq-length") + 1],
            "--tensor-model-parallel-size", str(g["t"]), "--pipeline-model-parallel-size", str(g["p"]),
            "--micro-batch-size", str(g["b"]), "--global-batch-size", str(g["batch"])]
        if g["v"] > 1:
            argv += ["--num-virtual-stages-per-pipeline-rank", str(g["v"])]
        if g["sp"]:
            argv += ["--sequence-parallel"]
        if g["do"]:
            argv += ["--use-distributed-optimizer"]
        if g.get("ep"):
            argv += ["--expert-model-parallel-size", str(g["ep"]),
                     "--expert-tensor-parallel-size", str(g["etp"])]
        if g["rc"] == "selective":
            argv += ["--recompute-granularity", "selective"]
        elif g["rc"] == "full":
            argv += ["--recompute-granularity", "full", "--recompute-method", "uniform",
                     "--recompute-num-layers", "1"]
        os.environ["WORLD_SIZE"] = str(g["t"] * g["p"] * g["d"])
        sys.argv = ["pretrain_gpt.py"] + argv
        with contextlib.redirect_stdout(io.StringIO()):
            args = validate_args(parse_args())
            args.padded_vocab_size = calculate_padded_vocab_size(
                args.vocab_size, args.make_vocab_size_divisible_by,
                args.tensor_model_parallel_size, logging_enabled=False)
            m = g["batch"] // (g["b"] * args.data_parallel_size)
            flops = num_floating_point_operations(args, g["batch"])
            weights = tm.compute_weight_and_optimizer_memory(args)
            with_sp = args.sequence_parallel and args.recompute_granularity == "selective"
            acts = (tm.compute_activation_memory if with_sp else
                    tm.compute_activation_memory_without_sp)(args, num_microbatches=m)
        records.append({"shape": name, "spec": spec, "megatron_args": argv,
                        "world_size": int(os.environ["WORLD_SIZE"]),
                        "data_parallel_size": args.data_parallel_size, "micro_batches": m,
                        "padded_vocab_size": args.padded_vocab_size, **g,
                        "flops": flops, "weight_and_optimizer_bytes": weights,
                        "activation_bytes": acts,
                        "activation_formula": "with_sp" if with_sp else "without_sp"})
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    json.dump({"source": "tests/megatron_fixtures.py",
               "megatron-core": importlib.metadata.version("megatron-core"),
               "licence": "megatron-core: Apache 2.0 (the records are its outputs, not its code)",
               "python": sys.version.split()[0], "records": records},
              open(OUT, "w"), indent=1)
    print("wrote", OUT, len(records), "records")


if __name__ == "__main__":
    main()
