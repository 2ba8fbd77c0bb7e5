"""Regenerates tests/fixtures/hf-configs/: config.json files written by Hugging Face
transformers' own config classes (LlamaConfig, MistralConfig, Qwen2Config, GPT2Config; no
weights downloaded; and the mixtures of experts of MixtralConfig and Qwen3MoeConfig, with
Qwen3Config's dense shape), and the parameters of each model as transformers builds it (on the meta
device: shapes, no memory), for tests/hf_config_test.py to hold `repipe plan
--transformer-config` to. Run it where transformers is installed (a scratch environment):

    python tests/hf_config_fixtures.py
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures", "hf-configs")

# Each model: its config class's arguments (the released models' sizes, Meta's, Mistral AI's,
# Qwen's and OpenAI's config.json), and the same shape as repipe's keys, typed by hand.
MODELS = {
    "llama3-8b": ("LlamaConfig", dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
        rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=128000,
        eos_token_id=128001),
        "layers=32,hidden=4096,heads=32,kv_heads=8,ffn=14336,seq=8192,vocab=128256,mlp=swiglu,"
        "norm=rmsnorm,position=rope,bias=none,tied=0,flash=1,dropout=0"),
    "mistral-7b": ("MistralConfig", dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=32768,
        sliding_window=None, tie_word_embeddings=False),
        "layers=32,hidden=4096,heads=32,kv_heads=8,ffn=14336,seq=32768,vocab=32000,mlp=swiglu,"
        "norm=rmsnorm,position=rope,bias=none,tied=0,flash=1,dropout=0"),
    "qwen2-7b": ("Qwen2Config", dict(
        vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
        num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768,
        tie_word_embeddings=False),
        "layers=28,hidden=3584,heads=28,kv_heads=4,ffn=18944,seq=32768,vocab=152064,mlp=swiglu,"
        "norm=rmsnorm,position=rope,bias=qkv,tied=0,flash=1,dropout=0"),
    "qwen2-0.5b": ("Qwen2Config", dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
        tie_word_embeddings=True),
        "layers=24,hidden=896,heads=14,kv_heads=2,ffn=4864,seq=32768,vocab=151936,mlp=swiglu,"
        "norm=rmsnorm,position=rope,bias=qkv,tied=1,flash=1,dropout=0"),
    "gpt2-xl": ("GPT2Config", dict(
        vocab_size=50257, n_positions=1024, n_embd=1600, n_layer=48, n_head=25),
        "layers=48,hidden=1600,heads=25,ffn=6400,seq=1024,vocab=50257,mlp=gelu,norm=layernorm,"
        "position=learned,bias=all,tied=1,flash=1,dropout=1"),
    # the mixtures of experts (Mistral AI's and Qwen's config.json): 46.7B and 30.5B parameters
    "mixtral-8x7b": ("MixtralConfig", dict(
        vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=32768,
        num_local_experts=8, num_experts_per_tok=2, sliding_window=None, rope_theta=1e6,
        tie_word_embeddings=False),
        "layers=32,hidden=4096,heads=32,kv_heads=8,ffn=14336,seq=32768,vocab=32000,mlp=swiglu,"
        "norm=rmsnorm,position=rope,bias=none,tied=0,flash=1,dropout=0,experts=8,top_k=2,"
        "moe_ffn=14336"),
    "qwen3-30b-a3b": ("Qwen3MoeConfig", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        max_position_embeddings=40960, moe_intermediate_size=768, num_experts=128,
        num_experts_per_tok=8, decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True,
        tie_word_embeddings=False),
        "layers=48,hidden=2048,heads=32,kv_heads=4,head_dim=128,ffn=6144,seq=40960,vocab=151936,"
        "mlp=swiglu,norm=rmsnorm,position=rope,bias=none,tied=0,flash=1,dropout=0,qk_norm=1,"
        "experts=128,top_k=8,moe_ffn=768"),
    # DeepSeek-V3 (DeepSeek's config.json; DeepseekV3Config's defaults): latent attention,
    # 256 experts, a shared one, 3 dense first blocks, a multi-token prediction block that
    # transformers does not build (671B parameters without it)
    "deepseek-v3": ("DeepseekV3Config", dict(
        vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
        num_hidden_layers=61, num_nextn_predict_layers=1, num_attention_heads=128,
        num_key_value_heads=128, n_shared_experts=1, n_routed_experts=256,
        routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64,
        v_head_dim=128, qk_nope_head_dim=128, n_group=8, topk_group=4, num_experts_per_tok=8,
        first_k_dense_replace=3, norm_topk_prob=True, max_position_embeddings=163840,
        tie_word_embeddings=False),
        "layers=61,hidden=7168,heads=128,ffn=18432,seq=163840,vocab=129280,mlp=swiglu,"
        "norm=rmsnorm,position=rope,bias=none,tied=0,flash=1,dropout=0,experts=256,top_k=8,"
        "moe_ffn=2048,shared_ffn=2048,dense_first=3,kv_lora=512,q_lora=1536,head_dim=128,"
        "rope_dim=64,v_dim=128,mtp=1"),
    "qwen3-8b": ("Qwen3Config", dict(
        vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=40960, tie_word_embeddings=False),
        "layers=36,hidden=4096,heads=32,kv_heads=8,head_dim=128,ffn=12288,seq=40960,vocab=151936,"
        "mlp=swiglu,norm=rmsnorm,position=rope,bias=none,tied=0,flash=1,dropout=0,qk_norm=1"),
}


def main():
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    os.makedirs(OUT, exist_ok=True)
    records = {}
    for name, (cls, kw, spec) in MODELS.items():
        cfg = getattr(transformers, cls)(**kw)
        path = os.path.join(OUT, name + ".json")
        cfg.to_json_file(path)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
        records[name] = {"config": name + ".json", "class": cls, "spec": spec,
                         "parameters": model.num_parameters()}
        if hasattr(cfg, "num_experts_per_tok"):  # a token's: the experts it is not routed to out
            experts = (getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None)
                       or cfg.n_routed_experts)
            per = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n)
            records[name]["active_parameters"] = (
                model.num_parameters() - per + per * cfg.num_experts_per_tok // experts)
        print(name, records[name]["parameters"])
    json.dump({"source": "tests/hf_config_fixtures.py", "transformers": transformers.__version__,
               "torch": torch.__version__,
               "licence": "transformers: Apache 2.0 (the files are its config classes' output)",
               "models": records}, open(os.path.join(OUT, "models.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
