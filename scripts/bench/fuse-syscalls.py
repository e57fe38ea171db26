#!/usr/bin/env python3
"""Syscalls and CPU per FUSE request of an export: counts that a noisy
machine does not change (the wall-clock benchmark is fuse-export.py).

For each backend (ours over /dev/fuse, ours over FUSE-over-io_uring,
qemu-storage-daemon) and each (numjobs, iodepth) cell, a daemon exports
the image, `strace -c -f -p` attaches to it, and fio runs a fixed number
of 4 KiB randrw 70/30 O_DIRECT I/Os on the exported file. Out comes a
markdown table: syscalls per fio I/O by name, and the daemon's CPU
seconds per GiB (measured in a second, untraced fio run of the same
size, so strace's cost is not in it).

Data enters as an image this script makes (qemu-img, fio) and as
strace's summary; it leaves as markdown on stdout. Needs root (mounts,
enable_uring, which it restores).

Usage: scripts/bench/fuse-syscalls.py [--bin FILE] [--dir DIR]
       [--ios N] [--format raw|qcow2] [--backends a,b] [--cells 1x1,1x64]
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
fe = __import__("fuse-export")


def strace_counts(path):
    """{syscall: calls} from an `strace -c` summary file."""
    counts = {}
    for line in open(path):
        m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)$", line)
        if m and m.group(2) != "total":
            counts[m.group(2)] = int(m.group(1))
    return counts


def fio_fixed(target, jobs, depth, ios):
    """fio on `target` for `ios` I/Os in all; returns the bytes moved."""
    out = fe.run(["fio", "--name=diag", f"--filename={target}", "--rw=randrw",
                  "--rwmixread=70", "--bs=4k", "--direct=1", "--ioengine=io_uring",
                  f"--iodepth={depth}", f"--numjobs={jobs}", "--group_reporting",
                  f"--number_ios={max(1, ios // jobs)}", "--size=256M",
                  "--output-format=json"])
    job = fe.json.loads(out[out.index("{"):])["jobs"][0]
    return job["read"]["io_bytes"] + job["write"]["io_bytes"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", default="target/release/ch-storage-daemon")
    p.add_argument("--dir", default="/var/tmp/ch-fuse-syscalls")
    p.add_argument("--ios", type=int, default=20000)
    p.add_argument("--format", default="raw")
    p.add_argument("--backends", default="ours-devfuse,ours-uring,qsd")
    p.add_argument("--cells", default="1x1,1x64")
    args = p.parse_args()
    args.size, args.formats = 256 << 20, [args.format]
    os.makedirs(args.dir, exist_ok=True)
    cells = [tuple(int(x) for x in c.split("x")) for c in args.cells.split(",")]
    rows = []
    with fe.uring_enabled():
        image, table = fe.one_format_setup(args)
        for name in args.backends.split(","):
            argv, mp = table[name]
            for jobs, depth in cells:
                with fe.Daemon(name, argv, mp) as d:
                    out = os.path.join(args.dir, f"strace-{name}-{jobs}x{depth}")
                    st = subprocess.Popen(["strace", "-c", "-f", "-o", out,
                                           "-p", str(d.proc.pid)],
                                          stderr=subprocess.DEVNULL)
                    time.sleep(1)
                    nbytes = fio_fixed(mp, jobs, depth, args.ios)
                    st.send_signal(signal.SIGINT)
                    st.wait()
                    before = d.cpu()
                    nbytes2 = fio_fixed(mp, jobs, depth, args.ios)
                    cpu = (d.cpu() - before) / (nbytes2 / (1 << 30))
                ios = nbytes / 4096
                counts = strace_counts(out)
                rows.append((name, jobs, depth, ios, counts, cpu))
                fe.log(f"{name} ({jobs},{depth}): {sum(counts.values()) / ios:.2f} syscalls/IO")
    names = sorted({k for r in rows for k in r[4]}, key=lambda k: -max(r[4].get(k, 0) for r in rows))
    print(f"syscalls per fio I/O (4k randrw 70/30, {args.ios} I/Os, {args.format}) "
          f"and daemon CPU s/GiB (untraced)\n")
    print("| backend | jobs,depth | total | " + " | ".join(names) + " | CPU s/GiB |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in names) + " | --- |")
    for name, jobs, depth, ios, counts, cpu in rows:
        per = " | ".join(f"{counts.get(k, 0) / ios:.2f}" for k in names)
        print(f"| {name} | {jobs},{depth} | {sum(counts.values()) / ios:.2f} | {per} | {cpu:.2f} |")


if __name__ == "__main__":
    main()
