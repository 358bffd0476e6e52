"""Collects real allocation traces and PyTorch's own memory figures on a GPU.

    python3 tests/gpu/collect_traces.py --out DIR [--workloads a,b] [--jobs N] [--timeout S]
    python3 tests/gpu/collect_traces.py --out DIR --device cpu --tiny [--workloads a,b]

For each workload, each in a fresh subprocess (so peaks and allocator settings never leak between
runs), three settings:

  snapshot    default allocator, torch.cuda.memory._record_memory_history(context=None) from
              before the model is built, then _dump_snapshot -> DIR/<workload>.pickle.gz
  default     the same workload natively: max_memory_allocated / max_memory_reserved
  expandable  the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True

Workloads are real models built from configs/constructors with random weights and random data
(no downloads), a handful of steps with shapes that vary from step to step. The figures go to
DIR/pytorch-figures.json (and stdout, as JSON); scripts/fragmentation-report reads that file
and the pickles from data/traces/. Also runnable by hand: --worker WORKLOAD --setting S.

The workloads of workloads.py (llama-train, convnext-train, unet-train, gru-seq2seq-train,
llama-serve) run with deterministic kernels, as tests/gpu/torch_memory.py runs them, and their
figures carry the per-step losses. --device cpu --tiny runs those at tiny dimensions for 2 steps
on the CPU, through the same worker processes, to test their code where there is no GPU: no
snapshot and no memory figures, and nothing written but DIR/collect.log.
"""
import argparse
import concurrent.futures
import datetime
import gzip
import json
import os
import subprocess
import sys
import time

HERE = os.path.abspath(__file__)
sys.path.insert(0, os.path.dirname(HERE))
import workloads  # noqa: E402

# name -> (kind, description); the schedules are in the run_* functions below.
WORKLOADS = {
    "gpt2-train": ("training",
                   "GPT-2 small (GPT2Config n_layer=12 n_embd=768 n_head=12, eager attention), "
                   "AdamW, fp32, batch 8, 8 steps, sequence length 256,1024,128,512,768,64,384,1024"),
    "resnet50-train": ("training",
                       "torchvision resnet50, SGD momentum, fp32, 8 steps, (batch, resolution) "
                       "(64,224),(128,160),(32,288),(96,192),(64,256),(128,224),(48,320),(80,176)"),
    "vit-train": ("training",
                  "torchvision vit_b_16, AdamW, bf16 autocast, 224x224, 8 steps, "
                  "batch 32,96,64,16,128,48,80,24"),
    "bert-infer": ("inference",
                   "BERT-base (BertConfig defaults, sdpa attention), fp16, torch.no_grad, 16 "
                   "forwards, (batch, sequence) varied from (1,16) to (256,32) and (8,512)"),
}
WORKLOADS.update(workloads.NEW_WORKLOADS)

SETTINGS = {
    "snapshot": {},
    "default": {},
    "expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
}
CPU_SETTING = "cpu"  # --device cpu: one run per workload, no allocator settings


# --- workloads (run inside the worker process)

def run_gpt2(torch):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257)
    cfg._attn_implementation = "eager"
    model = GPT2LMHeadModel(cfg).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for seq in (256, 1024, 128, 512, 768, 64, 384, 1024):
        x = torch.randint(0, cfg.vocab_size, (8, seq), device="cuda")
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()


def run_resnet50(torch):
    import torchvision
    model = torchvision.models.resnet50(num_classes=1000).cuda().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    lossf = torch.nn.CrossEntropyLoss()
    for batch, res in ((64, 224), (128, 160), (32, 288), (96, 192), (64, 256), (128, 224),
                       (48, 320), (80, 176)):
        x = torch.randn(batch, 3, res, res, device="cuda")
        y = torch.randint(0, 1000, (batch,), device="cuda")
        loss = lossf(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()


def run_vit(torch):
    import torchvision
    model = torchvision.models.vit_b_16(num_classes=1000).cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    lossf = torch.nn.CrossEntropyLoss()
    for batch in (32, 96, 64, 16, 128, 48, 80, 24):
        x = torch.randn(batch, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (batch,), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = lossf(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()


def run_bert(torch):
    from transformers import BertConfig, BertModel
    cfg = BertConfig()  # bert-base: 12 layers, 768 hidden, 12 heads
    model = BertModel(cfg).to(device="cuda", dtype=torch.float16).eval()
    shapes = ((1, 128), (64, 128), (8, 512), (128, 64), (4, 384), (32, 256), (256, 32), (2, 512),
              (16, 448), (96, 96), (1, 16), (48, 320), (200, 48), (12, 500), (64, 200), (3, 77))
    with torch.no_grad():
        for batch, seq in shapes:
            ids = torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda")
            mask = torch.ones(batch, seq, dtype=torch.long, device="cuda")
            out = model(input_ids=ids, attention_mask=mask)
            out.last_hidden_state.float().sum().item()
            del out


RUNNERS = {"gpt2-train": run_gpt2, "resnet50-train": run_resnet50, "vit-train": run_vit,
           "bert-infer": run_bert}


def run_workload(workload, torch, rt):
    """Runs a workload; those of workloads.py record their losses and step times in rt (the
    first four take torch only, and run on the GPU at full size)."""
    if workload in workloads.NEW_RUNNERS:
        workloads.NEW_RUNNERS[workload](torch, rt)
    elif rt.device != "cuda" or rt.tiny:
        raise SystemExit("%s runs on the GPU at full size only" % workload)
    else:
        RUNNERS[workload](torch)


def worker(workload, setting, out_dir, device="cuda", tiny=False):
    import torch
    if workload in workloads.NEW_RUNNERS:
        workloads.prepare(torch, device)
    else:
        torch.manual_seed(0)
    t0 = time.time()
    rt = workloads.Runtime(torch, device, tiny)
    if device == "cpu":
        run_workload(workload, torch, rt)
        print("RESULT " + json.dumps({"workload": workload, "setting": setting, "tiny": tiny,
                                      "losses": [v.hex() for v in rt.losses],
                                      "step_ms": [round(1000 * t, 3) for t in rt.step_s],
                                      "seconds": round(time.time() - t0, 1)}), flush=True)
        return
    if setting == "snapshot":
        torch.cuda.memory._record_memory_history(context=None, max_entries=2_000_000)
    run_workload(workload, torch, rt)
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    res = {
        "workload": workload,
        "setting": setting,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "peak_requested_bytes": stats.get("requested_bytes.all.peak"),
        "num_alloc_retries": stats.get("num_alloc_retries"),
        "num_device_alloc": stats.get("num_device_alloc"),
        "segments_at_end": len(torch.cuda.memory._snapshot()["segments"]),
        "seconds": None,
    }
    res["utilization"] = res["max_memory_allocated"] / res["max_memory_reserved"]
    if rt.losses:
        res.update(losses=[v.hex() for v in rt.losses], step_ms=[round(1000 * t, 3) for t in rt.step_s],
                   tiny=tiny)
    if setting == "snapshot":
        path = os.path.join(out_dir, workload + ".pickle")
        torch.cuda.memory._dump_snapshot(path)
        torch.cuda.memory._record_memory_history(enabled=None)
        with open(path, "rb") as f:
            raw = f.read()
        with gzip.open(path + ".gz", "wb", compresslevel=9) as f:
            f.write(raw)
        os.remove(path)
        import pickle
        snap = pickle.loads(raw)
        entries = sum(len(t) for t in snap["device_traces"])
        res.update(snapshot_file=workload + ".pickle.gz", snapshot_bytes=len(raw),
                   snapshot_gz_bytes=os.path.getsize(path + ".gz"), trace_entries=entries,
                   trace_wrapped=entries >= 2_000_000)
    res["seconds"] = round(time.time() - t0, 1)
    print("RESULT " + json.dumps(res), flush=True)


def launch(workload, setting, out_dir, timeout, extra=()):
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_ALLOC_CONF", None)
    env.pop("PYTORCH_NO_CUDA_MEMORY_CACHING", None)
    env.pop("LD_PRELOAD", None)
    env.update(SETTINGS.get(setting, {}))
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if workload in workloads.NEW_RUNNERS:
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # deterministic cuBLAS (workloads.prepare)
    cmd = [sys.executable, HERE, "--worker", workload, "--setting", setting, "--out", out_dir] + list(extra)
    t0 = time.time()
    try:
        r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout)
        text, rc = r.stdout.decode("utf-8", "replace"), r.returncode
    except subprocess.TimeoutExpired as e:
        text, rc = (e.stdout or b"").decode("utf-8", "replace") + "\n[timed out]", 124
    for line in text.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:]), text
    return {"workload": workload, "setting": setting, "error": "rc=%d after %.0fs: %s" % (
        rc, time.time() - t0, " | ".join(text.strip().splitlines()[-3:])[-600:])}, text


def gpu_info():
    info = {}
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                            "--format=csv,noheader"], stdout=subprocess.PIPE, timeout=30)
        info["nvidia_smi"] = q.stdout.decode().strip()
    except Exception as e:  # noqa: BLE001 - informational only
        info["nvidia_smi"] = "unavailable (%s)" % e
    code = ("import torch, torchvision, transformers, json; print(json.dumps({'gpu': "
            "torch.cuda.get_device_name(0), 'torch': torch.__version__, 'cuda': torch.version.cuda, "
            "'torchvision': torchvision.__version__, 'transformers': transformers.__version__}))")
    r = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        info.update(json.loads(r.stdout.decode().strip().splitlines()[-1]))
    except (ValueError, IndexError):
        info["error"] = r.stderr.decode("utf-8", "replace")[-300:]
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--jobs", type=int, default=4, help="runs at a time (separate processes)")
    ap.add_argument("--timeout", type=int, default=240, help="seconds per run")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: test the workloads' code only (needs --tiny)")
    ap.add_argument("--tiny", action="store_true",
                    help="tiny dimensions and 2 steps (the workloads of workloads.py)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--setting", choices=list(SETTINGS) + [CPU_SETTING], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.device == "cpu" and not a.tiny:
        ap.error("--device cpu needs --tiny (the full sizes are for the GPU)")
    os.makedirs(a.out, exist_ok=True)
    if a.worker:
        worker(a.worker, a.setting, a.out, a.device, a.tiny)
        return 0
    default_names = a.workloads == ap.get_default("workloads")
    names = [w for w in a.workloads.split(",") if w]
    if a.tiny and default_names:
        names = list(workloads.NEW_WORKLOADS)
    for w in names:
        if w not in WORKLOADS:
            ap.error("unknown workload %s (one of %s)" % (w, ", ".join(WORKLOADS)))
        if a.tiny and w not in workloads.NEW_WORKLOADS:
            ap.error("%s has no tiny size (those with one: %s)" % (w, ", ".join(workloads.NEW_WORKLOADS)))
    if a.device == "cpu":
        return cpu_check(names, a)
    started = datetime.datetime.now(datetime.timezone.utc)
    doc = {"date": started.strftime("%Y-%m-%d"), "started_utc": started.isoformat(timespec="seconds"),
           "machine": gpu_info(),
           "command": "python3 tests/gpu/collect_traces.py --out DIR --jobs %d" % a.jobs,
           "workloads": {}}
    for w in names:
        doc["workloads"][w] = {"kind": WORKLOADS[w][0], "description": WORKLOADS[w][1],
                               "trace": w + ".pickle.gz", "settings": {}}
    jobs = [(w, s) for w in names for s in SETTINGS]
    extra = ["--tiny"] if a.tiny else []
    log = open(os.path.join(a.out, "collect.log"), "w")
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as ex:
        futs = {ex.submit(launch, w, s, a.out, a.timeout, extra): (w, s) for w, s in jobs}
        for f in concurrent.futures.as_completed(futs):
            w, s = futs[f]
            res, text = f.result()
            log.write("==== %s %s\n%s\n" % (w, s, text))
            log.flush()
            res.pop("workload", None)
            res.pop("setting", None)
            doc["workloads"][w]["settings"][s] = res
            sys.stderr.write("%s %s: %s\n" % (w, s, res.get("error") or "util %.3f, %.1fs" % (
                res["utilization"], res["seconds"])))
    doc["seconds"] = round((datetime.datetime.now(datetime.timezone.utc) - started).total_seconds(), 1)
    with open(os.path.join(a.out, "pytorch-figures.json"), "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    print(json.dumps(doc, indent=1, sort_keys=True))
    return 0 if all("error" not in r for w in doc["workloads"].values()
                    for r in w["settings"].values()) else 1


def cpu_check(names, a):
    """--device cpu --tiny: each workload once, in its own worker process as on the GPU; prints
    each one's losses and exits 1 if any failed or gave a loss that is not finite."""
    failed = 0
    with open(os.path.join(a.out, "collect.log"), "w") as log:
        for w in names:
            res, text = launch(w, CPU_SETTING, a.out, a.timeout, ["--device", "cpu", "--tiny"])
            log.write("==== %s %s\n%s\n" % (w, CPU_SETTING, text))
            losses = [float.fromhex(v) for v in res.get("losses", [])]
            ok = "error" not in res and len(losses) >= 2 and all(l == l and abs(l) != float("inf")
                                                                  for l in losses)
            failed += not ok
            print("%s %s: %s" % ("ok" if ok else "FAIL", w, res.get("error") or "losses %s, %.1fs" % (
                " ".join(res.get("losses", [])), res["seconds"])), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
