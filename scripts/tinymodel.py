#!/usr/bin/env python3
"""tinymodel.py OUT ARCH TOKENIZER_DIR — write a tiny model folder vLLM can serve with --load-format dummy.

The folder holds the real architecture's config.json (HF transformers field names) shrunk to the smallest
sizes vLLM's CPU attention takes, plus the shared tokenizer files (tokenizer.json, tokenizer_config.json,
chat template included) copied byte for byte. No weights: the engine makes random ones (--load-format
dummy), which is all a router needs — the scheduler, KV cache manager, block hashing and event publisher
are the engine's own code whatever the weights say.

ARCH is llama3 or qwen3. With --lora DIR it also writes a dummy LoRA adapter (adapter_config.json plus
zero-initialised adapter_model.safetensors) for the tiny model, so --enable-lora has something to load.
Standard library only (the LoRA weights need safetensors+torch: run it with the vLLM venv's python).
"""
import argparse
import json
import os
import shutil
import sys

# Smallest shapes vLLM's CPU attention accepts: head_size must be one of the CPU kernels' sizes
# (32, 64, 80, 96, 112, 128, 256, 512); 64 is the smallest that every ISA path (AVX-512, AMX) builds.
HEAD = 64
HEADS = 2
KV_HEADS = 1
LAYERS = 2
INTER = 256

def config(arch, tok):
    vocab = vocab_size(tok)
    common = {
        "hidden_size": HEAD * HEADS, "intermediate_size": INTER, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD,
        "hidden_act": "silu", "rms_norm_eps": 1e-5, "vocab_size": vocab, "torch_dtype": "bfloat16",
        "tie_word_embeddings": True, "attention_bias": False, "initializer_range": 0.02, "use_cache": True,
    }
    if arch == "llama3":
        return {**common, "architectures": ["LlamaForCausalLM"], "model_type": "llama",
                "max_position_embeddings": 8192, "rope_theta": 500000.0, "bos_token_id": 128000,
                "eos_token_id": [128001, 128009], "mlp_bias": False, "pretraining_tp": 1,
                "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
    if arch == "qwen3":
        return {**common, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                "max_position_embeddings": 8192, "rope_theta": 1000000.0, "bos_token_id": 151643,
                "eos_token_id": 151645, "sliding_window": None, "use_sliding_window": False,
                "max_window_layers": LAYERS, "rope_scaling": None}
    sys.exit(f"tinymodel: unknown arch {arch!r} (llama3, qwen3)")

def vocab_size(tok):
    with open(os.path.join(tok, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    n = max(list(tj["model"]["vocab"].values()) + [a["id"] for a in tj.get("added_tokens", [])]) + 1
    return (n + 127) // 128 * 128  # padded like the published checkpoints' embedding tables

def lora(out, model_dir, cfg):
    import torch
    from safetensors.torch import save_file
    os.makedirs(out, exist_ok=True)
    r = 8
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump({"base_model_name_or_path": model_dir, "peft_type": "LORA", "task_type": "CAUSAL_LM",
                   "r": r, "lora_alpha": 16, "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
                   "target_modules": ["q_proj", "v_proj"], "modules_to_save": None}, f, indent=1)
    h, kv = cfg["hidden_size"], cfg["num_key_value_heads"] * cfg["head_dim"]
    t = {}
    for i in range(cfg["num_hidden_layers"]):
        p = f"base_model.model.model.layers.{i}.self_attn"
        t[f"{p}.q_proj.lora_A.weight"] = torch.zeros(r, h)
        t[f"{p}.q_proj.lora_B.weight"] = torch.zeros(h, r)
        t[f"{p}.v_proj.lora_A.weight"] = torch.zeros(r, h)
        t[f"{p}.v_proj.lora_B.weight"] = torch.zeros(kv, r)
    save_file(t, os.path.join(out, "adapter_model.safetensors"))

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("arch")
    ap.add_argument("tokenizer")
    ap.add_argument("--lora", help="also write a dummy LoRA adapter folder here")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    cfg = config(a.arch, a.tokenizer)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(os.path.join(a.tokenizer, name), os.path.join(a.out, name))
    with open(os.path.join(a.out, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"]}, f)
    if a.lora:
        lora(a.lora, os.path.abspath(a.out), cfg)

if __name__ == "__main__":
    main()
