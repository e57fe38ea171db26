#!/usr/bin/env python3
"""Engine x preallocation matrix on the device path (issue 12).

For every engine {sync, threads, aio, io_uring, auto} x qcow2 preallocation
{off, metadata, falloc, full} x image state {fresh, every cluster written
once} x {4 KiB random read, 4 KiB random write}: blk-bench (the host-side
driver of the real virtio-blk device) at QD 128, O_DIRECT, one queue.
Beside it, in the same run, fio with libaio and with io_uring on raw files
of the same size: the limit. For aio, io_uring and auto the tables also
show how long the queue's thread spent inside each submit call
(io_submit / io_uring_enter; p50, p99, max in microseconds) and how many
entries a call carried: native AIO blocks there while the file system
allocates.

Fair references: each cell is compared with fio on a raw file in the same
allocation state as the cell's data clusters:
  sparse  - a fresh `off`/`metadata` image (holes; writes allocate);
  falloc  - a fresh `falloc` image (unwritten extents; writes convert);
  written - a `full` image and every `written` image (data blocks).
The sparse and falloc raw files are made again before every fio run, as
the fresh images are before every run of ours.

Image hygiene (why: the first run compared `full` cells, each made right
after ch-img had written a 1 GiB image of zeroes, with fio on a file
written minutes before, and `full` writes came out at 0.48 x fio for
every engine although the image's metadata and syscalls were the same as
`falloc written`'s at 1.03 x): every image and raw file is fsynced and
dropped from the page cache after it is made, `sync` runs before every
measured run, and the run waits --settle seconds after the bulk writes
that make the written images. The `full` image is made once per run and
reused by its fresh cells: its clusters are allocated and its blocks
written whatever its content, so a write run does not change its state.

Data enters as images this script makes (ch-img create, blk-bench to write
every cluster) and the JSON blk-bench and fio print; it leaves as markdown
tables on stdout (progress on stderr) and, with --json, every raw sample.

Every repeat runs every selected cell once, in an order rotated per repeat
(interleaved); the tables quote medians (and min-max of the IOPS).

Usage: scripts/bench/run-engine-matrix.py --bin DIR [--dir DIR]
       [--size BYTES] [--seconds 3] [--repeats 3] [--settle 30]
       [--engines a,b] [--preallocs a,b] [--states a,b] [--patterns a,b]
       [--json FILE] [--smoke]
--smoke: 32 MiB images, 0.5 s runs, 1 repeat, no settling (checks the
script works; the numbers mean nothing).
A full run (92 cells) takes about 92 x (seconds + 0.5) s per repeat plus
the images: 3 repeats of 3 s runs on 1 GiB images about 18 minutes. It
first deletes its own files (m-*.qcow2, m-*.raw) in --dir and needs about
10 x --size bytes free there.
"""

import argparse
import importlib.util
import json
import os
import shlex
import statistics
import time

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "run_matrix", os.path.join(HERE, "run-matrix.py"))
run_matrix = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_matrix)
log, run_cmd, fio_metrics = (run_matrix.log, run_matrix.run_cmd,
                             run_matrix.fio_metrics)

ENGINES = ["sync", "threads", "aio", "io_uring", "auto"]
SUBMIT_ENGINES = ["aio", "io_uring", "auto"]
PREALLOCS = ["off", "metadata", "falloc", "full"]
STATES = ["fresh", "written"]
PATTERNS = ["randread", "randwrite"]
FIO_ENGINES = ["libaio", "io_uring"]
RAW_STATES = ["sparse", "falloc", "written"]
QD = 128


def raw_state(prealloc, state):
    """The raw-file state fio is compared in for a cell (module docs)."""
    if state == "written" or prealloc == "full":
        return "written"
    return "falloc" if prealloc == "falloc" else "sparse"


def settle_file(path):
    """fsync `path` and drop it from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


class Bench:
    def __init__(self, args):
        self.ch_img = os.path.join(args.bin, "ch-img")
        self.blk_bench = os.path.join(args.bin, "blk-bench")
        self.dir = args.dir
        self.size = args.size
        self.seconds = args.seconds
        os.makedirs(self.dir, exist_ok=True)
        # This script's files from earlier runs (other names included).
        for name in os.listdir(self.dir):
            if name.startswith("m-") and name.endswith((".qcow2", ".raw")):
                os.unlink(os.path.join(self.dir, name))
        # Written images, the full image, the written raw file, one fresh
        # image and one fresh raw file at a time, and room to spare.
        need = 10 * self.size
        st = os.statvfs(self.dir)
        if st.f_bavail * st.f_frsize < need:
            raise SystemExit(
                f"{self.dir}: {st.f_bavail * st.f_frsize >> 20} MiB free, "
                f"the run needs about {need >> 20} MiB")

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
        settle_file(path)
        return path

    def raw(self, state):
        """A raw file of the run's size: `written` once per run (fio,
        sequential 1 MiB O_DIRECT writes), `sparse`/`falloc` made again
        on every call."""
        path = os.path.join(self.dir, f"m-limit-{state}.raw")
        if state == "written":
            if not os.path.exists(path) or os.path.getsize(path) != self.size:
                run_cmd(["fio", "--name=fill", f"--filename={path}",
                         "--rw=write", "--bs=1M", "--direct=1",
                         "--ioengine=io_uring", f"--size={self.size}",
                         "--output-format=json"], 1200)
        else:
            if os.path.exists(path):
                os.unlink(path)
            with open(path, "wb") as f:
                if state == "falloc":
                    os.posix_fallocate(f.fileno(), 0, self.size)
                else:
                    f.truncate(self.size)
        settle_file(path)
        return path

    def ours(self, image, engine, rw):
        argv = [self.blk_bench, "--image", image, "--format", "qcow2",
                "--engine", engine, "--direct", "on", "--qd", str(QD),
                "--bs", "4k", "--rw", rw, "--runtime", f"{self.seconds:g}",
                "--output", "json"]
        j = json.loads(run_cmd(argv, 600))
        m = {"iops": j["ops_per_sec"], "lat_us": j["lat_mean_us"],
             "cpu_us_op": run_matrix.LAST_CPU[0] * 1e6 / max(1, j["ops"])}
        # Per thread (blk-bench's `threads`): the device's queue worker
        # and the driver, CPU us and sleeps (voluntary switches) per
        # request.
        for t in j.get("threads", []):
            role = "worker" if t["name"].startswith("virtio-blk") else "driver"
            m[f"{role}_cpu_us_op"] = t["cpu_us_per_op"]
            m[f"{role}_sleeps_kop"] = t["voluntary_switches_per_op"] * 1000
        for k in ["submit_calls", "submit_p50_us", "submit_p99_us",
                  "submit_max_us", "submit_entries_p50",
                  "submit_entries_max", "submit_by_entries"]:
            if k in j:
                m[k] = j[k]
        return shlex.join(argv), m

    def fio(self, raw, ioengine, rw):
        argv = ["fio", "--name=limit", f"--filename={raw}", f"--rw={rw}",
                "--bs=4k", f"--iodepth={QD}", f"--ioengine={ioengine}",
                "--direct=1", "--randrepeat=0", "--norandommap",
                "--time_based", f"--runtime={self.seconds:g}",
                "--output-format=json"]
        return shlex.join(argv), fio_metrics(run_cmd(argv, 600),
                                             "write" in rw)


def cells(sel):
    for p in sel.preallocs:
        for st in sel.states:
            for rw in sel.patterns:
                for e in sel.engines:
                    yield ("ours", p, st, rw, e)
    for rs in sel.raw_states:
        for rw in sel.patterns:
            for e in FIO_ENGINES:
                yield ("fio", rs, None, rw, e)


def run(b, sel, repeats, settle):
    samples = {}
    commands = {}
    all_cells = list(cells(sel))
    kept = {}
    for p in sel.preallocs:
        if "written" in sel.states:
            kept[(p, "written")] = b.image(p, "written", "-keep")
        if p == "full" and "fresh" in sel.states:
            kept[(p, "fresh")] = b.image(p, "fresh", "-keep")
    if "written" in sel.raw_states:
        b.raw("written")
    if settle > 0:
        log(f"settling {settle:g} s after the bulk writes")
        os.sync()
        time.sleep(settle)
    for r in range(repeats):
        shift = (r * 7) % len(all_cells)
        for c in all_cells[shift:] + all_cells[:shift]:
            kind, p, st, rw, e = c
            log(f"repeat {r + 1}/{repeats}: {kind} {p or ''} {st or ''} "
                f"{rw} {e}")
            if kind == "fio":
                path = b.raw(p)
                os.sync()
                cmd, m = b.fio(path, e, rw)
            else:
                # A fresh cell gets a new image each time (its writes
                # allocate); written and full images keep their state.
                img = kept.get((p, st)) or b.image(p, st)
                os.sync()
                cmd, m = b.ours(img, e, rw)
            samples.setdefault(c, []).append(m)
            commands[c] = cmd
    return samples, commands


def med(samples, c, key):
    vals = [m[key] for m in samples.get(c, []) if key in m]
    return statistics.median(vals) if vals else None


def spread(samples, c):
    vals = [m["iops"] for m in samples.get(c, [])]
    if len(vals) < 2:
        return ""
    return f" ({min(vals) / 1000:.0f}-{max(vals) / 1000:.0f}k)"


def fmt(v, digits=0):
    return "-" if v is None else f"{v:.{digits}f}"


def ratio(a, b):
    return fmt(a / b, 2) if a is not None and b else "-"


def print_iops(samples, b, sel):
    print(f"\n### Engine x preallocation, 4 KiB random, QD {QD}, O_DIRECT, "
          f"one queue, image {b.size} bytes, {b.seconds:g} s runs: IOPS, "
          f"median (min-max) of the repeats\n")
    print("| prealloc | state | pattern | fio ref | " +
          " | ".join(sel.engines) + " |")
    print("|" + "---|" * (4 + len(sel.engines)))
    for p in sel.preallocs:
        for st in sel.states:
            for rw in sel.patterns:
                cs = [("ours", p, st, rw, e) for e in sel.engines]
                print(f"| {p} | {st} | {rw} | {raw_state(p, st)} | " +
                      " | ".join(fmt(med(samples, c, "iops")) +
                                 spread(samples, c) for c in cs) + " |")
    print("\nfio on raw files of the same size (the limit), IOPS:\n")
    print("| raw file | pattern | " + " | ".join(
        f"fio {e}" for e in FIO_ENGINES) + " |")
    print("|---|---|" + "---|" * len(FIO_ENGINES))
    for rs in sel.raw_states:
        for rw in sel.patterns:
            cs = [("fio", rs, None, rw, e) for e in FIO_ENGINES]
            print(f"| {rs} | {rw} | " + " | ".join(
                fmt(med(samples, c, "iops")) + spread(samples, c)
                for c in cs) + " |")


def print_ratios(samples, sel):
    print("\n### Ratios (medians): ours / fio on the raw file in the same "
          "state; threads / io_uring; auto / best safe engine\n")
    print("| prealloc | state | pattern | aio / fio-libaio | "
          "io_uring / fio-io_uring | threads / io_uring | auto / best safe |")
    print("|---|---|---|---|---|---|---|")
    for p in sel.preallocs:
        for st in sel.states:
            for rw in sel.patterns:
                iops = {e: med(samples, ("ours", p, st, rw, e), "iops")
                        for e in ENGINES}
                rs = raw_state(p, st)
                fio = {e: med(samples, ("fio", rs, None, rw, e), "iops")
                       for e in FIO_ENGINES}
                # aio is safe only where io_submit cannot allocate.
                safe = ["sync", "threads", "io_uring"] + (
                    ["aio"] if rs == "written" or p == "falloc" else [])
                best = max((iops[e] for e in safe if iops[e]), default=None)
                print(f"| {p} | {st} | {rw} | "
                      f"{ratio(iops['aio'], fio['libaio'])} | "
                      f"{ratio(iops['io_uring'], fio['io_uring'])} | "
                      f"{ratio(iops['threads'], iops['io_uring'])} | "
                      f"{ratio(iops['auto'], best)} |")


def print_submit(samples, sel):
    engines = [e for e in SUBMIT_ENGINES if e in sel.engines]
    if not engines:
        return
    print("\n### Time inside the submit call (io_submit / io_uring_enter), "
          "us: p50 / p99 / max [entries per call: median / max]\n")
    print("| prealloc | state | pattern | " + " | ".join(engines) + " |")
    print("|---|---|---|" + "---|" * len(engines))
    for p in sel.preallocs:
        for st in sel.states:
            for rw in sel.patterns:
                def times(e):
                    c = ("ours", p, st, rw, e)
                    t = " / ".join(fmt(med(samples, c, k), 1) for k in
                                   ["submit_p50_us", "submit_p99_us",
                                    "submit_max_us"])
                    n = " / ".join(fmt(med(samples, c, k)) for k in
                                   ["submit_entries_p50",
                                    "submit_entries_max"])
                    return f"{t} [{n}]"
                print(f"| {p} | {st} | {rw} | " +
                      " | ".join(times(e) for e in engines) + " |")


def print_cpu(samples, sel):
    print("\n### CPU us per request (blk-bench or fio, user+system, "
          "median)\n")
    print("| prealloc | state | pattern | " + " | ".join(sel.engines) +
          " | fio libaio | fio io_uring |")
    print("|---|---|---|" + "---|" * (len(sel.engines) + 2))
    for p in sel.preallocs:
        for st in sel.states:
            for rw in sel.patterns:
                rs = raw_state(p, st)
                ours = [med(samples, ("ours", p, st, rw, e), "cpu_us_op")
                        for e in sel.engines]
                fio = [med(samples, ("fio", rs, None, rw, e), "cpu_us_op")
                       for e in FIO_ENGINES]
                print(f"| {p} | {st} | {rw} | " +
                      " | ".join(fmt(v, 1) for v in ours + fio) + " |")


def print_threads(samples, sel):
    print("\n### Per thread, per request (median): device queue worker "
          "CPU us / driver CPU us [worker / driver sleeps per 1000 "
          "requests]; the threads engine's pool is in neither\n")
    print("| prealloc | state | pattern | " + " | ".join(sel.engines) + " |")
    print("|---|---|---|" + "---|" * len(sel.engines))
    for p in sel.preallocs:
        for st in sel.states:
            for rw in sel.patterns:
                def cell(e):
                    c = ("ours", p, st, rw, e)
                    v = [med(samples, c, k) for k in
                         ["worker_cpu_us_op", "driver_cpu_us_op",
                          "worker_sleeps_kop", "driver_sleeps_kop"]]
                    return (f"{fmt(v[0], 2)} / {fmt(v[1], 2)} "
                            f"[{fmt(v[2], 1)} / {fmt(v[3], 1)}]")
                print(f"| {p} | {st} | {rw} | " +
                      " | ".join(cell(e) for e in sel.engines) + " |")


def pick(value, allowed, name):
    chosen = value.split(",")
    bad = [v for v in chosen if v not in allowed]
    if bad:
        raise SystemExit(f"--{name}: unknown {', '.join(bad)} "
                         f"(choose from {', '.join(allowed)})")
    return [v for v in allowed if v in chosen]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", required=True,
                    help="folder with release ch-img and blk-bench")
    ap.add_argument("--dir", default=os.environ.get(
        "BENCH_DIR", "/var/tmp/ch-engine-bench"), help="image folder")
    ap.add_argument("--size", default=str(1 << 30),
                    help="image size in bytes")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--settle", type=float, default=30.0,
                    help="seconds to wait after making the written images")
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--preallocs", default=",".join(PREALLOCS))
    ap.add_argument("--states", default=",".join(STATES))
    ap.add_argument("--patterns", default=",".join(PATTERNS))
    ap.add_argument("--json", default=None, help="write raw samples here")
    ap.add_argument("--smoke", action="store_true",
                    help="tiny sizes and runs: checks the script only")
    args = ap.parse_args()
    if args.smoke:
        args.size, args.seconds, args.repeats = str(32 << 20), 0.5, 1
        args.settle = 0
    args.size = int(args.size)
    sel = argparse.Namespace(
        engines=pick(args.engines, ENGINES, "engines"),
        preallocs=pick(args.preallocs, PREALLOCS, "preallocs"),
        states=pick(args.states, STATES, "states"),
        patterns=pick(args.patterns, PATTERNS, "patterns"))
    sel.raw_states = [rs for rs in RAW_STATES
                      if any(raw_state(p, st) == rs for p in sel.preallocs
                             for st in sel.states)]
    b = Bench(args)
    started = time.monotonic()
    samples, commands = run(b, sel, args.repeats, args.settle)
    print_iops(samples, b, sel)
    print_ratios(samples, sel)
    print_submit(samples, sel)
    print_cpu(samples, sel)
    print_threads(samples, sel)
    print(f"\n{args.repeats} repeats, {time.monotonic() - started:.0f} s.")
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
