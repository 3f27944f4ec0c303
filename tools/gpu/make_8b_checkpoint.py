"""Writes a random-weight Llama-3.1-8B-shaped bf16 checkpoint, sharded as the hub's are.

    python3 make_8b_checkpoint.py SMALL_MODEL_DIR OUT_DIR

Takes config.json and the tokenizer files from SMALL_MODEL_DIR (a make-tiny-model Llama
directory) and changes only the shape. The weights are drawn on the GPU (a CPU would take minutes
for 8 billion values) and saved by safetensors in four shards with model.safetensors.index.json,
the layout transformers' save_pretrained writes. Only load time is measured on it: the values
are N(0, 0.02), not a model that says anything.
"""
import json
import os
import shutil
import sys

import torch
from safetensors.torch import save_file

SHAPE = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
             num_attention_heads=32, num_key_value_heads=8, head_dim=128,
             tie_word_embeddings=False)
SHARDS = 4


def tensors(cfg):
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    yield "model.embed_tokens.weight", (v, h)
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        yield p + "input_layernorm.weight", (h,)
        yield p + "self_attn.q_proj.weight", (q, h)
        yield p + "self_attn.k_proj.weight", (kv, h)
        yield p + "self_attn.v_proj.weight", (kv, h)
        yield p + "self_attn.o_proj.weight", (h, q)
        yield p + "post_attention_layernorm.weight", (h,)
        yield p + "mlp.gate_proj.weight", (i, h)
        yield p + "mlp.up_proj.weight", (i, h)
        yield p + "mlp.down_proj.weight", (h, i)
    yield "model.norm.weight", (h,)
    yield "lm_head.weight", (v, h)


def main(small, out):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(small, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(SHAPE)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    for name in os.listdir(small):
        if name.startswith(("tokenizer", "generation_config", "special_tokens")):
            shutil.copy(os.path.join(small, name), out)
    specs = list(tensors(cfg))
    total = sum(torch.Size(s).numel() for _, s in specs)
    per_shard, shard, current, weight_map, size = total / SHARDS, [], 0, {}, 0
    files = [f"model-{k + 1:05d}-of-{SHARDS:05d}.safetensors" for k in range(SHARDS)]
    gen = torch.Generator(device="cuda").manual_seed(0)

    def flush(index):
        save_file({n: t for n, t in shard}, os.path.join(out, files[index]))
        for n, _ in shard:
            weight_map[n] = files[index]
        shard.clear()

    index = 0
    for name, s in specs:
        t = torch.randn(s, generator=gen, device="cuda", dtype=torch.bfloat16) * 0.02
        shard.append((name, t.cpu()))
        current += t.numel()
        size += t.numel() * 2
        if current >= per_shard * (index + 1) and index < SHARDS - 1:
            flush(index)
            index += 1
    flush(index)
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": size}, "weight_map": weight_map}, f, indent=2)
    print(f"{out}: {total / 1e9:.2f}B parameters, {size / 1e9:.2f} GB in {SHARDS} shards")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
