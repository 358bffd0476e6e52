#!/usr/bin/env python3
"""Generates data/traces/demo-training.trace: the allocations of a simulated transformer
training loop, written in cudalloc's trace format v1 (docs/trace-format.md).

The program modelled: an 8-layer decoder-only transformer (d_model 1024, 16 heads, vocabulary
32000) trained with mixed precision (bf16 activations, fp32 master weights) and Adam, on
batches of 8 sequences whose length varies from step to step (128..1024 tokens), with
PyTorch's allocator off so each tensor is one cudaMallocAsync/cudaFreeAsync on the compute
stream (input batches arrive on a copy stream), plus the library workspaces that are plain
cudaMalloc. Per step:
  forward   per layer: the bf16 weight casts and the saved activations (layer norms, qkv,
            attention output and logsumexp, MLP in/out, dropout masks) grow with the sequence
            length; temporaries (attention workspace, residual sums) come and go;
  loss      logits and their fp32 upcast for the cross entropy (the largest tensors);
  backward  layers in reverse: gradient temporaries come and go, the layer's saved activations
            and weight casts are freed, parameter gradients are allocated (fp32, once per step);
  optimizer Adam states (allocated at the first step), foreach-update temporaries, then
            zero_grad(set_to_none=True) frees the gradients.
Every 8 steps an evaluation forward (no grad: activations freed as soon as used).

The op stream is replayed by cudalloc-replay --write-trace, so the trace's allocated/reserved/
hit/segment columns are what cudalloc's allocator (default settings, or --conf) would have
recorded; the trace then gets the `# end` line of a cleanly closed trace. Rerun it whenever the
allocator's policy changes, or the trace's totals go stale against a replay of it.

--nvtx adds each record's NVTX phase (forward, loss, backward, optimizer, eval; batch copies on
a second thread, `load`), as a trace_nvtx:true trace has them: the benchmark traces of
scripts/bench-trace-tools use it (--steps 1215 gives about a million records).

    python3 tools/make_demo_trace.py [--replay-bin build/tools/cudalloc-replay] [--steps 24]
        [--seed 7] [-o data/traces/demo-training.trace] [--ops-only] [--nvtx] [--conf S]
        [--limit SIZE]
"""

import argparse
import os
import random
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

COMPUTE = "0x0"
COPY = "0x7f3a5c000e40"  # a side stream for host-to-device copies of the batches
NO_STREAM = "-"
MAIN_TID, LOADER_TID = 1, 2


class Program:
    def __init__(self):
        self.ops = []
        self.phases = []   # per op: (phase, thread)
        self.phase = "setup"
        self.next_id = 1
        self.live = {}

    def _op(self, text, stream):
        self.ops.append(text)
        self.phases.append(("load", LOADER_TID) if stream == COPY else (self.phase, MAIN_TID))

    def alloc(self, nbytes, stream=COMPUTE, is_async=True):
        i = self.next_id
        self.next_id += 1
        self.live[i] = stream
        self._op("a %d %d %s%s" % (i, nbytes, stream, " async" if is_async else ""), stream)
        return i

    def free(self, i, stream=None, is_async=True):
        s = self.live.pop(i)
        stream = stream or s
        self._op("f %d %s%s" % (i, stream, " async" if is_async and stream != NO_STREAM else ""),
                 stream)

    def temp(self, nbytes, stream=COMPUTE):
        self.free(self.alloc(nbytes, stream))


def generate(steps, seed):
    rng = random.Random(seed)
    p = Program()
    d, heads, layers, vocab, batch, ff = 1024, 16, 8, 32000, 8, 4096
    f32, bf16 = 4, 2

    # Library workspaces: plain cudaMalloc, alive for the whole run.
    p.alloc(4 * 2**20 + 8192, NO_STREAM, False)    # cuBLAS workspace
    p.alloc(32 * 2**20, NO_STREAM, False)          # cuBLASLt workspace
    p.alloc(1 * 2**20, NO_STREAM, False)           # cuRAND states

    # Parameters (fp32 master weights).
    layer_shapes = [3 * d * d, 3 * d, d * d, d, d, d, d, d, ff * d, ff, d * ff, d]
    embed = p.alloc(vocab * d * f32)
    pos = p.alloc(2048 * d * f32)
    params = [embed, pos]
    for _ in range(layers):
        for n in layer_shapes:
            params.append(p.alloc(n * f32))
    params += [p.alloc(d * f32), p.alloc(d * f32)]  # final layer norm
    param_sizes = [vocab * d, 2048 * d] + layer_shapes * layers + [d, d]
    adam = None

    def forward(seq, train):
        p.phase = "forward" if train else "eval"
        tokens = batch * seq
        ids = p.alloc(tokens * 8, COPY)       # input ids (int64), copied on the side stream
        labels = p.alloc(tokens * 8, COPY)
        saved = []                           # per layer: what backward needs
        x = p.alloc(tokens * d * bf16)       # embeddings
        for _ in range(layers):
            keep = []
            w_qkv, w_o = p.alloc(3 * d * d * bf16), p.alloc(d * d * bf16)
            w_fc1, w_fc2 = p.alloc(ff * d * bf16), p.alloc(d * ff * bf16)
            weights = [w_qkv, w_o, w_fc1, w_fc2]
            ln1 = p.alloc(tokens * d * bf16)
            stats1 = p.alloc(tokens * 2 * f32)
            qkv = p.alloc(tokens * 3 * d * bf16)
            p.temp(tokens * 3 * d * bf16)                  # q/k/v transposed copies
            attn = p.alloc(tokens * d * bf16)
            lse = p.alloc(batch * heads * seq * f32)       # softmax logsumexp
            p.temp(batch * heads * ((seq + 127) // 128) * 128 * f32 * 4)  # kernel workspace
            proj = p.alloc(tokens * d * bf16)
            drop1 = p.alloc(tokens * d)                    # dropout mask (bool)
            x2 = p.alloc(tokens * d * bf16)                # residual
            ln2 = p.alloc(tokens * d * bf16)
            stats2 = p.alloc(tokens * 2 * f32)
            h = p.alloc(tokens * ff * bf16)
            g = p.alloc(tokens * ff * bf16)                # gelu
            out = p.alloc(tokens * d * bf16)
            drop2 = p.alloc(tokens * d)
            x3 = p.alloc(tokens * d * bf16)
            keep = [ln1, stats1, qkv, attn, lse, proj, drop1, ln2, stats2, h, g, out, drop2]
            if train:
                saved.append((keep, weights, x))
            else:
                for t in keep + weights + [x]:
                    p.free(t)
            p.free(x2)
            x = x3
        if train:
            p.phase = "loss"
        xf = p.alloc(tokens * d * bf16)                    # final layer norm
        logits = p.alloc(tokens * vocab * bf16)
        up = p.alloc(tokens * vocab * f32)                 # fp32 upcast for cross entropy
        loss = p.alloc(4)
        p.free(ids, COMPUTE)                               # freed on the stream that used it
        return saved, [x, xf, logits, up, loss], labels

    for step in range(steps):
        seq = rng.choice([128, 192, 256, 384, 512, 640, 768, 1024])
        tokens = batch * seq
        saved, head, labels = forward(seq, True)
        x, xf, logits, up, loss = head
        # Backward through the loss and the head.
        p.phase = "backward"
        dlogits = p.alloc(tokens * vocab * bf16)
        p.free(up)
        p.free(logits)
        p.free(loss)
        p.free(labels, COMPUTE)
        grads = {}
        g_embed = p.alloc(vocab * d * f32)
        dx = p.alloc(tokens * d * bf16)
        p.free(dlogits)
        p.free(xf)
        p.free(x)
        for li in reversed(range(layers)):
            keep, weights, x_in = saved[li]
            ln1, stats1, qkv, attn, lse, proj, drop1, ln2, stats2, h, g, out, drop2 = keep
            d_g = p.alloc(tokens * ff * bf16)
            p.free(drop2)
            p.free(out)
            d_h = p.alloc(tokens * ff * bf16)
            p.free(d_g)
            p.free(g)
            p.free(h)
            d_ln2 = p.alloc(tokens * d * bf16)
            p.free(d_h)
            p.temp(tokens * 2 * f32)
            p.free(stats2)
            p.free(ln2)
            d_x2 = p.alloc(tokens * d * bf16)
            p.free(d_ln2)
            p.free(drop1)
            p.free(proj)
            d_attn = p.alloc(tokens * d * bf16)
            p.temp(batch * heads * seq * f32)              # delta
            d_qkv = p.alloc(tokens * 3 * d * bf16)
            p.free(d_attn)
            p.free(lse)
            p.free(attn)
            p.free(qkv)
            d_ln1 = p.alloc(tokens * d * bf16)
            p.free(d_qkv)
            p.free(stats1)
            p.free(ln1)
            new_dx = p.alloc(tokens * d * bf16)
            p.free(d_ln1)
            p.free(d_x2)
            p.free(dx)
            p.free(x_in)
            dx = new_dx
            for w in weights:
                p.free(w)
            for k, n in enumerate(layer_shapes):             # fp32 parameter gradients
                grads[(li, k)] = p.alloc(n * f32)
                if k in (0, 8, 10):
                    p.temp(n * bf16)                       # bf16 weight gradient before upcast
        g_pos = p.alloc(2048 * d * f32)
        p.free(dx)
        g_final = [p.alloc(d * f32), p.alloc(d * f32)]
        # Optimizer: Adam states once, then a temporary per parameter update.
        p.phase = "optimizer"
        if adam is None:
            adam = [(p.alloc(n * f32), p.alloc(n * f32)) for n in param_sizes]
        for _ in range(layers + 1):                        # foreach Adam: one chunk per layer
            p.temp(sum(layer_shapes) * f32)
        p.temp(4 * len(param_sizes) * 8)                   # grad norm partials
        # zero_grad(set_to_none=True)
        for gi in [g_embed, g_pos] + list(grads.values()) + g_final:
            p.free(gi)
        if (step + 1) % 8 == 0:
            _, head, labels = forward(rng.choice([256, 512, 1024]), False)
            for t in head:
                p.free(t)
            p.free(labels, COMPUTE)
    return p


def finish_trace(path, program, nvtx):
    """Gives the replay's trace what the writer of a cleanly closed trace adds: the `# end`
    line, and with nvtx the phase (and thread) of each record's op (ts_ns is op index * 1000)."""
    tmp = path + ".tmp"
    records = 0
    with open(path, encoding="utf-8") as src, open(tmp, "w", encoding="utf-8") as dst:
        for line in src:
            if line.startswith("#") or line.startswith("ts_ns,"):
                dst.write(line)
                continue
            records += 1
            if nvtx:
                fields = line.rstrip("\n").split(",")
                phase, tid = program.phases[int(fields[0]) // 1000]
                fields[2] = str(tid)
                fields[13] = ";".join(x for x in (fields[13], "nvtx=" + phase) if x)
                line = ",".join(fields) + "\n"
            dst.write(line)
        dst.write("# end records=%d dropped=0\n" % records)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replay-bin", default=os.path.join(ROOT, "build", "tools", "cudalloc-replay"))
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("-o", "--output", default=os.path.join(ROOT, "data", "traces", "demo-training.trace"))
    ap.add_argument("--ops-only", action="store_true", help="print the op stream instead")
    ap.add_argument("--nvtx", action="store_true", help="NVTX phases and a loader thread")
    ap.add_argument("--conf", default=None, help="CUDALLOC_CONF setting of the replay")
    ap.add_argument("--limit", default=None, help="memory limit of the replay (e.g. 4.5GiB)")
    a = ap.parse_args()
    program = generate(a.steps, a.seed)
    ops = "".join(op + "\n" for op in program.ops)
    if a.ops_only:
        sys.stdout.write(ops)
        return 0
    cmd = [a.replay_bin, "--write-trace", a.output, "--label", "demo"]
    if a.conf is not None:
        cmd += ["--conf", a.conf]
    if a.limit is not None:
        cmd += ["--limit", a.limit]
    r = subprocess.run(cmd + ["-"], input=ops.encode(), stdout=subprocess.DEVNULL)
    if r.returncode != 0:
        sys.stderr.write("make_demo_trace: cudalloc-replay failed (%d)\n" % r.returncode)
        return 1
    finish_trace(a.output, program, a.nvtx)
    print("wrote %s (%d bytes)" % (a.output, os.path.getsize(a.output)))
    return 0

if __name__ == "__main__":
    sys.exit(main())
