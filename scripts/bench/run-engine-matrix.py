#!/usr/bin/env python3
"""Engine x preallocation matrix on the device path (issue 12).

For every engine {sync, threads, aio, io_uring, auto} x qcow2 preallocation
{off, metadata, falloc, full} x image state {fresh, every cluster written
once} x {4 KiB random read, 4 KiB random write}: blk-bench (the host-side
driver of the real virtio-blk device) at QD 128, O_DIRECT, one queue.
Beside it, in the same run, fio with libaio and with io_uring on a raw file
of the same size (fully written): the limit. For aio and io_uring the
table also shows how long the queue's thread spent inside each submit call
(io_submit / io_uring_enter; p50, p99, max in microseconds): native AIO
blocks there while the file system allocates.

Data enters as images this script makes (ch-img create, blk-bench to write
every cluster) and the JSON blk-bench and fio print; it leaves as markdown
tables on stdout (progress on stderr) and, with --json, every raw sample.

Every repeat runs every cell once, in an order rotated per repeat
(interleaved); the tables quote medians. A fresh image is made again before
each run of a fresh cell (its writes allocate). Ratios: ours / fio with the
same kernel interface (aio / fio-libaio, io_uring / fio-io_uring), and
threads / io_uring for random reads.

Usage: scripts/bench/run-engine-matrix.py --bin DIR [--dir DIR]
       [--size 1G] [--seconds 5] [--repeats 3] [--json FILE] [--smoke]
--smoke: 32 MiB images, 0.5 s runs, 1 repeat (checks the script works; the
numbers mean nothing).
"""

import argparse
import importlib.util
import json
import os
import shlex
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "run_matrix", os.path.join(HERE, "run-matrix.py"))
run_matrix = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_matrix)
log, run_cmd, fio_metrics = (run_matrix.log, run_matrix.run_cmd,
                             run_matrix.fio_metrics)

ENGINES = ["sync", "threads", "aio", "io_uring", "auto"]
PREALLOCS = ["off", "metadata", "falloc", "full"]
STATES = ["fresh", "written"]
PATTERNS = ["randread", "randwrite"]
QD = 128


class Bench:
    def __init__(self, args):
        self.ch_img = os.path.join(args.bin, "ch-img")
        self.blk_bench = os.path.join(args.bin, "blk-bench")
        self.dir = args.dir
        self.size = args.size
        self.seconds = args.seconds
        os.makedirs(self.dir, exist_ok=True)

    def image(self, prealloc, state, tag=""):
        """A qcow2 image of `prealloc`; `written`: every cluster written
        once through our device path (sequential 1 MiB writes)."""
        path = os.path.join(self.dir, f"m-{prealloc}-{state}{tag}.qcow2")
        if os.path.exists(path):
            os.unlink(path)
        run_cmd([self.ch_img, "create", "-q", "-f", "qcow2", "-o",
                 f"preallocation={prealloc}", path, str(self.size)], 600)
        if state == "written":
            run_cmd([self.blk_bench, "--image", path, "--format", "qcow2",
                     "--engine", "io_uring", "--direct", "on", "--qd", "8",
                     "--bs", "1m", "--rw", "write", "--io-size",
                     str(self.size), "--runtime", "600"], 1200)
        return path

    def raw(self):
        path = os.path.join(self.dir, "m-limit.raw")
        if not os.path.exists(path) or os.path.getsize(path) != self.size:
            run_cmd(["fio", "--name=fill", f"--filename={path}",
                     "--rw=write", "--bs=1M", "--direct=1",
                     "--ioengine=io_uring", f"--size={self.size}",
                     "--output-format=json"], 1200)
        return path

    def ours(self, image, engine, rw):
        argv = [self.blk_bench, "--image", image, "--format", "qcow2",
                "--engine", engine, "--direct", "on", "--qd", str(QD),
                "--bs", "4k", "--rw", rw, "--runtime", f"{self.seconds:g}",
                "--output", "json"]
        j = json.loads(run_cmd(argv, 600))
        return shlex.join(argv), {
            "iops": j["ops_per_sec"], "lat_us": j["lat_mean_us"],
            "submit_p50_us": j["submit_p50_us"],
            "submit_p99_us": j["submit_p99_us"],
            "submit_max_us": j["submit_max_us"]}

    def fio(self, raw, ioengine, rw):
        argv = ["fio", "--name=limit", f"--filename={raw}", f"--rw={rw}",
                "--bs=4k", f"--iodepth={QD}", f"--ioengine={ioengine}",
                "--direct=1", "--randrepeat=0", "--norandommap",
                "--time_based", f"--runtime={self.seconds:g}",
                "--output-format=json"]
        return shlex.join(argv), fio_metrics(run_cmd(argv, 600),
                                             "write" in rw)


def cells():
    for p in PREALLOCS:
        for st in STATES:
            for rw in PATTERNS:
                for e in ENGINES:
                    yield ("ours", p, st, rw, e)
    for rw in PATTERNS:
        for e in ["libaio", "io_uring"]:
            yield ("fio", None, None, rw, e)


def run(b, repeats):
    samples = {}
    commands = {}
    all_cells = list(cells())
    written = {p: b.image(p, "written", "-keep") for p in PREALLOCS}
    raw = b.raw()
    for r in range(repeats):
        shift = (r * 7) % len(all_cells)
        for c in all_cells[shift:] + all_cells[:shift]:
            kind, p, st, rw, e = c
            log(f"repeat {r + 1}/{repeats}: {kind} {p or ''} {st or ''} "
                f"{rw} {e}")
            if kind == "fio":
                cmd, m = b.fio(raw, e, rw)
            else:
                # A write run changes the image: a fresh cell gets a new
                # image each time; a written one stays written.
                img = b.image(p, "fresh") if st == "fresh" else written[p]
                cmd, m = b.ours(img, e, rw)
            samples.setdefault(c, []).append(m)
            commands[c] = cmd
    return samples, commands


def med(samples, c, key):
    vals = [m[key] for m in samples.get(c, []) if key in m]
    return statistics.median(vals) if vals else None


def fmt(v, digits=0):
    return "-" if v is None else f"{v:.{digits}f}"


def print_tables(samples, b):
    print(f"\n### Engine x preallocation, 4 KiB random, QD {QD}, O_DIRECT, "
          f"one queue, image {b.size} bytes, {b.seconds:g} s runs\n")
    fio = {(rw, e): med(samples, ("fio", None, None, rw, e), "iops")
           for rw in PATTERNS for e in ["libaio", "io_uring"]}
    head = ("| prealloc | state | pattern | " +
            " | ".join(f"{e} IOPS" for e in ENGINES) +
            " | aio / fio-libaio | io_uring / fio-io_uring"
            " | threads / io_uring |")
    print(head)
    print("|" + "---|" * (3 + len(ENGINES) + 3))
    for p in PREALLOCS:
        for st in STATES:
            for rw in PATTERNS:
                iops = {e: med(samples, ("ours", p, st, rw, e), "iops")
                        for e in ENGINES}

                def ratio(a, bb):
                    return (fmt(a / bb, 2) if a is not None and bb
                            else "-")
                print(f"| {p} | {st} | {rw} | " +
                      " | ".join(fmt(iops[e]) for e in ENGINES) +
                      f" | {ratio(iops['aio'], fio[(rw, 'libaio')])}"
                      f" | {ratio(iops['io_uring'], fio[(rw, 'io_uring')])}"
                      f" | {ratio(iops['threads'], iops['io_uring'])} |")
    print("\nfio on a raw file of the same size (the limit): " +
          ", ".join(f"{rw} {e} {fmt(fio[(rw, e)])} IOPS"
                    for rw in PATTERNS for e in ["libaio", "io_uring"]))
    print("\n### Time inside the submit call (io_submit / io_uring_enter), "
          "us: p50 / p99 / max\n")
    print("| prealloc | state | pattern | aio | io_uring |")
    print("|---|---|---|---|---|")
    for p in PREALLOCS:
        for st in STATES:
            for rw in PATTERNS:
                def times(e):
                    c = ("ours", p, st, rw, e)
                    return " / ".join(fmt(med(samples, c, k), 1) for k in
                                      ["submit_p50_us", "submit_p99_us",
                                       "submit_max_us"])
                print(f"| {p} | {st} | {rw} | {times('aio')} | "
                      f"{times('io_uring')} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True,
                    help="folder with release ch-img and blk-bench")
    ap.add_argument("--dir", default=os.environ.get(
        "BENCH_DIR", "/var/tmp/ch-engine-bench"), help="image folder")
    ap.add_argument("--size", default=str(1 << 30),
                    help="image size in bytes")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None, help="write raw samples here")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny sizes and runs: checks the script only")
    args = ap.parse_args()
    if args.smoke:
        args.size, args.seconds, args.repeats = str(32 << 20), 0.5, 1
    args.size = int(args.size)
    b = Bench(args)
    samples, commands = run(b, args.repeats)
    print_tables(samples, b)
    print("\nCommands (last repeat):\n")
    for c in sorted(commands, key=str)[:3]:
        print(f"    {commands[c]}")
    print("    ... (every cell: blk-bench --engine E on the cell's image)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"cell": list(map(str, c)), "samples": s,
                        "command": commands[c]}
                       for c, s in samples.items()], f, indent=1)


if __name__ == "__main__":
    main()
