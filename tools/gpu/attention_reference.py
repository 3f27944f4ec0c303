"""The references of tools/gpu/prefill_bench.sh, measured on the GPU machine in the same call.

    attention_reference.py MODEL_DIR CONTEXTS

Prints Markdown: the card's copy bandwidth and bf16 GEMM rate, PyTorch's flash SDPA (causal, 32
query and 32 KV heads: the FLOPs of specula's 32/8 GQA shape, four times its K/V bytes) TFLOP/s
at head_dim 64 and 128 for each context, and transformers' time to first token
(one forward pass, logits of the last position) for the checkpoint in MODEL_DIR.
"""
import sys

import torch
import torch.nn.functional as F


def median_ms(fn, repeats=7):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def card():
    n = 1 << 30
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    print(f"| copy bandwidth (1 GiB, read + write) | {2 * n / ms / 1e6:.0f} GB/s |")
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    ms = median_ms(lambda: a @ b)
    print(f"| bf16 GEMM 8192^3 | {2 * 8192**3 / ms / 1e9:.0f} TFLOP/s |")


def sdpa(contexts):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    print("\n| head_dim | context | PyTorch flash SDPA ms | TFLOP/s |\n|---|---|---|---|")
    for head_dim in (64, 128):
        for n in contexts:
            q = torch.randn(1, 32, n, head_dim, dtype=torch.bfloat16, device="cuda")
            k = torch.randn(1, 32, n, head_dim, dtype=torch.bfloat16, device="cuda")
            v = torch.randn(1, 32, n, head_dim, dtype=torch.bfloat16, device="cuda")
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                ms = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
            flops = 4 * head_dim * 32 * n * (n + 1) / 2
            print(f"| {head_dim} | {n} | {ms:.3f} | {flops / ms / 1e9:.1f} |")


def ttft(model_dir, contexts):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    print(f"\n| prompt | transformers TTFT ms ({model.config._attn_implementation}) |\n|---|---|")
    for n in contexts:
        ids = torch.randint(0, model.config.vocab_size, (1, n), device="cuda")
        with torch.no_grad():
            ms = median_ms(lambda: model(ids, logits_to_keep=1), repeats=3)
        print(f"| {n} | {ms:.1f} |")


def main():
    model_dir, contexts = sys.argv[1], [int(c) for c in sys.argv[2].split(",")]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}\n")
    print("| reference | value |\n|---|---|")
    card()
    sdpa(contexts)
    ttft(model_dir, contexts)


if __name__ == "__main__":
    main()
