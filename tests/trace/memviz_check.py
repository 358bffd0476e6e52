"""What PyTorch's memory viewer (pytorch.org/memory_viz: torch/utils/viz/MemoryViz.js, and
torch/cuda/_memory_viz.py) computes from a snapshot, redone here to check the snapshots that
`cudalloc-trace export --format torch-snapshot` writes. Written for the tests from the
viewer's documented behaviour, not copied from it:

  * the entries are annotated as the viewer does: a free_requested directly followed by the
    free_completed of the same address is one `free`;
  * the segment view at the last entry: segments as listed, active blocks found in them by
    address; reserved = the segments' sizes, allocated = the blocks' requested sizes;
  * the segment view at the first entry: the end state walked back through every entry
    (segment_alloc/free add and remove whole segments by address, segment_map/unmap grow and
    shrink segments of the same stream in place, alloc and free remove and put back blocks),
    every step checked to be possible;
  * the "Active Memory Timeline": allocations from the alloc entries (their size) and the
    active blocks of the segments not allocated in the trace (their requested size), minus
    the frees; and the "Active Cached Memory Timeline": the same over segment_alloc and
    segment_free entries and the segments;
  * segsum's rule that each segment's blocks add up to its size.

check(snapshot, device) returns a dict of the figures; a snapshot the viewer would show wrong
or fail on raises AssertionError.
"""

import bisect


def _annotated(entries):
    out = []
    for e in entries:
        a = e["action"]
        if a == "free_completed" and out and out[-1]["action"] == "free_requested" \
                and out[-1]["addr"] == e["addr"]:
            out[-1] = dict(out[-1], action="free")
            continue
        out.append(dict(e))
    return out


def _timeline(entries, segments, plot_segments):
    """(live bytes at the end, peak) of the viewer's timeline of allocations or segments."""
    alloc = "segment_alloc" if plot_segments else "alloc"
    frees = ("segment_free",) if plot_segments else ("free", "free_completed")
    live = {}        # addr -> size of an element allocated in the trace and not freed
    initially = 0    # freed in the trace without being allocated there: live at the start
    seen = set()
    deltas = []
    for e in entries:
        if e["action"] == alloc:
            live[e["addr"]] = e["size"]
            deltas.append(e["size"])
        elif e["action"] in frees:
            if e["addr"] in live:
                deltas.append(-live.pop(e["addr"]))
            else:
                initially += e["size"]
                deltas.append(-e["size"])
        seen.add(e["addr"])
    for seg in segments:
        if plot_segments:
            if seg["address"] not in live:
                initially += seg["total_size"]
        else:
            addr = seg["address"]
            for b in seg["blocks"]:
                if b["state"] == "active_allocated" and addr not in live:
                    initially += b["requested_size"]
                addr += b["size"]
    now = peak = initially
    for d in deltas:
        now += d
        peak = max(peak, now)
    assert now == initially + sum(deltas)
    return now, peak


def _segment_view_end(segments):
    by_addr = sorted((s["address"], s["total_size"], s) for s in segments)
    starts = [a for a, _, _ in by_addr]
    reserved = sum(s["total_size"] for s in segments)
    allocated = 0
    blocks = {}
    for seg in segments:
        addr = seg["address"]
        total = 0
        for b in seg["blocks"]:
            assert b["address"] == addr, ("blocks do not tile the segment", seg["address"], b)
            assert b["size"] > 0, b
            assert 0 <= b["requested_size"] <= b["size"], b
            if b["state"] == "active_allocated":
                blocks[addr] = (b["size"], b["requested_size"], seg["stream"])
                allocated += b["requested_size"]
            addr += b["size"]
            total += b["size"]
        assert total == seg["total_size"], ("segsum: blocks do not add up", seg["address"])
    for addr, (size, _, _) in blocks.items():
        i = bisect.bisect_right(starts, addr) - 1
        assert i >= 0 and addr < starts[i] + by_addr[i][1], ("block outside every segment", addr)
    return reserved, allocated, blocks


def _walk_back(entries, segments, blocks):
    """The segment view at the first entry, walked back from the end; returns (segments,
    blocks) there. segments: sorted [addr, size, stream]."""
    segs = sorted([s["address"], s["total_size"], s["stream"]] for s in segments)
    blocks = dict(blocks)

    def index_of(addr):
        for i, s in enumerate(segs):
            if s[0] == addr:
                return i
        return -1

    for e in reversed(entries):
        a, addr, size = e["action"], e["addr"], e["size"]
        if a in ("free", "free_completed"):
            assert addr not in blocks, ("a freed block is live after its free", e)
            blocks[addr] = (size, size, e["stream"])
        elif a == "free_requested":
            pass
        elif a == "alloc":
            assert addr in blocks, ("an allocation that is not live after it", e)
            del blocks[addr]
        elif a == "segment_free":
            assert index_of(addr) < 0, ("a freed segment exists after its free", e)
            bisect.insort(segs, [addr, size, e["stream"]])
        elif a == "segment_unmap":
            bisect.insort(segs, [addr, size, e["stream"]])
            i = index_of(addr)
            if i + 1 < len(segs) and addr + size == segs[i + 1][0] \
                    and segs[i + 1][2] == e["stream"]:
                segs[i][1] += segs.pop(i + 1)[1]
            if i > 0 and segs[i - 1][0] + segs[i - 1][1] == addr and segs[i - 1][2] == e["stream"]:
                segs[i - 1][1] += segs.pop(i)[1]
        elif a == "segment_alloc":
            i = index_of(addr)
            assert i >= 0, ("segment_alloc of a segment that does not exist after it", e)
            assert segs[i][1] == size, ("segment_alloc of another size than the segment", e)
            segs.pop(i)
        elif a == "segment_map":
            end = addr + size
            hit = [s for s in segs if s[0] <= addr and end <= s[0] + s[1]]
            assert hit, ("segment_map of memory no segment holds after it", e)
            s = hit[0]
            s_end = s[0] + s[1]
            if s[0] == addr:
                s[0] += size
                s[1] -= size
                if s[1] == 0:
                    segs.remove(s)
            elif s_end == end:
                s[1] -= size
            else:
                s[1] = addr - s[0]
                bisect.insort(segs, [end, s_end - end, s[2]])
        elif a in ("oom", "snapshot"):
            pass
        else:
            raise AssertionError("unknown action %r" % a)
    return segs, blocks


def check(snap, device=0):
    assert isinstance(snap, dict) and "segments" in snap and "device_traces" in snap
    segments = [s for s in snap["segments"] if s["device"] == device]
    entries = _annotated(snap["device_traces"][device] if device < len(snap["device_traces"])
                         else [])
    reserved, allocated, blocks = _segment_view_end(segments)
    start_segs, start_blocks = _walk_back(entries, segments, blocks)
    live, peak = _timeline(entries, segments, plot_segments=False)
    cached, cached_peak = _timeline(entries, segments, plot_segments=True)
    return {
        "segments": len(segments),
        "expandable_segments": sum(1 for s in segments if s["is_expandable"]),
        "reserved_end": reserved,
        "allocated_end": allocated,        # the blocks' requested bytes, as the viewer adds them
        "timeline_live_end": live,         # Active Memory Timeline, at the end
        "timeline_peak": peak,
        "cached_timeline_end": cached,     # Active Cached Memory Timeline, at the end
        "segments_at_start": len(start_segs),
        "blocks_at_start": len(start_blocks),
        "actions": sorted({e["action"] for e in entries}),
    }


def trace_truth(path):
    """From a cudalloc trace (plain text) of device 0: requested bytes live at the end, their
    peak, and the reserved bytes at the end."""
    live = {}
    now = peak = reserved = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            v = line.rstrip("\n").split(",")
            if len(v) < 14 or v[0].startswith("#") or v[0] == "ts_ns" or v[3] != "0":
                continue
            reserved = int(v[12]) if v[4] != "dropped" else reserved
            if v[9] != "ok":
                continue
            if v[4] in ("alloc", "passthrough_alloc"):
                live[v[6]] = int(v[7])
                now += int(v[7])
                peak = max(peak, now)
            elif v[4] in ("free", "passthrough_free"):
                now -= live.pop(v[6], 0)
    return {"live_requested_end": now, "peak_requested": peak, "reserved_end": reserved}
