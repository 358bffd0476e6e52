"""Runs a real model's steps under deterministic settings (built from its config, random
weights, random inputs) and prints the per-step losses bit for bit, plus the step time and
PyTorch's peak memory counters, as one JSON line.

    python3 tests/gpu/torch_train.py [--steps N] [--model gpt2|mlp|resnet50|bert] [--varied] [--batch N]
                                     [--pageable] [--profile TRACE]

gpt2: GPT-2-sized transformer (12 x 768), AdamW, batch 4 x 256 tokens (varied: 128-320;
  --batch N: N x 256).
mlp: 8 x 2048 linear layers, AdamW, batch 256 (varied: 128-320; --batch N: N).
resnet50: torchvision ResNet-50, SGD with momentum, batch 32 at 224 x 224 (varied: batch and
  resolution change every step; --batch N: N at 224 x 224).
bert: BERT-base (BertConfig() defaults) masked-LM inference in eval mode under no_grad, batch 8
  x 256 tokens (varied: batch and sequence length change every step; --batch N: N x 256); its "losses" are a
  checksum of the logits per step, so the bit-for-bit comparison works the same way.
Run it with and without cudalloc (and PYTORCH_NO_CUDA_MEMORY_CACHING=1): the losses must match.
Inputs are drawn on the host, and pinned, before each step's timer starts; their copy to the device is
timed.
"""
import argparse
import contextlib
import json
import os
import statistics
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch  # noqa: E402

MODELS = ["gpt2", "mlp", "resnet50", "bert"]
STEP_MARK = "cudalloc_step"  # the profiler's range around each timed step (scripts/torch-kernels)
RESNET_SHAPES = [(32, 224), (16, 256), (24, 192), (32, 160)]  # (batch, resolution) when varied
BERT_SHAPES = [(8, 128), (4, 384), (16, 64), (8, 256)]  # (batch, sequence) when varied


class GlobalAvgPool(torch.nn.Module):
    """AdaptiveAvgPool2d((1, 1)) as a mean: the same values, and a backward that
    use_deterministic_algorithms accepts (adaptive_avg_pool2d_backward_cuda has none)."""

    def forward(self, x):
        return x.mean(dim=(2, 3), keepdim=True)


def build(model_name):
    """Returns (model, vocabulary size or None)."""
    if model_name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=512, vocab_size=50257)
        cfg._attn_implementation = "eager"  # deterministic backward
        return GPT2LMHeadModel(cfg), cfg.vocab_size
    if model_name == "resnet50":
        import torchvision
        model = torchvision.models.resnet50(weights=None)
        model.avgpool = GlobalAvgPool()
        return model, None
    if model_name == "bert":
        from transformers import BertConfig, BertForMaskedLM
        cfg = BertConfig()  # base: 12 layers, 768 hidden, 12 heads, 30522 tokens, 512 positions
        cfg._attn_implementation = "eager"  # the same kernels in every mode
        return BertForMaskedLM(cfg), cfg.vocab_size
    layers = []
    for _ in range(8):
        layers += [torch.nn.Linear(2048, 2048), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers), None


def host_inputs(model_name, step, varied, gen, vocab, batch=None):
    """The step's inputs on the host (drawn in the same order in every mode). batch: the fixed
    shape's batch size instead of the default."""
    if model_name == "gpt2":
        seq = [128, 256, 192, 320][step % 4] if varied else 256
        return (torch.randint(0, vocab, (batch or 4, seq), generator=gen),)
    if model_name == "resnet50":
        batch, res = RESNET_SHAPES[step % 4] if varied else (batch or 32, 224)
        images = torch.randn(batch, 3, res, res, generator=gen)
        labels = torch.randint(0, 1000, (batch,), generator=gen)
        # One-hot targets: the loss below needs no NLL kernel (deterministic by construction).
        return images, torch.nn.functional.one_hot(labels, 1000).float()
    if model_name == "bert":
        batch, seq = BERT_SHAPES[step % 4] if varied else (batch or 8, 256)
        return (torch.randint(0, vocab, (batch, seq), generator=gen),)
    batch = [128, 320, 256, 192][step % 4] if varied else (batch or 256)
    return (torch.randn(batch, 2048, generator=gen),)


def train_step(model_name, model, opt, inputs):
    """One step on device inputs; returns the loss (bert: the logits' checksum)."""
    if opt is None:  # inference
        with torch.no_grad():
            x = inputs[0]
            logits = model(input_ids=x, attention_mask=torch.ones_like(x)).logits
            # A checksum of the logits, reduced in a fixed order: bit-identical across modes.
            return logits.sum(dtype=torch.float64)
    if model_name == "gpt2":
        loss = model(input_ids=inputs[0], labels=inputs[0]).loss
    elif model_name == "resnet50":
        x, target = inputs
        logp = torch.nn.functional.log_softmax(model(x), dim=1)
        loss = -(logp * target).sum(dim=1).mean()
    else:
        loss = model(inputs[0]).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--model", default="gpt2", choices=MODELS)
    ap.add_argument("--varied", action="store_true", help="vary the input shapes per step")
    ap.add_argument("--batch", type=int, help="batch size of the fixed shape "
                    "(larger: steps bound by the GPU rather than by kernel launches)")
    ap.add_argument("--pageable", action="store_true", help="copy the inputs from pageable host memory "
                    "(the default pins them first, as a DataLoader with pin_memory does: a pageable copy "
                    "runs through the driver's staging buffers at the host's memcpy speed, which varies "
                    "between runs more than the allocators being compared)")
    ap.add_argument("--profile", metavar="TRACE", help="record the steps after the first two with "
                    "torch.profiler and write its Chrome trace here (scripts/torch-kernels reads it)")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    model, vocab = build(args.model)
    model = model.cuda()
    if args.model == "bert":
        model.eval()
        opt = None
    elif args.model == "resnet50":
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(1)
    losses, times = [], []
    profiler = None
    for step in range(args.steps):
        inputs = host_inputs(args.model, step, args.varied, gen, vocab, args.batch)
        if not args.pageable:
            inputs = tuple(t.pin_memory() for t in inputs)
        torch.cuda.synchronize()
        if args.profile and step == 2:  # the warm steps only, as the median
            profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                          torch.profiler.ProfilerActivity.CUDA])
            profiler.__enter__()
        t0 = time.perf_counter()
        with torch.profiler.record_function(STEP_MARK) if profiler else contextlib.nullcontext():
            loss = train_step(args.model, model, opt, [t.cuda(non_blocking=True) for t in inputs])
            losses.append(loss.item())
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    if profiler is not None:
        profiler.__exit__(None, None, None)
        profiler.export_chrome_trace(args.profile)
    steady = times[2:] if len(times) > 4 else times
    print(json.dumps({
        "model": args.model,
        "varied": args.varied,
        "losses": [float(l).hex() for l in losses],
        "median_step_ms": 1000 * statistics.median(steady),
        "step_ms": [round(1000 * t, 3) for t in times],
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
    }))


if __name__ == "__main__":
    main()
