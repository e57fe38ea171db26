#!/usr/bin/env python3
"""What one enabled dirty bitmap costs the virtio-blk device path:
blk-bench 4 KiB random writes at QD 32 with 1 and 4 queues, without and
with `--bitmap GRANULARITY` (one in-memory bitmap every completed write
marks, docs/live-operations.md), interleaved (the order alternates each
round), repeated; one markdown table of medians.

Data enters as the raw image this script makes (a preallocated file of
--size bytes in --dir; on tmpfs the device path's CPU is the limit, so
the marking shows most) and the JSON blk-bench prints; it leaves as the
table on stdout (progress on stderr). "worker us/op" is the CPU of the
device's queue workers (`virtio-blk-qN` threads) per request, less
sensitive than IOPS to other load on the host.

With --callgrind N it instead counts, under valgrind's callgrind, the
user-space instructions of N requests on one queue (the whole process,
every thread; the adaptive spin off, --poll-us 0), without and with the
bitmap: a count that other load on the host does not change.

Usage: scripts/bench/bitmap-cost.py [--bin DIR] [--dir DIR] [--size BYTES]
       [--queues 1,4] [--rounds 5] [--runtime S] [--granularity 64k]
       [--direct on|off] [--callgrind N]
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run_bench(argv):
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=600, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed ({p.returncode}): "
                           f"{p.stderr.strip()[-2000:]}")
    r = json.loads(p.stdout)
    workers = [t for t in r["threads"] if t["name"].startswith("virtio-blk-q")]
    worker_us = sum(t["cpu_s"] for t in workers) * 1e6 / max(r["ops"], 1)
    return r["ops_per_sec"], worker_us


def callgrind(bench, image, a):
    """Instructions per request without and with the bitmap."""
    rows = []
    for mode in ["none", "bitmap"]:
        out = f"{image}.callgrind"
        argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
                bench, "--image", image, "--format", "raw", "--engine",
                "io_uring", "--direct", a.direct, "--rw", "randwrite", "--bs",
                "4k", "--qd", "32", "--queues", "1", "--io-size",
                f"{a.callgrind * 4}k", "--runtime", "3600", "--poll-us", "0"]
        if mode == "bitmap":
            argv += ["--bitmap", a.granularity]
        p = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           text=True, timeout=3600, check=False)
        if p.returncode != 0:
            raise RuntimeError(f"{shlex.join(argv)}: {p.stderr[-2000:]}")
        total = 0
        with open(out) as f:
            for line in f:
                if line.startswith("summary:"):
                    total += int(line.split()[1])
        os.unlink(out)
        rows.append((mode, total))
        log(f"{mode}: {total} instructions")
    print(f"4 KiB randwrite, QD 32, 1 queue, {a.callgrind} requests, raw on "
          f"{a.dir} (direct={a.direct}), bitmap granularity {a.granularity}, "
          "callgrind")
    print()
    print("| bitmap | instructions | per request |")
    print("|---|---|---|")
    for mode, total in rows:
        print(f"| {mode} | {total} | {total / a.callgrind:.1f} |")
    print(f"\nratio bitmap / none: {rows[1][1] / rows[0][1]:.4f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="target/release")
    ap.add_argument("--dir", default="/dev/shm")
    ap.add_argument("--size", type=int, default=1 << 30)
    ap.add_argument("--queues", default="1,4")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runtime", type=float, default=3)
    ap.add_argument("--granularity", default="64k")
    ap.add_argument("--direct", default="off")
    ap.add_argument("--callgrind", type=int, default=0)
    a = ap.parse_args()

    image = os.path.join(a.dir, f"bitmap-cost-{os.getpid()}.raw")
    with open(image, "wb") as f:
        os.posix_fallocate(f.fileno(), 0, a.size)
    bench = os.path.join(a.bin, "blk-bench")
    if a.callgrind:
        try:
            callgrind(bench, image, a)
        finally:
            os.unlink(image)
        return 0
    samples = {}
    try:
        for rnd in range(a.rounds):
            for q in [int(x) for x in a.queues.split(",")]:
                modes = ["none", "bitmap"] if rnd % 2 == 0 else ["bitmap", "none"]
                for mode in modes:
                    argv = [bench, "--image", image, "--format", "raw",
                            "--engine", "io_uring", "--direct", a.direct,
                            "--rw", "randwrite", "--bs", "4k", "--qd", "32",
                            "--queues", str(q), "--runtime", str(a.runtime),
                            "--output", "json"]
                    if mode == "bitmap":
                        argv += ["--bitmap", a.granularity]
                    iops, worker_us = run_bench(argv)
                    samples.setdefault((q, mode), []).append((iops, worker_us))
                    log(f"round {rnd + 1} queues {q} {mode}: {iops:.0f} IOPS, "
                        f"worker {worker_us:.2f} us/op")
    finally:
        os.unlink(image)

    print(f"4 KiB randwrite, QD 32, raw on {a.dir} (direct={a.direct}), "
          f"bitmap granularity {a.granularity}, {a.rounds} rounds of "
          f"{a.runtime:g} s, medians")
    print()
    print("| queues | IOPS none | IOPS bitmap | ratio | worker us/op none | worker us/op bitmap |")
    print("|---|---|---|---|---|---|")
    for q in [int(x) for x in a.queues.split(",")]:
        none = samples[(q, "none")]
        bm = samples[(q, "bitmap")]
        i0 = statistics.median(s[0] for s in none)
        i1 = statistics.median(s[0] for s in bm)
        w0 = statistics.median(s[1] for s in none)
        w1 = statistics.median(s[1] for s in bm)
        print(f"| {q} | {i0:.0f} | {i1:.0f} | {i1 / i0:.3f} | {w0:.2f} | {w1:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
