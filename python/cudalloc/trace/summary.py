"""`cudalloc-trace summary`: what a trace says about a process's device memory."""

import collections
import heapq
import json

from .reader import fmt_bytes, phase_of, stack_pcs
from .symbols import Symbolizer, format_frame

TOP = 10


def _new_device():
    return {"peak_allocated": -1, "peak_allocated_ts_ns": 0,
            "peak_reserved": -1, "peak_reserved_ts_ns": 0,
            "final_allocated": 0, "final_reserved": 0}


def _device_totals(dev, b):
    """Peaks and final totals per device for one batch (dropped records left out)."""
    devices = set(b.device)
    if len(devices) == 1 and -1 not in devices:
        d = dev.get(b.device[0])
        if d is None:
            d = dev[b.device[0]] = _new_device()
        a, r, ts = b.allocated, b.reserved, b.ts_ns
        m = max(a)
        if m > d["peak_allocated"]:
            d["peak_allocated"], d["peak_allocated_ts_ns"] = m, ts[a.index(m)]
        m = max(r)
        if m > d["peak_reserved"]:
            d["peak_reserved"], d["peak_reserved_ts_ns"] = m, ts[r.index(m)]
        d["final_allocated"], d["final_reserved"] = a[-1], r[-1]
        return
    for device, ev, a, r, ts in zip(b.device, b.event, b.allocated, b.reserved, b.ts_ns):
        if ev == "dropped":
            continue
        d = dev.get(device)
        if d is None:
            d = dev[device] = _new_device()
        if a > d["peak_allocated"]:
            d["peak_allocated"], d["peak_allocated_ts_ns"] = a, ts
        if r > d["peak_reserved"]:
            d["peak_reserved"], d["peak_reserved_ts_ns"] = r, ts
        d["final_allocated"], d["final_reserved"] = a, r


def summarize(trace, nvtx_depth=1, symbolize=True):
    """One pass over the records; returns a dict (the --json output)."""
    counts = collections.Counter()
    dev = {}
    hits = misses = 0
    largest = []  # min-heap of (requested, -seq, info)
    miss_sizes = collections.Counter()
    alloc_sizes = collections.Counter()
    sites = {}
    phases = {}
    live = {}
    ooms = []
    dropped = 0
    lost_disk_full = 0  # `dropped` records with reason=disk_full: the file system refused them
    first_ts = last_ts = None
    seq = 0
    phase_cache = {}
    smallest_top = -1  # requested size a record must pass to enter `largest`
    for b in trace.batches():
        counts.update(b.event)
        if first_ts is None:
            first_ts = b.ts_ns[0]
        m = max(b.ts_ns)
        last_ts = m if last_ts is None or m > last_ts else last_ts
        _device_totals(dev, b)
        for ts, device, ev, stream, ptr, req, rnd, res, hit, alloc, resv, extra in zip(
                b.ts_ns, b.device, b.event, b.stream, b.ptr, b.requested, b.rounded, b.result,
                b.hit, b.allocated, b.reserved, b.extra):
            seq += 1
            if ev == "dropped":
                text = extra.get("count", "0")
                n = int(text) if text.isdigit() else 0
                if extra.get("reason") == "disk_full":
                    lost_disk_full += n
                else:
                    dropped += n
                continue
            nvtx = extra.get("nvtx") if extra else None
            if nvtx:
                phase = phase_cache.get(nvtx)
                if phase is None:
                    phase = phase_cache[nvtx] = phase_of(nvtx, nvtx_depth)
                ph = phases.get(phase)
                if ph is None:
                    ph = phases[phase] = {"allocs": 0, "bytes": 0, "frees": 0, "freed_bytes": 0,
                                          "peak_allocated": 0, "live_at_end": 0,
                                          "first_ts_ns": ts}
                if alloc > ph["peak_allocated"]:
                    ph["peak_allocated"] = alloc
            else:
                phase = ph = None
            if res != "ok":
                if ev == "oom":
                    ooms.append({"ts_ns": ts, "device": device, "requested": req,
                                 "allocated": alloc, "reserved": resv, "nvtx": nvtx})
                continue
            if ev == "alloc" or ev == "passthrough_alloc":
                if ev == "alloc":
                    if hit:
                        hits += 1
                    else:
                        misses += 1
                        miss_sizes[rnd] += 1
                    alloc_sizes[rnd] += 1
                if req >= smallest_top:
                    info = {"requested": req, "rounded": rnd, "ts_ns": ts, "device": device,
                            "stream": stream, "nvtx": nvtx, "event": ev}
                    item = (req, -seq, info)
                    if len(largest) < TOP:
                        heapq.heappush(largest, item)
                    elif item > largest[0]:
                        heapq.heapreplace(largest, item)
                    if len(largest) == TOP:
                        smallest_top = largest[0][0]
                if extra:
                    stack = extra.get("stack")
                    if stack:
                        s = sites.get(stack)
                        if s is None:
                            s = sites[stack] = [0, 0]
                        s[0] += req
                        s[1] += 1
                if ph is not None:
                    ph["allocs"] += 1
                    ph["bytes"] += req
                live[(device, ptr)] = (phase, req)
            elif ev == "free" or ev == "passthrough_free":
                owner = live.pop((device, ptr), None)
                if owner is not None and owner[0] is not None:
                    p = phases[owner[0]]
                    p["frees"] += 1
                    p["freed_bytes"] += owner[1]
    for phase, nbytes in live.values():
        if phase is not None:
            phases[phase]["live_at_end"] += nbytes
    out = _result(trace, counts, dev, hits, misses, largest, miss_sizes, alloc_sizes, ooms,
                  phases, sites, dropped, first_ts, last_ts, symbolize)
    out["lost_disk_full"] = lost_disk_full
    return out


def _result(trace, counts, dev, hits, misses, largest, miss_sizes, alloc_sizes, ooms, phases,
            sites, dropped, first_ts, last_ts, symbolize):
    allocs = hits + misses
    out = {
        "file": trace.path,
        "header": trace.header,
        "truncated": trace.truncated,
        "closed_cleanly": trace.ended,
        "records": sum(counts.values()),
        "duration_ns": (last_ts - first_ts) if first_ts is not None else 0,
        "dropped": dropped,
        "devices": {str(k): v for k, v in sorted(dev.items())},
        "counts": dict(sorted(counts.items())),
        "cache_hits": hits,
        "cache_misses": misses,
        "hit_rate": (hits / allocs) if allocs else None,
        "largest": [i for _, _, i in sorted(largest, key=lambda x: (x[0], x[1]), reverse=True)],
        "miss_sizes": [{"rounded": s, "misses": n, "allocs": alloc_sizes[s]}
                       for s, n in sorted(miss_sizes.items(), key=lambda kv: (-kv[1], -kv[0]))[:TOP]],
        "ooms": ooms,
        "phases": {k: v for k, v in sorted(phases.items(), key=lambda kv: kv[1]["first_ts_ns"])},
        "sites": [],
    }
    top_sites = sorted(sites.items(), key=lambda kv: -kv[1][0])[:TOP]
    if top_sites:
        sym = Symbolizer(trace.maps, use_addr2line=symbolize)
        pcs = [stack_pcs(k) for k, _ in top_sites]
        sym.resolve(pc for st in pcs for pc in st)
        out["symbolized"] = sym.available
        for (k, (nbytes, n)), st in zip(top_sites, pcs):
            out["sites"].append({"bytes": nbytes, "allocs": n, "stack": ["0x%x" % p for p in st],
                                 "frames": sym.frames(st)})
    return out
def _t(ns):
    return "%.6f s" % (ns / 1e9)


def print_summary(s, out):
    w = out.write
    h = s["header"]
    w("trace %s" % s["file"])
    if "pid" in h:
        w(" (pid %s)" % h["pid"])
    w("\n")
    if h.get("cmdline"):
        w("command: %s\n" % h["cmdline"])
    if "start_time" in h:
        w("started: %s\n" % h["start_time"])
    w("records: %d over %s" % (s["records"], _t(s["duration_ns"])))
    if s["truncated"]:
        w("; the last line was truncated (skipped)")
    elif not s["closed_cleanly"]:
        w("; the trace was not closed (the process died or is still running)")
    w("\n")
    if s["dropped"]:
        w("WARNING: the writer dropped %d records (its ring was full); totals below are exact, "
          "counts are not\n" % s["dropped"])
    if s.get("lost_disk_full"):
        w("WARNING: %d records lost: disk full; totals below are exact, counts are not\n"
          % s["lost_disk_full"])
    w("\n")
    if not s["devices"]:
        w("no allocator events\n")
    for d, v in s["devices"].items():
        w("device %s: peak allocated %s (%d B) at %s; peak reserved %s (%d B) at %s; "
          "at the end %s allocated, %s reserved\n" % (
              d, fmt_bytes(v["peak_allocated"]), v["peak_allocated"], _t(v["peak_allocated_ts_ns"]),
              fmt_bytes(v["peak_reserved"]), v["peak_reserved"], _t(v["peak_reserved_ts_ns"]),
              fmt_bytes(v["final_allocated"]), fmt_bytes(v["final_reserved"])))
    w("\nevents:\n")
    for k, n in s["counts"].items():
        w("  %-18s %d\n" % (k, n))
    if s["hit_rate"] is not None:
        w("cache hit rate: %.1f%% (%d hits, %d misses)\n" % (
            100.0 * s["hit_rate"], s["cache_hits"], s["cache_misses"]))
    if s["ooms"]:
        w("\nout of memory (%d):\n" % len(s["ooms"]))
        for o in s["ooms"][:TOP]:
            w("  %s device %d: %s requested with %s allocated, %s reserved%s\n" % (
                _t(o["ts_ns"]), o["device"], fmt_bytes(o["requested"]), fmt_bytes(o["allocated"]),
                fmt_bytes(o["reserved"]), (" in " + o["nvtx"]) if o["nvtx"] else ""))
    if s["largest"]:
        w("\nlargest allocations:\n")
        for i, a in enumerate(s["largest"], 1):
            w("  %2d. %s (%d B) at %s, device %d, stream %s%s%s\n" % (
                i, fmt_bytes(a["requested"]), a["requested"], _t(a["ts_ns"]), a["device"],
                "-" if a["stream"] is None else "0x%x" % a["stream"],
                (", " + a["nvtx"]) if a["nvtx"] else "",
                " (passthrough)" if a["event"] == "passthrough_alloc" else ""))
    if s["miss_sizes"]:
        w("\nsizes that miss the cache most:\n")
        w("  %26s %8s %8s\n" % ("rounded size", "misses", "allocs"))
        for m in s["miss_sizes"]:
            w("  %26s %8d %8d\n" % ("%s (%d B)" % (fmt_bytes(m["rounded"]), m["rounded"]),
                                    m["misses"], m["allocs"]))
    if s["sites"]:
        w("\nallocation sites by bytes%s:\n" % (
            "" if s.get("symbolized") else " (raw PCs: install binutils for addr2line)"))
        for i, site in enumerate(s["sites"], 1):
            w("  %2d. %s in %d allocations\n" % (i, fmt_bytes(site["bytes"]), site["allocs"]))
            for f in site["frames"][:8]:
                w("        %s\n" % format_frame(f))
    if s["phases"]:
        w("\nmemory by NVTX phase:\n")
        w("  %-24s %8s %14s %8s %14s %14s\n" % ("phase", "allocs", "bytes", "frees",
                                                "peak allocated", "live at end"))
        for name, p in s["phases"].items():
            w("  %-24s %8d %14s %8d %14s %14s\n" % (
                name[:24], p["allocs"], fmt_bytes(p["bytes"]), p["frees"],
                fmt_bytes(p["peak_allocated"]), fmt_bytes(p["live_at_end"])))


def run(trace, args, out):
    s = summarize(trace, nvtx_depth=args.nvtx_depth, symbolize=not args.no_symbols)
    if args.json:
        json.dump(s, out, indent=1, default=str)
        out.write("\n")
    else:
        print_summary(s, out)
