#!/usr/bin/env python3
"""Benchmark matrix: our block layer (`ch-img bench`) and device path
(`blk-bench`) beside fio (io_uring, direct) and `qemu-img bench` on the
same images, interleaved and repeated, printed as markdown tables.

Data enters as the images this script makes (qemu-img create/convert, fio
to fill the raw source) and as the JSON/text each tool prints; it leaves as
markdown tables on stdout (progress goes to stderr) and, with --json, as
every raw sample for later analysis.

Each case is a set of runs ("ours", "fio", "qemu", ...). One repeat runs
every run of the case once, in an order rotated per repeat (interleaving);
ratios are computed per repeat (ours/fio from the same repeat) and the
table quotes medians of those per-repeat ratios. A ratio whose samples
spread more than 2x (max/min) is marked "noisy".

Before/after: with --baseline-bin DIR (a second build's ch-img and
blk-bench), every case also runs "base", the same command as "ours" with
the baseline's binary, in the same rotation; the tables gain a column
ours/base (median of per-repeat ratios of the row's metric) and a summary
line per group.

Usage: scripts/bench/run-matrix.py [--quick] [--dir DIR] [--bin DIR]
       [--baseline-bin DIR] [--repeats N] [--seconds S] [--only SUBSTR]
       [--json FILE]
"""

import argparse
import json
import os
import random
import re
import resource
import shlex
import statistics
import struct
import subprocess
import sys
import time

GIB = 1 << 30
# Stride for the "same options as qemu-img" runs: 1 MiB + 4 KiB, so each
# request lands in a different 64 KiB cluster (qemu-img bench has no
# random mode; offsets wrap modulo the image size).
STRIDE = (1 << 20) + 4096


def log(msg):
    print(msg, file=sys.stderr, flush=True)


LAST_CPU = [0.0]


def run_cmd(argv, timeout):
    """Runs argv, returns stdout; raises on failure. Leaves the child's
    user+system CPU seconds in LAST_CPU[0]."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=timeout, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    LAST_CPU[0] = (after.ru_utime - before.ru_utime
                   + after.ru_stime - before.ru_stime)
    if p.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed ({p.returncode}): "
                           f"{p.stderr.strip()[-400:]}")
    return p.stdout


# ---------------------------------------------------------------- images

class Images:
    """The image set, made once per invocation (or reused with --reuse)."""

    def __init__(self, d, size, reuse):
        self.d = d
        self.size = size
        os.makedirs(d, exist_ok=True)
        self.raw = os.path.join(d, "raw.img")
        self.alloc = os.path.join(d, "alloc.qcow2")
        self.sparse = os.path.join(d, "sparse.qcow2")
        self.zlib = os.path.join(d, "zlib.qcow2")
        self.zstd = os.path.join(d, "zstd.qcow2")
        self.overlay = os.path.join(d, "overlay.qcow2")
        self.empty = os.path.join(d, "empty.qcow2")
        self.empty_raw = os.path.join(d, "empty.raw")
        if not (reuse and all(os.path.exists(p) for p in
                              (self.raw, self.alloc, self.zlib, self.zstd))):
            self.make()
        self.make_cheap()
        self.alloc_data = self.first_data_extent(self.alloc)

    @staticmethod
    def first_data_extent(image):
        """(host offset, length) of the first run of data clusters of a
        qcow2 image: a range of the file that fio may read and overwrite
        without touching metadata (qemu-img convert lays the clusters of
        the first L2 table's range out contiguously)."""
        out = run_cmd(["qemu-img", "map", "--output=json", image], 60)
        first = json.loads(out)[0]
        return first["offset"], first["length"]

    def make(self):
        log(f"making images in {self.d} ({self.size >> 20} MiB)")
        for p in (self.raw, self.alloc, self.zlib, self.zstd):
            if os.path.exists(p):
                os.unlink(p)
        # Half-compressible data in every 4 KiB chunk: no zero clusters (so
        # convert allocates every cluster) and compression has work to do.
        run_cmd(["fio", "--name=fill", f"--filename={self.raw}",
                 "--rw=write", "--bs=1M", "--direct=1", "--ioengine=io_uring",
                 f"--size={self.size}", "--buffer_compress_percentage=50",
                 "--buffer_compress_chunk=4k", "--refill_buffers",
                 "--output-format=terse"], 600)
        # -t none: written with O_DIRECT like raw.img. Where a file's blocks
        # were written through the page cache decides its write speed on
        # this host (fio 4k randwrite: 29-36 k IOPS on a buffered copy of
        # raw.img, 89-95 k on an O_DIRECT copy), so both files are written
        # the same way.
        run_cmd(["qemu-img", "convert", "-t", "none", "-O", "qcow2", "-o",
                 "cluster_size=64k", self.raw, self.alloc], 600)
        run_cmd(["qemu-img", "convert", "-c", "-O", "qcow2", "-o",
                 "cluster_size=64k,compression_type=zlib", self.raw,
                 self.zlib], 600)
        run_cmd(["qemu-img", "convert", "-c", "-O", "qcow2", "-o",
                 "cluster_size=64k,compression_type=zstd", self.raw,
                 self.zstd], 600)

    def make_cheap(self):
        for p in (self.sparse, self.overlay):
            if os.path.exists(p):
                os.unlink(p)
        run_cmd(["qemu-img", "create", "-q", "-f", "qcow2", "-o",
                 "cluster_size=64k", self.sparse, str(self.size)], 60)
        run_cmd(["qemu-img", "create", "-q", "-f", "qcow2", "-o",
                 "cluster_size=64k", "-b", self.alloc, "-F", "qcow2",
                 self.overlay], 60)

    def fresh_empty(self):
        """An empty qcow2 (preallocation=off) and an empty sparse raw file,
        recreated before every allocating-write run."""
        for p in (self.empty, self.empty_raw):
            if os.path.exists(p):
                os.unlink(p)
        run_cmd(["qemu-img", "create", "-q", "-f", "qcow2", "-o",
                 "cluster_size=64k,preallocation=off", self.empty,
                 str(self.size)], 60)
        run_cmd(["qemu-img", "create", "-q", "-f", "raw", self.empty_raw,
                 str(self.size)], 60)


# ---------------------------------------------------------------- runners
# Each runner returns (command string, metrics dict). Metrics keys:
# iops, lat_us (mean), elapsed_s, think_s (blk-bench only).

def fio_metrics(out, write):
    """The metrics of fio's JSON output (its first job, reads or writes)."""
    j = json.loads(out[out.index("{"):])["jobs"][0]
    side = j["write"] if write else j["read"]
    return {"iops": side["iops"], "lat_us": side["lat_ns"]["mean"] / 1000.0,
            "elapsed_s": side["runtime"] / 1000.0,
            "cpu_us_op": LAST_CPU[0] * 1e6 / max(1, side["total_ios"])}


class Tools:
    def __init__(self, bindir, seconds):
        self.ch_img = os.path.join(bindir, "ch-img")
        self.blk_bench = os.path.join(bindir, "blk-bench")
        self.seconds = seconds
        # Last measured rate per count-based run, to size -c for ~seconds.
        self.rates = {}

    def count_for(self, key, size, step, limit_bytes, qd=32):
        # First guess before anything was measured; later runs of the same
        # key use the rate the previous run measured.
        guess = (20000.0 if qd >= 8 else 3000.0) if size <= 65536 else 400.0
        rate = self.rates.get(key, guess)
        n = max(64, int(rate * self.seconds))
        if step and limit_bytes:
            # Keep sequential runs inside the image (no wrap) when stepping.
            n = min(n, max(64, limit_bytes // step))
        return n

    def fio(self, filename, rw, bs, qd, jobs=1, direct=True, size=None,
            runtime=None, extent=None):
        argv = ["fio", "--name=bench", f"--filename={filename}",
                f"--rw={rw}", f"--bs={bs}", f"--iodepth={qd}",
                f"--ioengine=io_uring", f"--direct={1 if direct else 0}",
                f"--numjobs={jobs}", "--group_reporting",
                "--randrepeat=0", "--norandommap",
                "--output-format=json"]
        if size is not None:
            argv.append(f"--size={size}")
        elif extent is not None:
            # Time-based within one byte range of the file.
            argv += [f"--offset={extent[0]}", f"--size={extent[1]}",
                     "--time_based", f"--runtime={runtime or self.seconds:g}"]
        else:
            argv += ["--time_based", f"--runtime={runtime or self.seconds:g}"]
        return shlex.join(argv), fio_metrics(run_cmd(argv, 600),
                                             "write" in rw)

    def fio_replay(self, iolog, qd):
        """fio replaying an iolog of reads as fast as it can (no timing),
        for at most the run length."""
        argv = ["fio", "--name=replay", f"--read_iolog={iolog}",
                "--replay_no_stall=1", f"--iodepth={qd}",
                "--ioengine=io_uring", "--direct=1",
                f"--runtime={self.seconds:g}", "--output-format=json"]
        return shlex.join(argv), fio_metrics(run_cmd(argv, 600), False)

    def qemu_bench(self, key, image, fmt, qd, size, step, write=False,
                   count=None):
        n = count or self.count_for(key, size, step, None, qd)
        argv = ["qemu-img", "bench", "-f", fmt, "-i", "io_uring", "-t",
                "none", "-d", str(qd), "-s", str(size), "-c", str(n)]
        if step:
            argv += ["-S", str(step)]
        if write:
            argv.append("-w")
        argv.append(image)
        t0 = time.monotonic()
        out = run_cmd(argv, 900)
        wall = time.monotonic() - t0
        mt = re.search(r"Run completed in ([0-9.]+) seconds", out)
        secs = float(mt.group(1)) if mt else wall
        iops = n / secs
        self.rates[key] = iops
        return shlex.join(argv), {"iops": iops, "lat_us": qd * 1e6 / iops,
                                  "elapsed_s": secs,
                                  "cpu_us_op": LAST_CPU[0] * 1e6 / n}

    def ch_bench(self, key, image, fmt, qd, size, step, write=False,
                 random=False, engine="io_uring", direct=True, count=None):
        n = count or self.count_for(key, size, step if not random else 0,
                                    None, qd)
        argv = [self.ch_img, "bench", "-f", fmt, "-i", engine, "-t",
                "none" if direct else "writeback", "-d", str(qd), "-s",
                str(size), "-c", str(n)]
        if step:
            argv += ["-S", str(step)]
        if write:
            argv.append("-w")
        if random:
            argv.append("--random")
        argv += ["--output=json", image]
        out = run_cmd(argv, 900)
        j = json.loads(out[out.index("{"):])
        self.rates[key] = j["ops_per_sec"]
        return shlex.join(argv), {"iops": j["ops_per_sec"],
                                  "lat_us": j["lat_mean_us"],
                                  "elapsed_s": j["seconds"],
                                  "cpu_us_op": LAST_CPU[0] * 1e6 / n}

    def blk(self, image, rw, bs, qd, queues=1, engine="io_uring",
            direct=True, io_size=None, think_us=0, batch=None, poll_us=0,
            halt_poll_us=0):
        argv = [self.blk_bench, "--image", image, "--engine", engine,
                "--direct", "on" if direct else "off", "--queues",
                str(queues), "--qd", str(qd), "--bs", str(bs), "--rw", rw]
        if io_size:
            argv += ["--io-size", str(io_size)]
        else:
            argv += ["--runtime", f"{self.seconds:g}"]
        if think_us:
            argv += ["--think-us", str(think_us)]
        if batch:
            argv += ["--batch", str(batch)]
        if poll_us:
            argv += ["--poll-us", str(poll_us)]
        if halt_poll_us:
            argv += ["--halt-poll-us", str(halt_poll_us)]
        argv += ["--output", "json"]
        out = run_cmd(argv, 900)
        j = json.loads(out[out.index("{"):])
        return shlex.join(argv), {"iops": j["ops_per_sec"],
                                  "lat_us": j["lat_mean_us"],
                                  "elapsed_s": j["elapsed_s"],
                                  "think_s": j.get("think_s", 0.0),
                                  "cpu_us_op": LAST_CPU[0] * 1e6
                                  / max(1, j["ops"])}


# ---------------------------------------------------------------- cases

class Case:
    """name; runs: {label: callable -> (cmd, metrics)}; ratios: list of
    (title, numerator label, denominator label, metric, target, higher)
    where higher=True means the ratio must be >= target, else <= target;
    before: called before every run (not timed); base_of: {label: label of
    the same run with the baseline's binary} (empty without
    --baseline-bin)."""

    def __init__(self, group, name, runs, ratios, before=None):
        self.group = group
        self.name = name
        self.runs = runs
        self.ratios = ratios
        self.before = before
        self.base_of = {}


def ours_and_base(runs, t, tb, ours):
    """Adds "ours" (ours(t)) and, with a baseline build tb, "base"
    (ours(tb)): the same run with the baseline's binaries. Returns the
    {ours label: base label} map for Case.base_of."""
    runs["ours"] = lambda: ours(t)
    if tb is None:
        return {}
    runs["base"] = lambda: ours(tb)
    return {"ours": "base"}


def case_with_base(group, name, t, tb, ours, others, ratios, before=None):
    """A Case whose "ours" run is ours(tools), with its baseline twin when
    tb is set; others are the runs of other tools (fio, qemu-img)."""
    runs = {}
    base_of = ours_and_base(runs, t, tb, ours)
    runs.update(others)
    c = Case(group, name, runs, ratios, before)
    c.base_of = base_of
    return c


def metric_value(m, metric):
    if metric == "stall":
        return m["elapsed_s"]
    return m[metric]


def compressed_reads(image):
    """(start, length) of the host read our engine makes for each
    compressed cluster of a qcow2 image: from the descriptor's offset
    rounded down to 512 bytes, its sector count times 512 (what an O_DIRECT
    read of a 512-byte-block file covers). Parsed from the L1 and L2
    tables."""
    with open(image, "rb") as f:
        h = f.read(104)
        cluster_bits = struct.unpack(">I", h[20:24])[0]
        l1_size = struct.unpack(">I", h[36:40])[0]
        l1_off = struct.unpack(">Q", h[40:48])[0]
        cs = 1 << cluster_bits
        f.seek(l1_off)
        l1 = struct.unpack(f">{l1_size}Q", f.read(8 * l1_size))
        x = 62 - (cluster_bits - 8)
        reads = []
        for e in l1:
            l2_off = e & 0x00fffffffffffe00
            if not l2_off:
                continue
            f.seek(l2_off)
            for d in struct.unpack(f">{cs // 8}Q", f.read(cs)):
                if d & (1 << 62):
                    off = d & ((1 << x) - 1)
                    sectors = ((d >> x) & ((1 << (cluster_bits - 8)) - 1)) + 1
                    reads.append((off & ~511, sectors * 512))
    return reads


def write_replay_log(image, path, count, seed=1):
    """A fio iolog (version 2) of `count` reads of uniformly chosen
    compressed clusters: the host I/O of 4 KiB random reads of the image,
    for fio to replay as the disk's ceiling for that exact pattern."""
    reads = compressed_reads(image)
    if not reads:
        raise ValueError(f"{image} has no compressed cluster")
    rnd = random.Random(seed)
    with open(path, "w") as o:
        o.write(f"fio version 2 iolog\n{image} add\n{image} open\n")
        for _ in range(count):
            start, length = rnd.choice(reads)
            o.write(f"{image} read {start} {length}\n")
        o.write(f"{image} close\n")
    return sum(r[1] for r in reads) / len(reads)


def block_cases(t, im, quick, tb=None):
    """Issue #3: block layer, ch-img bench vs fio and qemu-img bench (and,
    with tb, the baseline build's ch-img bench)."""
    cases = []
    rr = "randread"

    def read_case(name, image, fmt, qd, target_fio, target_qemu=None,
                  metric="iops", sync=False, higher=True, same_file=False,
                  compressed=False):
        key = name
        runs = {}
        base_of = ours_and_base(runs, t, tb, lambda tools: tools.ch_bench(
            key + "/ours", image, fmt, qd, 4096, 0, random=True))
        runs.update({
            "fio": lambda: t.fio(im.raw, rr, "4k", qd),
            "ours-strided": lambda: t.ch_bench(key + "/ours-s", image, fmt,
                                               qd, 4096, STRIDE),
            "qemu": lambda: t.qemu_bench(key + "/qemu", image, fmt, qd, 4096,
                                         STRIDE),
        })
        ratios = [("ours/fio", "ours", "fio", metric, target_fio, higher),
                  ("ours/qemu (same -d -s -S)", "ours-strided", "qemu",
                   metric, target_qemu, higher)]
        if same_file:
            runs["fio-same"] = lambda: t.fio(image, rr, "4k", qd,
                                             extent=im.alloc_data)
            ratios.insert(1, ("ours/fio (same file, data clusters)", "ours",
                              "fio-same", metric, target_fio, higher))
        if compressed:
            # Each 4 KiB read of a compressed cluster reads the whole
            # compressed cluster: fio replaying exactly those reads (same
            # offsets and lengths, QD 32) is the most this disk can give
            # the case.
            log_path = os.path.join(im.d, os.path.basename(image) +
                                    ".replay.iolog")
            mean = write_replay_log(image, log_path, 200000)
            runs["fio-replay"] = lambda: t.fio_replay(log_path, qd)
            ratios.append((f"ours/fio replaying our reads ({mean / 1024:.1f}"
                           " KiB mean; disk ceiling)", "ours", "fio-replay",
                           metric, None, higher))
        if sync:
            runs["ours-sync"] = lambda: t.ch_bench(
                key + "/sync", image, fmt, qd, 4096, 0, random=True,
                engine="sync")
            ratios.append(("io_uring/sync", "ours", "ours-sync", "iops",
                           2.0, True))
        c = Case("block", name, runs, ratios)
        c.base_of = base_of
        cases.append(c)

    read_case("raw 4k randread QD32", im.raw, "raw", 32, 0.95)
    read_case("qcow2 allocated 4k randread QD32", im.alloc, "qcow2", 32,
              0.95, 1.0, sync=True, same_file=True)
    read_case("qcow2 allocated 4k randread QD1 (mean latency)", im.alloc,
              "qcow2", 1, 1.15, None, metric="lat_us", higher=False,
              same_file=True)
    read_case("qcow2 overlay->allocated backing 4k randread QD32",
              im.overlay, "qcow2", 32, 0.85)
    read_case("qcow2 zlib-compressed 4k randread QD32", im.zlib, "qcow2",
              32, 0.15, compressed=True)
    read_case("qcow2 zstd-compressed 4k randread QD32", im.zstd, "qcow2",
              32, 0.4, compressed=True)
    if not quick:
        read_case("qcow2 sparse (unallocated) 4k randread QD32", im.sparse,
                  "qcow2", 32, None)

    # 1 MiB sequential read spanning clusters, QD 8.
    mib = 1 << 20
    cases.append(case_with_base("block", "qcow2 allocated 1M seq read QD8",
                                t, tb, lambda tools: tools.ch_bench(
                                    "seq/ours", im.alloc, "qcow2", 8, mib,
                                    mib, count=tools.count_for(
                                        "seq/ours", mib, mib, im.size)), {
        "fio": lambda: t.fio(im.raw, "read", "1M", 8),
        "fio-same": lambda: t.fio(im.alloc, "read", "1M", 8,
                                  extent=im.alloc_data),
        "qemu": lambda: t.qemu_bench("seq/qemu", im.alloc, "qcow2", 8, mib,
                                     mib, count=t.count_for(
                                         "seq/qemu", mib, mib, im.size)),
    }, [("ours/fio", "ours", "fio", "iops", 0.90, True),
        ("ours/fio (same file, data clusters)", "ours", "fio-same", "iops",
         0.90, True),
        ("ours/qemu", "ours", "qemu", "iops", None, True)]))

    # 4 KiB random write into allocated clusters, QD 32.
    cases.append(case_with_base("block", "qcow2 allocated 4k randwrite QD32",
                                t, tb, lambda tools: tools.ch_bench(
                                    "rw/ours", im.alloc, "qcow2", 32, 4096,
                                    0, write=True, random=True), {
        "fio": lambda: t.fio(im.raw, "randwrite", "4k", 32),
        # Overwrites data clusters only: the image stays valid.
        "fio-same": lambda: t.fio(im.alloc, "randwrite", "4k", 32,
                                  extent=im.alloc_data),
        "ours-strided": lambda: t.ch_bench("rw/ours-s", im.alloc, "qcow2",
                                           32, 4096, STRIDE, write=True),
        "qemu": lambda: t.qemu_bench("rw/qemu", im.alloc, "qcow2", 32, 4096,
                                     STRIDE, write=True),
    }, [("ours/fio", "ours", "fio", "iops", 0.85, True),
        ("ours/fio (same file, data clusters)", "ours", "fio-same", "iops",
         0.85, True),
        ("ours/qemu (same -d -s -S)", "ours-strided", "qemu", "iops", None,
         True)]))

    # Allocating sequential 64 KiB writes at QD 32 into an empty image.
    k64 = 65536
    n_alloc = (128 << 20) // k64 if quick else (512 << 20) // k64
    cases.append(case_with_base(
        "block", "qcow2 empty, allocating 64k seq write QD32", t, tb,
        lambda tools: tools.ch_bench("alloc/ours", im.empty, "qcow2", 32,
                                     k64, 0, write=True, count=n_alloc), {
        "fio": lambda: t.fio(im.empty_raw, "write", "64k", 32,
                             size=n_alloc * k64),
        "qemu": lambda: t.qemu_bench("alloc/qemu", im.empty, "qcow2", 32,
                                     k64, 0, write=True, count=n_alloc),
    }, [("ours/qemu", "ours", "qemu", "iops", 2.0, True),
        ("ours/fio (sparse raw)", "ours", "fio", "iops", None, True)],
        before=im.fresh_empty))
    return cases


def device_cases(t, im, quick, tb=None):
    """Issue #4 and the device matrix: blk-bench vs fio (and, with tb, the
    baseline build's blk-bench)."""
    cases = []

    def dev(name, image, rw, bs, qd, queues=1, engine="io_uring",
            direct=True, target=None, metric="iops", higher=True, poll_us=0,
            halt_poll_us=0):
        fio_rw = rw
        cases.append(case_with_base(
            "device", name, t, tb,
            lambda tools: tools.blk(image, rw, bs, qd, queues, engine,
                                    direct, poll_us=poll_us,
                                    halt_poll_us=halt_poll_us),
            {"fio": lambda: t.fio(im.raw, fio_rw, bs, qd, jobs=queues,
                                  direct=direct)},
            [("ours/fio", "ours", "fio", metric, target, higher)]))

    a = im.alloc
    dev("qcow2 alloc 4k randread 1q QD32 io_uring direct", a, "randread",
        "4k", 32, target=0.85)
    dev("qcow2 alloc 4k randread 4q x QD32 io_uring direct", a, "randread",
        "4k", 32, queues=4, target=0.85)
    dev("qcow2 alloc 4k randread 1q QD1 io_uring direct (mean latency)", a,
        "randread", "4k", 1, target=1.25, metric="lat_us", higher=False)
    # The same with the worker's busy poll (--disk poll_us=50) and a
    # driver that spins for its interrupt the way KVM halt-polls a halted
    # vCPU (200 us, KVM's default on x86) before it sleeps.
    dev("qcow2 alloc 4k randread 1q QD1 io_uring direct, poll_us=50, "
        "halt-poll 200 us (mean latency)", a, "randread", "4k", 1,
        target=1.25, metric="lat_us", higher=False, poll_us=50,
        halt_poll_us=200)
    # The stall case: think time before each batch and after each completion.
    io = 128 << 20
    cases.append(case_with_base(
        "device", "stall: 128M read, 128k req, batch 16, 1 ms think", t, tb,
        lambda tools: tools.blk(a, "read", "128k", 16, io_size=io,
                                think_us=1000, batch=16),
        {"fio": lambda: t.fio(im.raw, "read", "128k", 16, size=io)},
        [("wall/(think+fio)", "ours", "fio", "stall", 1.1, False)]))
    if quick:
        dev("qcow2 alloc 4k randread 1q QD32 sync direct", a, "randread",
            "4k", 32, engine="sync")
        return cases
    dev("qcow2 alloc 4k randread 1q QD128 io_uring direct", a, "randread",
        "4k", 128)
    dev("qcow2 alloc 4k randwrite 1q QD1 io_uring direct (mean latency)", a,
        "randwrite", "4k", 1, metric="lat_us", higher=False)
    dev("qcow2 alloc 4k randwrite 1q QD32 io_uring direct", a, "randwrite",
        "4k", 32)
    dev("qcow2 alloc 4k randwrite 1q QD128 io_uring direct", a, "randwrite",
        "4k", 128)
    dev("qcow2 alloc 4k randwrite 4q x QD32 io_uring direct", a, "randwrite",
        "4k", 32, queues=4)
    dev("qcow2 alloc 1M seq read 1q QD8 io_uring direct", a, "read", "1m", 8)
    dev("qcow2 alloc 1M seq write 1q QD8 io_uring direct", a, "write", "1m",
        8)
    dev("qcow2 alloc 4k randread 1q QD32 sync direct", a, "randread", "4k",
        32, engine="sync")
    dev("qcow2 alloc 4k randread 4q x QD32 sync direct", a, "randread", "4k",
        32, queues=4, engine="sync")
    dev("qcow2 alloc 4k randread 1q QD32 io_uring buffered", a, "randread",
        "4k", 32, direct=False)
    dev("raw 4k randread 1q QD32 io_uring direct", im.raw, "randread", "4k",
        32, target=None)
    dev("qcow2 zstd 4k randread 1q QD32 io_uring direct", im.zstd,
        "randread", "4k", 32)
    dev("qcow2 overlay 4k randread 1q QD32 io_uring direct", im.overlay,
        "randread", "4k", 32)
    # Sparse: reads of unallocated clusters (zeroes, no I/O), then random
    # writes that allocate (this case grows sparse.qcow2, so it runs last;
    # the image is made anew by the next invocation).
    dev("qcow2 sparse 4k randread 1q QD32 io_uring direct", im.sparse,
        "randread", "4k", 32)
    dev("qcow2 sparse 4k randwrite 1q QD32 io_uring direct (allocating)",
        im.sparse, "randwrite", "4k", 32)
    return cases


# ---------------------------------------------------------------- driver

def run_case(case, repeats):
    labels = list(case.runs)
    samples = {lab: [] for lab in labels}   # per repeat: metrics or None
    cmds = {}
    errors = {}
    for r in range(repeats):
        order = labels[r % len(labels):] + labels[:r % len(labels)]
        for lab in order:
            if case.before:
                case.before()
            try:
                cmd, m = case.runs[lab]()
                cmds[lab] = cmd
                samples[lab].append(m)
            except (RuntimeError, ValueError, KeyError,
                    subprocess.TimeoutExpired) as e:
                errors[lab] = str(e)
                samples[lab].append(None)
        log(f"  [{case.name}] repeat {r + 1}/{repeats}: " + ", ".join(
            f"{lab}={fmt_metric(samples[lab][-1])}" for lab in labels))
    return samples, cmds, errors


def fmt_metric(m):
    if m is None:
        return "FAILED"
    return f"{m['iops']:.0f}/s,{m['lat_us']:.0f}us"


def ratio_stats(samples, num, den, metric):
    vals = []
    for a, b in zip(samples[num], samples[den]):
        if a is None or b is None:
            continue
        if metric == "stall":
            denom = a.get("think_s", 0.0) + b["elapsed_s"]
            vals.append(a["elapsed_s"] / denom if denom else float("nan"))
        else:
            bv = metric_value(b, metric)
            if bv:
                vals.append(metric_value(a, metric) / bv)
    if not vals:
        return None, None, 0
    spread = max(vals) / min(vals) if min(vals) > 0 else float("inf")
    return statistics.median(vals), spread, len(vals)


def median_metric(samples, lab, metric):
    vals = [metric_value(m, metric) for m in samples[lab] if m is not None]
    return statistics.median(vals) if vals else None


def base_ratio(case, samples, num, metric):
    """(median, spread, n) of num/its baseline twin per repeat, in the
    row's metric (wall time for the stall metric); None when num has no
    twin."""
    twin = case.base_of.get(num)
    if twin is None:
        return None
    return ratio_stats(samples, num, twin,
                       "elapsed_s" if metric == "stall" else metric)


def fmt_base(r):
    if r is None or r[0] is None:
        return "-"
    med, spread, _ = r
    return f"{med:.3f} ({spread:.2f}x{', noisy' if spread > 2.0 else ''})"


def print_base_summary(results, group):
    """One line per group: ours/base in speed terms (latency and wall-time
    ratios inverted, so above 1 is faster than the baseline) over the
    cases, from each case's first ratio's metric."""
    speed = []
    for case, samples, _cmds, _errors in results:
        if case.group != group or not case.base_of:
            continue
        _title, num, _den, metric, _t, _h = case.ratios[0]
        r = base_ratio(case, samples, num, metric)
        if r is None or r[0] is None:
            continue
        inverted = metric in ("lat_us", "stall")
        speed.append((1.0 / r[0] if inverted else r[0], case.name))
    if not speed:
        print(f"\nours/base ({group}): no data")
        return
    geo = statistics.geometric_mean([v for v, _ in speed])
    low, low_case = min(speed)
    print(f"\nours/base ({group}), speed terms (IOPS ratio; latency and "
          f"wall-time ratios inverted; > 1 = faster than the baseline): "
          f"geometric mean {geo:.3f} over {len(speed)} cases, lowest "
          f"{low:.3f} ({low_case}).")


def fmt_cpu(v):
    return "-" if v is None else f"{v:.1f}"


def fmt_num(v, metric):
    if v is None:
        return "-"
    if metric == "lat_us":
        return f"{v:.0f} us"
    if metric == "stall":
        return f"{v:.2f} s"
    return f"{v:,.0f}"


def print_table(results, group, with_base=False):
    print(f"\n### {group} level\n")
    base_head = " ours/base (spread) |" if with_base else ""
    print("| case | ratio | median | target | verdict | spread | ours "
          f"| other | CPU us/op ours | CPU us/op other |{base_head} n |")
    print("|---|---|---:|---:|---|---:|---:|---:|---:|---:|"
          f"{'---:|' if with_base else ''}---:|")
    for case, samples, cmds, errors in results:
        if case.group != group:
            continue
        for title, num, den, metric, target, higher in case.ratios:
            med, spread, n = ratio_stats(samples, num, den, metric)
            if med is None:
                verdict = "no data"
            elif target is None:
                verdict = "-"
            elif (med >= target) if higher else (med <= target):
                verdict = "met"
            else:
                verdict = "MISSED"
            noisy = spread is not None and spread > 2.0
            unit = "iops" if metric == "iops" else metric
            print(f"| {case.name} | {title} ({unit}) | "
                  f"{'-' if med is None else f'{med:.2f}'} | "
                  f"{'-' if target is None else ('>= ' if higher else '<= ') + str(target)} | "
                  f"{verdict}{' (noisy)' if noisy else ''} | "
                  f"{'-' if spread is None else f'{spread:.1f}x'} | "
                  f"{fmt_num(median_metric(samples, num, metric), metric)} | "
                  f"{fmt_num(median_metric(samples, den, metric), metric)} | "
                  f"{fmt_cpu(median_metric(samples, num, 'cpu_us_op'))} | "
                  f"{fmt_cpu(median_metric(samples, den, 'cpu_us_op'))} | "
                  + (f"{fmt_base(base_ratio(case, samples, num, metric))} | "
                     if with_base else "")
                  + f"{n} |")
    if with_base:
        print_base_summary(results, group)
    print(f"\n#### {group} commands (last repeat)\n")
    for case, samples, cmds, errors in results:
        if case.group != group:
            continue
        print(f"- **{case.name}**")
        for lab in case.runs:
            if lab in cmds:
                print(f"  - {lab}: `{cmds[lab]}`")
            if lab in errors:
                print(f"  - {lab} ERROR: {errors[lab][:300]}")


def machine_line(d):
    fs = run_cmd(["df", "-T", d], 30).splitlines()[-1].split()[1]
    return (f"nproc {os.cpu_count()}, kernel {os.uname().release}, image "
            f"folder {d} on {fs}, fio "
            f"{run_cmd(['fio', '--version'], 30).strip()}, "
            f"{run_cmd(['qemu-img', '--version'], 30).splitlines()[0]}")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="fewer cases, 3 repeats of 1 s runs (under 3 minutes)")
    ap.add_argument("--dir", default=os.environ.get(
        "BENCH_DIR", "/var/tmp/ch-bench"), help="image folder")
    ap.add_argument("--bin", default=os.environ.get(
        "BENCH_BIN", os.path.join(os.environ.get(
            "CARGO_TARGET_DIR", os.path.join(repo, "target")), "release")),
        help="folder holding ch-img and blk-bench (release build)")
    ap.add_argument("--baseline-bin", default=None, metavar="DIR",
                    help="folder holding a second build's ch-img and "
                    "blk-bench (the \"before\" of a before/after run): "
                    "every case also runs it as \"base\", interleaved")
    ap.add_argument("--repeats", type=int, default=None,
                    help="interleaved repeats per case (default 5, quick 3)")
    ap.add_argument("--seconds", type=float, default=None,
                    help="length of each run")
    ap.add_argument("--size", default="1G", help="image size (e.g. 1G)")
    ap.add_argument("--only", default=None,
                    help="run only cases whose name contains this")
    ap.add_argument("--group", choices=["block", "device", "all"],
                    default="all")
    ap.add_argument("--reuse", action="store_true",
                    help="reuse images already in --dir")
    ap.add_argument("--json", default=None, help="write raw samples here")
    a = ap.parse_args()
    repeats = a.repeats or (3 if a.quick else 5)
    seconds = a.seconds or (1.0 if a.quick else 2.0)
    mult = {"K": 1 << 10, "M": 1 << 20, "G": GIB}
    m = re.fullmatch(r"([0-9]+)([KMG]?)", a.size.upper())
    if not m or int(m.group(1)) == 0:
        sys.exit(f"--size: expected a number with an optional K/M/G suffix, "
                 f"not {a.size!r}")
    size = int(m.group(1)) * mult.get(m.group(2), 1)

    for tool in ("ch-img", "blk-bench"):
        if not os.access(os.path.join(a.bin, tool), os.X_OK):
            sys.exit(f"{tool} not found in {a.bin}: build with "
                     f"`cargo build --release -p ch-img -p virtio-host-driver "
                     f"--bins` or pass --bin")
        if a.baseline_bin and not os.access(
                os.path.join(a.baseline_bin, tool), os.X_OK):
            sys.exit(f"{tool} not found in --baseline-bin {a.baseline_bin}: "
                     f"build the baseline tree with `cargo build --release "
                     f"-p ch-img -p virtio-host-driver --bins` (trees before "
                     f"the crate move: -p virtio-devices)")
    t0 = time.monotonic()
    load0 = os.getloadavg()[0]
    im = Images(a.dir, size, a.reuse)
    t = Tools(a.bin, seconds)
    tb = Tools(a.baseline_bin, seconds) if a.baseline_bin else None
    cases = []
    if a.group in ("block", "all"):
        cases += block_cases(t, im, a.quick, tb)
    if a.group in ("device", "all"):
        cases += device_cases(t, im, a.quick, tb)
    if a.only:
        cases = [c for c in cases if a.only in c.name]
    results = []
    for c in cases:
        log(f"case: {c.name}")
        results.append((c, *run_case(c, repeats)))
    print(f"## Benchmark matrix ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})\n")
    print(f"Machine: {machine_line(a.dir)}. Runs of ~{seconds:g} s, "
          f"{repeats} interleaved repeats; medians of per-repeat ratios; "
          f"spread = max/min of the per-repeat ratio (> 2x = noisy). "
          f"CPU us/op = the tool process's user+system CPU time per "
          f"request (blk-bench's includes its guest-driver threads). "
          f"Total {time.monotonic() - t0:.0f} s. Load average (1 min) "
          f"{load0:.1f} at start, {os.getloadavg()[0]:.1f} at end: other "
          f"work on the machine competes for the {os.cpu_count()} CPUs.")
    if tb:
        print(f"\nBefore/after: ours = {a.bin}, base = {a.baseline_bin}; "
              f"each case runs both in the same rotation. ours/base is the "
              f"median of per-repeat ratios of the row's metric (for "
              f"latency and wall time, below 1 is better).")
    for g in ("block", "device"):
        if any(c.group == g for c in cases):
            print_table(results, g, tb is not None)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump([{"case": c.name, "group": c.group, "cmds": cmds,
                        "errors": errs, "samples": s}
                       for c, s, cmds, errs in results], f, indent=1)


if __name__ == "__main__":
    main()
