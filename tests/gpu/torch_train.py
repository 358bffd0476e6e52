"""Trains a GPT-2-sized transformer (built from its config, random weights, random tokens)
under deterministic settings and prints the losses bit for bit, plus the step time.

    python3 tests/gpu/torch_train.py [--steps N] [--model gpt2|mlp] [--varied]
Run it with and without cudalloc (and PYTORCH_NO_CUDA_MEMORY_CACHING=1): the losses must match.
"""
import argparse
import json
import os
import statistics
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402


def build(model_name):
    if model_name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=512, vocab_size=50257)
        cfg._attn_implementation = "eager"  # deterministic backward
        return GPT2LMHeadModel(cfg), cfg.vocab_size
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(2048, 2048), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers), None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--model", default="gpt2", choices=["gpt2", "mlp"])
    ap.add_argument("--varied", action="store_true", help="vary the sequence length / batch per step")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    model, vocab = build(args.model)
    model = model.cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(1)
    losses, times = [], []
    for step in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        if args.model == "gpt2":
            seq = [128, 256, 192, 320][step % 4] if args.varied else 256
            x = torch.randint(0, vocab, (4, seq), generator=gen).cuda()
            loss = model(input_ids=x, labels=x).loss
        else:
            batch = [128, 320, 256, 192][step % 4] if args.varied else 256
            x = torch.randn(batch, 2048, generator=gen).cuda()
            loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    steady = times[2:] if len(times) > 4 else times
    print(json.dumps({
        "model": args.model,
        "losses": [l.hex() for l in losses],
        "median_step_ms": 1000 * statistics.median(steady),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
    }))


if __name__ == "__main__":
    main()
