"""A PyTorch training run that marks its phases with NVTX, traced by cudalloc with trace_nvtx:
checks that the trace attributes allocations to "forward", "backward" and "optimizer", that a
step run under torch.autograd.profiler.emit_nvtx() attributes them to PyTorch's own op ranges
(aten::..., without the per-call ", seq = N" suffixes), and that the readers (summary, plot,
torch-snapshot export) accept it and PyTorch's memory viewer (torch.cuda._memory_viz) opens the
export.

    scripts/cudalloc --no-caching --trace T --trace-nvtx -- python3 tests/gpu/torch_phases.py run
    python3 tests/gpu/torch_phases.py check T
"""
import collections
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run():
    import torch
    nvtx = torch.cuda.nvtx
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(6)]).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        x = torch.randn(256, 1024, device="cuda")
        nvtx.range_push("forward")
        loss = model(x).pow(2).mean()
        nvtx.range_pop()
        nvtx.range_push("backward")
        loss.backward()
        nvtx.range_pop()
        nvtx.range_push("optimizer")
        opt.step()
        opt.zero_grad(set_to_none=True)
        nvtx.range_pop()
        return loss

    for _ in range(3):
        loss = step()
    # The last step with PyTorch's own op ranges, as a user profiling with Nsight would run it.
    with torch.autograd.profiler.emit_nvtx():
        loss = step()
    torch.cuda.synchronize()
    print("loss", loss.item())


def check(path):
    sys.path.insert(0, os.path.join(ROOT, "scripts", "trace"))
    from ct_reader import open_trace, phase_of
    allocs = collections.Counter()
    op_ranges = collections.Counter()  # the emit_nvtx step: PyTorch's op below our phase
    suffixed = 0
    for r in open_trace(path).records():
        if r.event in ("alloc", "passthrough_alloc"):
            allocs[phase_of(r.nvtx, 1)] += 1
            parts = (r.nvtx or "").split("/")
            ops = [p for p in parts[1:] if p.startswith("aten::")]
            if ops:
                op_ranges[ops[0]] += 1
            suffixed += any(", seq = " in p or ", op_id = " in p for p in parts)
    print("allocations by phase:", dict(allocs), "under emit_nvtx op ranges:", len(op_ranges),
          "e.g.", op_ranges.most_common(3))
    missing = [p for p in ("forward", "backward", "optimizer") if allocs[p] == 0]
    if missing:
        print("no allocation attributed to", missing)
        return 1
    if not op_ranges or suffixed:
        print("emit_nvtx step: %d op ranges, %d records with per-call suffixes" % (len(op_ranges), suffixed))
        return 1
    tool = os.path.join(ROOT, "scripts", "cudalloc-trace")
    out = subprocess.run([tool, "summary", path], capture_output=True, text=True)
    if out.returncode != 0 or "forward" not in out.stdout:
        print("summary failed or shows no phases:", out.stdout[-500:], out.stderr[-500:])
        return 1
    for args in (["plot", path, "-o", path + ".png"], ["export", path, "--format", "torch-snapshot", "-o", path + ".pickle"]):
        r = subprocess.run([tool] + args, capture_output=True, text=True)
        if r.returncode != 0:
            print(" ".join(args[:1]), "failed:", r.stderr[-500:])
            return 1
    # PyTorch's own viewer reads the export: its text summary, and both HTML views.
    for view, out in (("stats", None), ("trace_plot", path + ".trace.html"), ("segment_plot", path + ".segments.html")):
        cmd = [sys.executable, "-m", "torch.cuda._memory_viz", view, path + ".pickle"] + (["-o", out] if out else [])
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0 or (out and os.path.getsize(out) < 1000):
            print("torch.cuda._memory_viz", view, "failed:", r.stderr[-500:])
            return 1
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run()
    else:
        sys.exit(check(sys.argv[2]))
