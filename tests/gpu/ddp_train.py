"""Two-process NCCL jobs for the GPU suite's multi-GPU cases, each rank on its own GPU:

    torchrun --standalone --nproc_per_node=2 tests/gpu/ddp_train.py train --steps 30 --report DIR
    torchrun --standalone --nproc_per_node=2 tests/gpu/ddp_train.py allreduce --report DIR
    python3 tests/gpu/ddp_train.py check DIR [--min-allocs N] [--slack-mb M]

train: a small MLP under DistributedDataParallel (gradients all-reduced by NCCL), fixed seeds,
  deterministic algorithms, batch shapes that change every step; rank 0 prints each step's mean
  loss over the ranks, bit for bit (float.hex), so that a native run and a run under cudalloc
  compare byte for byte. With two ranks a sum is one addition, the same in any order.
allreduce: all-reduces a 64 MiB tensor and tensors of other sizes, and checks the sums. NCCL maps
  its own buffers with cuMemCreate/cuMemMap, which cudalloc does not interpose.

Each rank writes DIR/rank<R>.json: whether cudalloc is loaded in it and, if so, its statistics for
the rank's device (allocations served, peak allocated and reserved bytes); allreduce adds the most
bytes the job's own tensors held at once and whether the sums were right.

check: every rank's report must show cudalloc loaded and serving at least N allocations; for
allreduce, right sums and a reserved peak within M MiB of what the job's tensors held (NCCL's
buffers, tens to hundreds of MiB, are not cudalloc's to count). Prints one line; exit 1 if not.
"""
import argparse
import glob
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))

MiB = 1 << 20
BATCHES = [64, 96, 128, 80]  # per step, in turn: blocks of new sizes every step


def setup():
    """(torch, torch.distributed, rank, device memory in use before NCCL's set-up)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch
    import torch.distributed as dist
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    torch.zeros(1, device="cuda")  # the context, before the measure
    free, total = torch.cuda.mem_get_info()
    dist.init_process_group("nccl")
    return torch, dist, rank, total - free


def cudalloc_report(torch, rank):
    """cudalloc's figures for this rank's device, or {"cudalloc": False} without it."""
    import cudalloc
    torch.cuda.synchronize()
    if not cudalloc.is_active():
        return {"cudalloc": False}
    stats = cudalloc.memory_stats(rank)
    return {
        "cudalloc": True,
        "allocations": stats.get("allocation.all.allocated", 0),
        "peak_allocated": cudalloc.max_memory_allocated(rank),
        "peak_reserved": cudalloc.max_memory_reserved(rank),
    }


def cudalloc_live(rank):
    import cudalloc
    return cudalloc.memory_allocated(rank)


def write_report(path, rank, report):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "rank%d.json" % rank), "w") as f:
        json.dump(report, f)


def train(args):
    torch, dist, rank, _ = setup()
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 16)).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own data
    for step in range(args.steps):
        batch = BATCHES[step % len(BATCHES)]
        x = torch.randn(batch, 512, generator=gen).cuda()
        target = torch.randn(batch, 16, generator=gen).cuda()
        loss = torch.nn.functional.mse_loss(ddp(x), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        if rank == 0:
            print("step %d loss %s" % (step, (mean.item() / dist.get_world_size()).hex()), flush=True)
    write_report(args.report, rank, cudalloc_report(torch, rank))
    dist.destroy_process_group()


def allreduce(args):
    torch, dist, rank, used_before = setup()
    world = dist.get_world_size()
    big = torch.full((64 * MiB // 4,), float(rank + 1), device="cuda")
    held = big.numel() * 4
    ok = True
    for k, n in enumerate([256, 64 * 1024, 1 << 20, 4 << 20, 16 << 20]):  # elements, float32
        t = torch.full((n,), float(rank + k), device="cuda")
        held = max(held, big.numel() * 4 + n * 4)
        dist.all_reduce(t)
        dist.all_reduce(big)
        expected = sum(float(r + k) for r in range(world))
        ok = ok and bool(torch.all(t == expected).item())
        del t
    # big started at r + 1 on rank r and was summed 5 times.
    ok = ok and bool(torch.all(big == float(sum(r + 1 for r in range(world)) * world ** 4)).item())
    if rank == 0:
        print("allreduce %s" % ("right sums" if ok else "WRONG SUMS"), flush=True)
    report = cudalloc_report(torch, rank)
    # Under cudalloc cudaMemGetInfo counts its idle cache as free: what is in use beyond its
    # live blocks is the device memory others took meanwhile, NCCL's buffers above all.
    free, total = torch.cuda.mem_get_info()
    outside = total - free - used_before - (cudalloc_live(rank) if report["cudalloc"] else big.numel() * 4)
    report.update(held=held, sums_right=ok, outside=outside)
    write_report(args.report, rank, report)
    dist.destroy_process_group()


def check(args):
    """(ok, message) for the reports in args.dir."""
    paths = sorted(glob.glob(os.path.join(args.dir, "rank*.json")))
    if len(paths) < 2:
        return False, "%d rank reports in %s, expected 2 or more" % (len(paths), args.dir)
    parts = []
    ok = True
    for path in paths:
        with open(path) as f:
            r = json.load(f)
        name = os.path.basename(path)[:-5]
        if not r.get("cudalloc"):
            return False, "%s: cudalloc was not loaded" % name
        served = r.get("allocations", 0)
        part = "%s %d allocations" % (name, served)
        ok = ok and served >= args.min_allocs
        if "held" in r:
            extra = r["peak_reserved"] - r["held"]
            part += ", reserved %.0f MiB for %.0f MiB of tensors, %.0f MiB outside cudalloc" % (
                r["peak_reserved"] / MiB, r["held"] / MiB, r["outside"] / MiB)
            ok = ok and r["sums_right"] and extra <= args.slack_mb * MiB
            if not r["sums_right"]:
                part += ", WRONG SUMS"
        parts.append(part)
    return ok, "; ".join(parts)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode", required=True)
    t = sub.add_parser("train")
    t.add_argument("--steps", type=int, default=30)
    t.add_argument("--report", required=True)
    a = sub.add_parser("allreduce")
    a.add_argument("--report", required=True)
    c = sub.add_parser("check")
    c.add_argument("dir")
    c.add_argument("--min-allocs", type=int, default=100)
    c.add_argument("--slack-mb", type=int, default=64)
    args = p.parse_args(argv)
    if args.mode == "train":
        train(args)
    elif args.mode == "allreduce":
        allreduce(args)
    else:
        ok, message = check(args)
        print(message)
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
