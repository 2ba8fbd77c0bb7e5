"""Regenerates tests/fixtures/hf-configs/: config.json files written by Hugging Face
transformers' own config classes (LlamaConfig, MistralConfig, Qwen2Config, GPT2Config; no
weights downloaded), and the parameters of each model as transformers builds it (on the meta
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
        print(name, records[name]["parameters"])
    json.dump({"source": "tests/hf_config_fixtures.py", "transformers": transformers.__version__,
               "torch": torch.__version__,
               "licence": "transformers: Apache 2.0 (the files are its config classes' output)",
               "models": records}, open(os.path.join(OUT, "models.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
