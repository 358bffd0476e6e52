"""PyTorch CUDA tensors shared between processes with torch.multiprocessing.

    python3 tests/gpu/torch_ipc.py

A producer hands CUDA tensors to a consumer process through a queue (the consumer opens each
one's IPC handle), in both directions: the parent producing for a spawned child (actor and
learner) and a child producing for the parent (a DataLoader worker). The consumer checks the
values, writes into the tensor in place, and the producer checks it sees that write. The
tensors are made between others, so that they do not start their allocator's segments.
Prints one line per direction, the same natively and under cudalloc; exits 1 on a mismatch and
never waits more than a minute for the other side.
"""
import sys

import torch
import torch.multiprocessing as mp

N = 8
TIMEOUT = 60


def make(i):
    pad = torch.empty(1000 + 37 * i, device="cuda")  # the shared tensor does not start a segment
    t = torch.arange(4096 * (i + 1), device="cuda", dtype=torch.float32) * (i + 1)
    del pad
    return t


def consume(q_in, q_out):
    total = 0.0
    for _ in range(N):
        i, t = q_in.get(timeout=TIMEOUT)
        expected = torch.arange(4096 * (i + 1), device="cuda", dtype=torch.float32) * (i + 1)
        if not torch.equal(t, expected):
            q_out.put(("bad", i))
            return
        total += float(t.sum())
        t.add_(1.0)  # the producer must see this write
        torch.cuda.synchronize()
        del t
        q_out.put(("ok", i))
    q_out.put(("total", total))


def produce(q_out, q_back):
    kept = []
    for i in range(N):
        t = make(i)
        kept.append(t)
        q_out.put((i, t))
        status, j = q_back.get(timeout=TIMEOUT)
        if status != "ok" or j != i:
            return None
        torch.cuda.synchronize()
        expected = torch.arange(4096 * (i + 1), device="cuda", dtype=torch.float32) * (i + 1) + 1.0
        if not torch.equal(t, expected):
            return None
    status, total = q_back.get(timeout=TIMEOUT)
    return total if status == "total" else None


def child_produces(q_out, q_back, q_result):
    q_result.put(produce(q_out, q_back))


def main():
    ctx = mp.get_context("spawn")
    # The parent produces, a child consumes.
    q_out, q_back = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=consume, args=(q_out, q_back))
    p.start()
    total = produce(q_out, q_back)
    p.join(TIMEOUT)
    ok1 = total is not None and p.exitcode == 0
    print(f"parent_to_child ok={ok1} total={total}")
    # A child produces, the parent consumes.
    q_out, q_back, q_result = ctx.Queue(), ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=child_produces, args=(q_out, q_back, q_result))
    p.start()
    consume(q_out, q_back)
    total = q_result.get(timeout=TIMEOUT)
    p.join(TIMEOUT)
    ok2 = total is not None and p.exitcode == 0
    print(f"child_to_parent ok={ok2} total={total}")
    return 0 if ok1 and ok2 else 1


if __name__ == "__main__":
    sys.exit(main())
