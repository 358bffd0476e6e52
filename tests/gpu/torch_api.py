"""PyTorch with its cache off over cudalloc, with cudalloc.torch.install(): torch.cuda's memory
functions report cudalloc's figures (not zeros), per phase marked with cudalloc.phase(), and the
run's peaks equal those of cudalloc's own trace, whose records carry the phases.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 CUDALLOC_TRACE=T LD_PRELOAD=libcudalloc.so \\
        python3 tests/gpu/torch_api.py run > figures.json
    python3 tests/gpu/torch_api.py check figures.json T
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))


def run():
    import torch
    import cudalloc
    import cudalloc.torch
    if not cudalloc.torch.install():
        sys.exit("cudalloc is not active in this process")
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(6)]).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    phases = {}
    for step in range(3):
        x = torch.randn(128 * (step + 1), 2048, device="cuda")
        with cudalloc.phase("forward"):
            loss = model(x).pow(2).mean()
        phases.setdefault("forward", []).append(torch.cuda.memory_allocated())
        with cudalloc.phase("backward"):
            loss.backward()
        phases.setdefault("backward", []).append(torch.cuda.memory_allocated())
        with cudalloc.phase("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        phases.setdefault("optimizer", []).append(torch.cuda.memory_allocated())
    torch.cuda.synchronize()
    cudalloc.flush_trace()
    print(json.dumps({
        "phases_allocated": phases,
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "direct_max_allocated": cudalloc.max_memory_allocated(),
        "summary_has_reserved": "Reserved memory" in torch.cuda.memory_summary(),
    }))


def check(figures_path, trace):
    fig = json.load(open(figures_path))
    problems = []
    if fig["max_memory_allocated"] <= 0 or fig["max_memory_reserved"] < fig["max_memory_allocated"]:
        problems.append("torch.cuda figures are not cudalloc's: %r" % fig)
    if fig["max_memory_allocated"] != fig["direct_max_allocated"]:
        problems.append("torch.cuda.max_memory_allocated %d != cudalloc's %d"
                        % (fig["max_memory_allocated"], fig["direct_max_allocated"]))
    if not fig["summary_has_reserved"]:
        problems.append("torch.cuda.memory_summary() is not cudalloc's")
    if any(v <= 0 for vals in fig["phases_allocated"].values() for v in vals):
        problems.append("a phase reported no allocated memory: %r" % fig["phases_allocated"])
    tool = os.path.join(ROOT, "scripts", "cudalloc-trace")
    r = subprocess.run([sys.executable, tool, "summary", "--json", "--no-symbols", trace],
                       capture_output=True, text=True)
    if r.returncode != 0:
        problems.append("summary failed: %s" % r.stderr[-300:])
    else:
        s = json.loads(r.stdout)
        dev = s["devices"].get("0", {})
        for key, mine in (("peak_allocated", fig["max_memory_allocated"]), ("peak_reserved", fig["max_memory_reserved"])):
            if dev.get(key) != mine:
                problems.append("trace %s %s != torch.cuda's %d" % (key, dev.get(key), mine))
        seen = set(json.dumps(s.get("phases", {})).split('"'))
        missing = [p for p in ("forward", "backward", "optimizer") if p not in seen]
        if missing:
            problems.append("the trace has no records of phases %s" % missing)
    for p in problems:
        print(p)
    if not problems:
        print("torch.cuda peaks %d / %d B = the trace's; phases %s"
              % (fig["max_memory_allocated"], fig["max_memory_reserved"], sorted(fig["phases_allocated"])))
    return 1 if problems else 0


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run()
    else:
        sys.exit(check(sys.argv[2], sys.argv[3]))
