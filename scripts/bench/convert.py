#!/usr/bin/env python3
"""Plain convert (no -c): ch-img against qemu-img, wall time and peak
memory, in every cache mode.

Images (made once in --dir, kept for later runs): a 1 GiB raw file of
random bytes and a 1 GiB sparse raw file (random-byte extents of 64 KiB
to 1 MiB over about a quarter of it, holes between), each also as a
qcow2 made by qemu-img convert. Rows: qcow2 -> qcow2, qcow2 -> raw and
raw -> qcow2 of each, in each cache mode:

  default        no -t/-T: the output -t unsafe, the source -T writeback
  -t writeback   the output through the page cache, flushed at the end
  -t none        the output with O_DIRECT
  -T none        the source with O_DIRECT (output as default)
  -t none -T none  both with O_DIRECT

The first three run with the source in the page cache ("cached") and,
as root, again with the page cache dropped before each run ("uncached":
sync, then 3 > /proc/sys/vm/drop_caches; without root those rows are
left out). Each repeat runs ch-img and qemu-img back to back, in an
order that alternates per repeat, on a freshly removed output after a
sync (so no run writes back another's dirty pages); the
table quotes the medians of the wall time and of the peak RSS
(getrusage's ru_maxrss of the child) and the ratios ours/qemu's. The
first repeat of each row also checks that the two outputs compare
equal (qemu-img compare). The machine's load average is printed at the
start and the end.

Usage: scripts/bench/convert.py [--dir DIR] [--bin-dir DIR]
       [--repeats N] [--only SUBSTRING] [--json FILE]
e.g. scripts/bench/convert.py --repeats 5
     scripts/bench/convert.py --only "qcow2 -> raw" --repeats 3
"""

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

GIB = 1 << 30
MODES = [
    ("default", []),
    ("-t writeback", ["-t", "writeback"]),
    ("-t none", ["-t", "none"]),
    ("-T none", ["-T", "none"]),
    ("-t none -T none", ["-t", "none", "-T", "none"]),
]
# Modes whose source goes through the page cache: also run uncached.
BUFFERED_SOURCE = {"default", "-t writeback", "-t none"}
DIRECTIONS = [("qcow2", "qcow2"), ("qcow2", "raw"), ("raw", "qcow2")]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def make_random(path, size):
    with open(path, "wb") as f:
        for _ in range(size >> 20):
            f.write(os.urandom(1 << 20))


def make_sparse(path, size):
    """Random-byte extents over about a quarter of the file."""
    rng = random.Random(34)
    with open(path, "wb") as f:
        f.truncate(size)
        written = 0
        while written < size // 4:
            length = rng.randrange(1, 17) << 16
            offset = rng.randrange(0, (size - length) >> 16) << 16
            f.seek(offset)
            f.write(os.urandom(length))
            written += length


def images(d):
    """Makes the images that are missing; returns {data: {fmt: path}}."""
    out = {}
    for data, make in [("random", make_random), ("sparse", make_sparse)]:
        raw = os.path.join(d, f"{data}.raw")
        qcow2 = os.path.join(d, f"{data}.qcow2")
        if not os.path.exists(raw):
            log(f"making {raw}")
            make(raw + ".tmp", GIB)
            os.rename(raw + ".tmp", raw)
        if not os.path.exists(qcow2):
            log(f"making {qcow2}")
            subprocess.run(["qemu-img", "convert", "-O", "qcow2", raw, qcow2], check=True)
        out[data] = {"raw": raw, "qcow2": qcow2}
    return out


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def warm(path):
    with open(path, "rb") as f:
        while f.read(8 << 20):
            pass


def timed(argv):
    """Runs argv; returns (wall seconds, peak RSS in KiB)."""
    with tempfile.TemporaryFile() as err:
        start = time.monotonic()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.monotonic() - start
        code = os.waitstatus_to_exitcode(status)
        proc.returncode = code
        if code != 0:
            err.seek(0)
            sys.exit(f"convert.py: {' '.join(argv)} failed ({code}): {err.read().decode()}")
    return wall, usage.ru_maxrss


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", default="/var/tmp/ch-bench-convert", help="images and outputs (about 5 GiB)")
    ap.add_argument("--bin-dir", default="target/release", help="where ch-img is")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default="", help="rows whose name contains this")
    ap.add_argument("--json", help="also write the medians here")
    args = ap.parse_args()
    ch_img = os.path.join(args.bin_dir, "ch-img")
    if not os.access(ch_img, os.X_OK):
        sys.exit(f"convert.py: no {ch_img} (cargo build --release -p ch-img)")
    if not shutil.which("qemu-img"):
        sys.exit("convert.py: needs qemu-img (apt-get install qemu-utils)")
    os.makedirs(args.dir, exist_ok=True)
    root = os.geteuid() == 0
    if not root:
        log("not root: the uncached rows are left out (they drop the page cache)")
    imgs = images(args.dir)

    rows = []
    for data in imgs:
        for src_fmt, out_fmt in DIRECTIONS:
            for mode, flags in MODES:
                caches = ["cached", "uncached"] if mode in BUFFERED_SOURCE and root else ["cached"]
                for cache in caches:
                    name = f"{data} {src_fmt} -> {out_fmt}, {mode}, {cache}"
                    if args.only in name:
                        rows.append((name, imgs[data][src_fmt], out_fmt, flags, cache))

    log(f"load average at start: {os.getloadavg()}")
    results = {name: {"ch-img": [], "qemu-img": []} for name, *_ in rows}
    for r in range(args.repeats):
        for name, src, out_fmt, flags, cache in rows:
            outs = {}
            order = ["ch-img", "qemu-img"] if r % 2 == 0 else ["qemu-img", "ch-img"]
            for tool in order:
                out = os.path.join(args.dir, f"out-{tool}.{out_fmt}")
                if os.path.exists(out):
                    os.remove(out)
                # The other outputs' dirty pages reach the disk first.
                os.sync()
                if cache == "uncached":
                    drop_caches()
                else:
                    warm(src)
                binary = ch_img if tool == "ch-img" else "qemu-img"
                argv = [binary, "convert", *flags, "-O", out_fmt, src, out]
                results[name][tool].append(timed(argv))
                outs[tool] = out
            if r == 0:
                subprocess.run(["qemu-img", "compare", "-q", outs["ch-img"], outs["qemu-img"]], check=True)
            log(f"repeat {r + 1}: {name}: " + ", ".join(
                f"{t} {results[name][t][-1][0]:.2f} s {results[name][t][-1][1] // 1024} MiB" for t in order))
    log(f"load average at end: {os.getloadavg()}")

    print(f"convert, 1 GiB, {args.repeats} interleaved repeats, medians")
    print()
    print("| row | ch-img s | qemu-img s | time ours/qemu | ch-img MiB | qemu-img MiB | RSS ours/qemu |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    table = {}
    for name, *_ in rows:
        med = {}
        for tool in ("ch-img", "qemu-img"):
            walls = [w for w, _ in results[name][tool]]
            rss = [m for _, m in results[name][tool]]
            med[tool] = (statistics.median(walls), statistics.median(rss) / 1024)
        (cw, cm), (qw, qm) = med["ch-img"], med["qemu-img"]
        table[name] = {"ch-img": med["ch-img"], "qemu-img": med["qemu-img"]}
        print(f"| {name} | {cw:.2f} | {qw:.2f} | {cw / qw:.2f} | {cm:.0f} | {qm:.0f} | {cm / qm:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"repeats": args.repeats, "rows": table, "runs": results}, f, indent=1)


if __name__ == "__main__":
    main()
