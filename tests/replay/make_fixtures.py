#!/usr/bin/env python3
"""Writes the replay test fixtures in tests/replay/fixtures/: one small allocation history in
three formats that must replay identically.

  small.trace           cudalloc trace v1 (docs/trace-format.md)
  small-snapshot.pickle torch.cuda.memory._dump_snapshot schema: {'segments': [...],
                        'device_traces': [[...]]}, written with the standard pickle module as
                        _dump_snapshot does. Two blocks were live before the trace window: A is
                        still allocated at the snapshot (only in 'segments'), B is freed in the
                        trace (a free_completed with no alloc). Entries the replay must ignore
                        (free_requested, segment_alloc, oom, snapshot) are mixed in.
  small-rmm.csv         RMM logging_resource_adaptor log, with an 'allocate failure' row.

The cudalloc trace and the RMM log allocate A and B first (in address order), as the snapshot
converter does.
"""

import os
import pickle

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures")
MiB = 1 << 20

S0 = 0x0
S1 = 0x10

A = (0x7F0000000000, 5 * MiB, S0)
B = (0x7F0000600000, 2 * MiB, S0)
# (action, addr, size, stream) after the window opens
EVENTS = [
    ("alloc", 0x7F0001000000, 12 * MiB, S0),    # C
    ("alloc", 0x7F0002000000, 1000, S0),        # D
    ("free", B[0], B[1], S0),
    ("alloc", 0x7F0003000000, 40 * MiB, S0),    # E
    ("free", 0x7F0001000000, 12 * MiB, S0),     # C
    ("alloc", 0x7F0001000000, 8 * MiB, S0),     # F: C's address, reused
    ("free", 0x7F0002000000, 1000, S0),         # D
    ("alloc", 0x7F0004000000, 700, S1),         # G, another stream
    ("free", 0x7F0003000000, 40 * MiB, S0),     # E
    ("free", 0x7F0004000000, 700, S1),          # G
    ("alloc", 0x7F0005000000, 3 * MiB, S1),     # H
]


def frames(name):
    return [{"filename": "train.py", "line": 42, "name": name}]


def write_trace(path):
    rows = ["#cudalloc-trace v1",
            "ts_ns,pid,tid,device,event,stream,ptr,requested,rounded,result,hit,allocated,reserved,extra",
            "# conf: (defaults)"]
    ts = 1000
    def row(event, addr, size, stream, result="ok", extra="async=1"):
        nonlocal ts
        ts += 1000
        rows.append("%d,4242,4243,0,%s,0x%x,0x%x,%d,%d,%s,0,0,0,%s"
                    % (ts, event, stream, addr, size, size, result, extra))
    for addr, size, stream in (A, B):
        row("alloc", addr, size, stream)
    for action, addr, size, stream in EVENTS:
        row(action, addr, size if action == "alloc" else 0, stream)
        if action == "alloc" and size == 40 * MiB:
            # A segment record and a failed allocation: neither is replayed.
            row("segment_alloc", addr, size, stream, extra="")
            row("oom", 0, 80 << 30, stream, result="out_of_memory", extra="")
    # A record of another device: replayed only with --device 1.
    rows.append("%d,4242,4243,1,alloc,0x0,0x7e0000000000,4096,4096,ok,0,0,0," % (ts + 1000))
    text = "\n".join(rows) + "\n"
    text += "%d,4242,4243,0,free,0x1,0x7f00050" % (ts + 2000)  # truncated: the writer was killed
    with open(path, "w") as f:
        f.write(text)


def write_snapshot(path):
    trace = [{"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": 1, "frames": []}]
    t = 10
    for action, addr, size, stream in EVENTS:
        t += 10
        if action == "alloc":
            if size == 40 * MiB:
                trace.append({"action": "segment_alloc", "addr": addr, "size": size, "stream": stream,
                              "time_us": t, "frames": frames("segment")})
            trace.append({"action": "alloc", "addr": addr, "size": size, "stream": stream,
                          "time_us": t, "frames": frames("forward"), "compile_context": "N/A",
                          "user_metadata": ""})
        else:
            trace.append({"action": "free_requested", "addr": addr, "size": size, "stream": stream,
                          "time_us": t, "frames": frames("backward")})
            trace.append({"action": "free_completed", "addr": addr, "size": size, "stream": stream,
                          "time_us": t + 1, "frames": frames("backward")})
    trace.append({"action": "oom", "addr": 0, "size": 80 << 30, "stream": 0, "device_free": 1 << 30,
                  "time_us": t + 20, "frames": []})

    def block(addr, size, state, requested=None):
        return {"address": addr, "size": size, "requested_size": requested if requested is not None else size,
                "state": state, "frames": frames("x") if state != "inactive" else []}

    segments = [
        {"device": 0, "address": 0x7F0000000000, "total_size": 20 * MiB, "allocated_size": 5 * MiB,
         "active_size": 5 * MiB, "requested_size": 5 * MiB, "stream": 0, "segment_type": "large",
         "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
         "blocks": [block(A[0], A[1], "active_allocated"),
                    block(A[0] + A[1], 15 * MiB, "inactive", 0)]},
        {"device": 0, "address": 0x7F0001000000, "total_size": 20 * MiB, "allocated_size": 8 * MiB,
         "active_size": 8 * MiB, "requested_size": 8 * MiB, "stream": 0, "segment_type": "large",
         "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
         "blocks": [block(0x7F0001000000, 8 * MiB, "active_allocated"),
                    block(0x7F0001800000, 12 * MiB, "inactive", 0)]},
        {"device": 0, "address": 0x7F0005000000, "total_size": 20 * MiB, "allocated_size": 3 * MiB,
         "active_size": 3 * MiB, "requested_size": 3 * MiB, "stream": S1, "segment_type": "large",
         "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
         "blocks": [block(0x7F0005000000, 3 * MiB, "active_allocated"),
                    block(0x7F0005300000, 17 * MiB, "inactive", 0)]},
    ]
    snapshot = {"segments": segments, "device_traces": [trace],
                "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": None, "max_split_size": -1,
                                       "garbage_collection_threshold": 0.0,
                                       "expandable_segments": False, "release_lock_on_malloc": False,
                                       "pinned_num_register_threads": 1,
                                       "pinned_use_host_register": False,
                                       "roundup_power2_divisions": {"1": 0}}}
    with open(path, "wb") as f:
        pickle.dump(snapshot, f)


def write_rmm(path):
    rows = ["Thread,Time,Action,Pointer,Size,Stream"]
    t = 0.0
    def row(action, addr, size, stream):
        nonlocal t
        t += 0.001
        rows.append("140573312345856,%.6f,%s,0x%x,%d,0x%x" % (1700000000 + t, action, addr, size, stream))
    for addr, size, stream in (A, B):
        row("allocate", addr, size, stream)
    for action, addr, size, stream in EVENTS:
        row("allocate" if action == "alloc" else "free", addr, size, stream)
        if action == "alloc" and size == 40 * MiB:
            row("allocate failure", 0, 80 << 30, stream)
    with open(path, "w") as f:
        f.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    write_trace(os.path.join(OUT, "small.trace"))
    write_snapshot(os.path.join(OUT, "small-snapshot.pickle"))
    write_rmm(os.path.join(OUT, "small-rmm.csv"))
