#!/usr/bin/env python3
"""What grew on the heap between two moments of a heaptrack recording.

    heaptrack -o /tmp/edge target/bench-fast/edgecore --config ...   # symbols needed:
    # build with CARGO_PROFILE_BENCH_FAST_STRIP=none (bench-fast strips them by default)
    scripts/heap-growth.py /tmp/edge.zst 540 820        # live heap at 9 min vs 13.7 min

Prints the live heap at both moments and the allocation sites (the first frames that are not
allocator, std, serde or tokio internals) whose live bytes grew most, then the largest at the
end. heaptrack's own tools show peaks and leaks at exit; a long-running process that frees
everything at exit but holds more and more while it runs needs this comparison instead. The
recording may still be being written (the unfinished tail is ignored).
"""

import collections
import subprocess
import sys

# Frames skipped when naming an allocation site.
INTERNAL = (
    "alloc::", "<alloc::", "_RNvNtCs", "_RNvXs", "_RNvMs", "core::", "<core::", "std::",
    "<std::", "hashbrown", "<hashbrown", "serde_json::", "<serde_json", "_$LT$serde_json",
    "_$LT$alloc", "_$LT$core", "serde::", "serde_core::", "malloc", "realloc", "calloc",
    "__rust", "bytes::", "<bytes", "heaptrack", "?", "tokio::", "<tokio::", "_$LT$tokio",
)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    path, t1 = sys.argv[1], float(sys.argv[2]) * 1000
    t2 = float(sys.argv[3]) * 1000 if len(sys.argv) > 3 else None
    depth = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    # heaptrack's interpreted format: s(tring), i(nstruction pointer), t(race), a(llocation
    # info), +/- (allocation/free of an allocation info), c (time in ms); numbers in hex.
    dec = subprocess.Popen(["zstd", "-dcq", path], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True, errors="replace")
    strings, ips, traces, infos = [None], [None], [None], []
    live, snap, now = collections.Counter(), None, 0
    for line in dec.stdout:
        if not line.endswith("\n"):
            break
        kind, rest = line[:1], line[2:]
        if kind == "+":
            live[int(rest, 16)] += 1
        elif kind == "-":
            live[int(rest, 16)] -= 1
        elif kind == "a":
            size, trace = rest.split()
            infos.append((int(size, 16), int(trace, 16)))
        elif kind == "t":
            ip, parent = rest.split()
            traces.append((int(ip, 16), int(parent, 16)))
        elif kind == "i":
            fields = rest.split()
            ips.append(int(fields[2], 16) if len(fields) > 2 else 0)
        elif kind == "s":
            parts = rest.rstrip("\n").split(" ", 1)
            strings.append(parts[1] if len(parts) > 1 else "")
        elif kind == "c":
            now = int(rest, 16)
            if snap is None and now >= t1:
                snap = collections.Counter(live)
            if t2 is not None and now >= t2:
                break
    dec.kill()
    snap = snap or collections.Counter()

    def site(trace):
        frames = []
        while trace and len(frames) < 40:
            ip, trace = traces[trace]
            frames.append(strings[ips[ip]] if ips[ip] else "?")
        own = [f for f in frames if not f.startswith(INTERNAL)]
        return " <- ".join(own[:depth]) or " <- ".join(frames[:depth])

    def by_site(counts):
        out = collections.Counter()
        for info, n in counts.items():
            if n:
                size, trace = infos[info]
                out[site(trace)] += n * size
        return out

    before, after = by_site(snap), by_site(live)
    print("live heap: %.2f MB at %.0f s, %.2f MB at %.0f s"
          % (sum(before.values()) / 1e6, t1 / 1000, sum(after.values()) / 1e6, now / 1000))
    grew = collections.Counter({k: after[k] - before[k] for k in set(before) | set(after)})
    print("grew most:")
    for k, v in grew.most_common(15):
        print("  %+9.1f kB (%.1f -> %.1f)  %s" % (v / 1e3, before[k] / 1e3, after[k] / 1e3, k[:300]))
    print("largest at the end:")
    for k, v in after.most_common(10):
        print("  %9.1f kB  %s" % (v / 1e3, k[:300]))


if __name__ == "__main__":
    main()
