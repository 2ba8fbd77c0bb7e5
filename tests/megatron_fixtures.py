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
    for name, spec, model, g in grid():
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
