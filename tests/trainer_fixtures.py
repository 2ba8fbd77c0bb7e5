"""Regenerates tests/fixtures/trainers/: what torchtitan's and Megatron-LM's own code make of
the settings `repipe plan --emit` writes. Run it where those are installed (not repipe's
dependencies: a scratch environment, docs/planner.md "Plans for torchtitan and Megatron-LM"):

    python tests/trainer_fixtures.py profiles DIR   # repipe.torch.profile of torchtitan's Llama 3
    python tests/trainer_fixtures.py read REPIPE    # every case: repipe's output, and their reading

`profiles` needs torchtitan and repipe's python package on the path; `read` needs torchtitan
and megatron-core (0.19 asks for Python 3.12: `read --trainer torchtitan` and
`read --trainer megatron` may run in two environments; each keeps the other's records).
tests/trainers_test.py checks the records in CI, without either package."""
import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "fixtures", "trainers")

# The plans: torchtitan's Llama 3 debug model (dim 256, 16 heads, vocabulary 2048) of 8, 16
# and 30 layers; one of vocabulary 32768, whose heavy head makes repipe replicate a stage.
PROFILES = {"llama8": (8, None), "llama16": (16, None), "llama30": (30, None),
            "llama8-v32k": (8, 32768)}
CASES = [
    ("llama8-pp2", "llama8", ["--machines", "2", "--global-batch", "16", "--pp", "2"]),
    ("llama16-pp4", "llama16", ["--machines", "4", "--global-batch", "32", "--pp", "4"]),
    ("llama16-pp4-interleaved", "llama16",
     ["--machines", "4", "--global-batch", "32", "--pp", "4", "--schedules", "interleaved-1f1b"]),
    ("llama16-pp8", "llama16", ["--machines", "8", "--global-batch", "64", "--pp", "8"]),
    ("llama30-pp2", "llama30", ["--machines", "2", "--global-batch", "8", "--pp", "2"]),
    ("llama30-pp4", "llama30", ["--machines", "4", "--global-batch", "32", "--pp", "4"]),
    ("llama30-pp8", "llama30", ["--machines", "8", "--global-batch", "64", "--pp", "8"]),
    ("llama8-v32k-replicated", "llama8-v32k", ["--machines", "3", "--global-batch", "12"]),
]
TRAINERS = ("torchtitan", "megatron")


def profiles(out):
    import torch
    import repipe.torch as rt
    from torchtitan.models.llama3 import model_registry

    class CausalSDPA(torch.nn.Module):
        """FlexAttention's call with a causal mask: its BlockMask is built by the trainer
        from the batch, not by the model, so a profile of one input runs this instead."""

        def forward(self, q, k, v, *, attention_masks=None, scale=None, enable_gqa=False, **kw):
            o = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                scale=scale, enable_gqa=enable_gqa)
            return o.transpose(1, 2)

    os.makedirs(out, exist_ok=True)
    for name, (layers, vocab) in PROFILES.items():
        model = llama(model_registry, layers, vocab)
        for blk in model.layers.values():
            blk.attention.inner_attention = CausalSDPA()
        x = torch.randint(0, model.tok_embeddings.num_embeddings, (2, 128))
        rt.profile(model, x, out=os.path.join(out, name + ".txt"), repeat=3)
        print("wrote", os.path.join(out, name + ".txt"))


def llama(model_registry, layers, vocab=None, meta=False):
    import torch
    cfg = model_registry("debugmodel").model
    if vocab:
        cfg.vocab_size = vocab
        cfg.tok_embeddings.num_embeddings = vocab
        cfg.lm_head.out_features = vocab
    cfg.layers = [copy.deepcopy(cfg.layers[i % len(cfg.layers)]) for i in range(layers)]
    torch.manual_seed(0)
    if meta:
        with torch.device("meta"):
            return cfg.build()
    model = cfg.build()
    if hasattr(model, "init_weights"):
        model.init_weights()
    return model


def emit(repipe, profile, args, trainer, tmp):
    out = os.path.join(tmp, trainer + ".args")
    cmd = [repipe, "plan", "--profile", profile] + args + ["--emit", trainer, "--emit-out", out]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit("%s failed: %s" % (" ".join(cmd), p.stderr))
    return out, open(out).read(), json.load(open(out + ".config.json"))


def titan_reads(settings, layers, csv):
    """torchtitan's configuration manager on the settings, and its own split of its Llama 3
    model (on the meta device) by them: each stage's kept modules and its rank."""
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed.pipeline_parallel import (
        _get_pp_rank_to_stage_indices_mapping, _split_module)
    from torchtitan.models.llama3 import model_registry
    argv = ["--module", "llama3", "--config", "llama3_debugmodel"]
    for line in settings.splitlines():
        argv += line.split(" ")
    cfg = ConfigManager().parse_args(argv)
    par = cfg.parallelism
    rec = {"pipeline_parallel_degree": par.pipeline_parallel_degree,
           "pipeline_parallel_schedule": par.pipeline_parallel_schedule,
           "pipeline_parallel_schedule_csv": os.path.basename(par.pipeline_parallel_schedule_csv or ""),
           "pipeline_parallel_microbatch_size": par.pipeline_parallel_microbatch_size,
           "tensor_parallel_degree": par.tensor_parallel_degree,
           "data_parallel_replicate_degree": par.data_parallel_replicate_degree,
           "data_parallel_shard_degree": par.data_parallel_shard_degree,
           "local_batch_size": cfg.training.local_batch_size,
           "global_batch_size": cfg.training.global_batch_size,
           "activation_checkpoint": type(cfg.activation_checkpoint).__qualname__}
    model = llama(model_registry, layers, meta=True)
    parts = par.module_fqns_per_model_part
    if parts is None:  # no pipeline: one part, everything
        rec["stages"] = [{"stage": 0, "rank": 0, "modules": kept(model)}]
        return rec
    pp = par.pipeline_parallel_degree
    rank_of = {}
    for r in range(pp):
        for s in _get_pp_rank_to_stage_indices_mapping(r, pp, par.pipeline_parallel_schedule,
                                                       len(parts)):
            rank_of[s] = r
    rec["stages"] = [{"stage": s, "rank": rank_of[s], "modules": kept(_split_module(model, names))}
                     for s, names in enumerate(parts)]
    return rec


def kept(model):
    """The modules a stage's model part holds: its children that are not None, and the
    entries of its layer container."""
    names = []
    for name, child in model.named_children():
        if name == "layers":
            names += ["layers." + k for k in (child.keys() if hasattr(child, "keys")
                                              else map(str, range(len(child))))]
        elif child is not None:
            names.append(name)
    return names


def settings_argv(settings):
    """The lines of repipe's Megatron-LM settings as a command line's words."""
    given = []
    for line in settings.splitlines():
        opt, _, value = line.partition(" ")
        given += [opt] + ([value] if value else [])
    return given


def megatron_stages(args):
    """The stages of megatron-core's layout of the parsed arguments (args'
    pipeline_model_parallel_layout, a string or its object): per pipeline rank and virtual
    stage, whether it holds the embedding and the loss, and its transformer layers' ids (and
    its multi-token prediction blocks, where there are)."""
    from megatron.core import parallel_state
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout)
    pp = args.pipeline_model_parallel_size
    layout = args.pipeline_model_parallel_layout
    if isinstance(layout, str):
        layout = PipelineParallelLayerLayout.from_str(layout, pp)
    layout.validate_layer_layout(args.num_layers, getattr(args, "mtp_num_layers", None))
    vp = args.virtual_pipeline_model_parallel_size or 1
    parallel_state.set_virtual_pipeline_model_parallel_world_size(vp if vp > 1 else None)
    return [
        {"pp_rank": r, "vp_stage": v,
         "embedding": LayerType.embedding in layout.layout[r][v],
         "loss": LayerType.loss in layout.layout[r][v],
         "layers": layout.get_layer_id_list(vp_stage=v, pp_rank=r),
         **({"mtp": layout.layout[r][v].count(LayerType.mtp)}
            if getattr(args, "mtp_num_layers", None) else {})}
        for v in range(vp) for r in range(pp)]


def megatron_reads(settings, dp):
    """megatron-core's argument parsing and validation on the settings (with a model's own
    sizes), and its layout's stages (megatron_stages)."""
    from megatron.training.arguments import parse_args, validate_args
    given = settings_argv(settings)
    tp = int(given[given.index("--tensor-model-parallel-size") + 1])
    pp = int(given[given.index("--pipeline-model-parallel-size") + 1])
    # the world: the data-parallel size is what the ranks leave (repipe's replicas)
    os.environ["WORLD_SIZE"] = str(tp * pp * dp)
    os.environ["RANK"] = "0"
    sys.argv = ["pretrain_gpt.py", "--hidden-size", "256", "--num-attention-heads", "16",
                "--seq-length", "128", "--max-position-embeddings", "128"] + given
    args = validate_args(parse_args())
    rec = {"tensor_model_parallel_size": args.tensor_model_parallel_size,
           "pipeline_model_parallel_size": args.pipeline_model_parallel_size,
           "virtual_pipeline_model_parallel_size": args.virtual_pipeline_model_parallel_size,
           "data_parallel_size": args.data_parallel_size,
           "micro_batch_size": args.micro_batch_size,
           "global_batch_size": args.global_batch_size,
           "num_layers": args.num_layers,
           "recompute_granularity": args.recompute_granularity,
           "use_distributed_optimizer": args.use_distributed_optimizer}
    if args.pipeline_model_parallel_layout is None:
        rec["stages"] = [{"pp_rank": 0, "vp_stage": 0, "embedding": True, "loss": True,
                          "layers": list(range(args.num_layers))}]
        return rec
    rec["stages"] = megatron_stages(args)
    return rec


def read(repipe, trainers):
    path = os.path.join(FIX, "cases.json")
    old = json.load(open(path)) if os.path.exists(path) else {"cases": []}
    records = {c["name"]: c for c in old["cases"]}
    versions = old.get("versions", {})
    import torch
    for t in trainers:
        versions["torch (%s)" % t] = torch.__version__
        if t == "torchtitan":
            import torchtitan
            versions["torchtitan"] = getattr(torchtitan, "__version__", None) or pkg("torchtitan")
        else:
            versions["megatron-core"] = pkg("megatron-core")
        versions["python (%s)" % t] = sys.version.split()[0]
    for name, prof, args in CASES:
        case = records.setdefault(name, {"name": name})
        case.update({"profile": prof + ".txt", "args": args})
        layers = PROFILES[prof][0]
        for t in trainers:
            with tempfile.TemporaryDirectory() as tmp:
                out, settings, cfg = emit(repipe, os.path.join(FIX, prof + ".txt"), args, t, tmp)
                reads = titan_reads(settings, layers, out) if t == "torchtitan" else \
                    megatron_reads(settings, cfg.get("replication_factor", 1))
            case[t] = {"settings": settings.replace(tmp + "/", ""), "config": cfg, "read": reads}
            print(name, t, "ok")
    json.dump({"source": "tests/trainer_fixtures.py read", "versions": versions,
               "cases": [records[n] for n, _, _ in CASES]},
              open(path, "w"), indent=1, sort_keys=True)
    print("wrote", path)


def pkg(name):
    from importlib.metadata import version
    return version(name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("profiles")
    p.add_argument("dir", nargs="?", default=FIX)
    r = sub.add_parser("read")
    r.add_argument("repipe")
    r.add_argument("--trainer", choices=TRAINERS, action="append")
    a = ap.parse_args()
    if a.what == "profiles":
        profiles(a.dir)
    else:
        read(os.path.abspath(a.repipe), a.trainer or list(TRAINERS))


if __name__ == "__main__":
    main()
