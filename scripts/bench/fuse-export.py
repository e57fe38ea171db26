#!/usr/bin/env python3
"""FUSE export benchmark: fio on the file exported by ch-storage-daemon
(/dev/fuse and FUSE-over-io_uring), by qemu-storage-daemon's FUSE export,
and fio on the image file itself, every backend with O_DIRECT.

The shape of the published FUSE-over-io_uring numbers: rw=randrw
rwmixread=70 bs=4k, (numjobs, iodepth) = (1,1), (1,64), (4,1), (4,64), on
a 1 GiB image, raw and allocated qcow2. Each repeat runs every backend
once, in an order rotated per repeat (interleaved); tables quote medians.
Beside each cell: the daemon's CPU seconds (user+system, from
/proc/PID/stat) per GiB moved.

Data enters as images this script makes (qemu-img, fio to fill them) and
as fio's JSON; it leaves as markdown tables on stdout (progress on
stderr) and, with --json, every sample. Needs root (mounts, enable_uring,
which it restores).

Usage: scripts/bench/fuse-export.py [--quick] [--dir DIR] [--bin FILE]
       [--repeats N] [--seconds S] [--size BYTES] [--formats raw,qcow2]
       [--json FILE]
"""

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import re
import time

CELLS = [(1, 1), (1, 64), (4, 1), (4, 64)]
ENABLE_URING = "/sys/module/fuse/parameters/enable_uring"
FUSE_MAGIC = 0x65735546


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def cpu_seconds(pid):
    """utime + stime of a process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def is_fuse(path):
    out = run(["stat", "-f", "-c", "%t", path]).strip()
    return int(out, 16) == FUSE_MAGIC


def wait_mounted(proc, mountpoint, timeout=30):
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"daemon exited {proc.returncode}: {proc.stderr.read()}")
        if is_fuse(mountpoint):
            return
        time.sleep(0.05)
    raise RuntimeError("daemon did not mount in time")


class Daemon:
    """A FUSE export of `image` on `mountpoint` (None: fio on the image);
    `env`: variables added to the daemon's environment."""

    def __init__(self, name, argv, mountpoint, env=None):
        self.name, self.argv, self.mountpoint = name, argv, mountpoint
        self.env = {**os.environ, **env} if env else None
        self.proc = None

    def __enter__(self):
        if self.argv:
            self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, text=True, env=self.env)
            wait_mounted(self.proc, self.mountpoint)
        return self

    def cpu(self):
        return cpu_seconds(self.proc.pid) if self.proc else 0.0

    def __exit__(self, *exc):
        if self.proc:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            # How the queue threads shared the requests (their exit lines):
            # with io_uring=on the split between ring threads varies from
            # one daemon start to the next and moves the results.
            served = re.findall(r"(ring thread \d+|queue fuse-q\d+): served (\d+)",
                                self.proc.stderr.read())
            if served:
                log(f"  {self.name} requests per thread: "
                    + ", ".join(f"{t} {n}" for t, n in served if n != "0"))
        if self.mountpoint and os.path.exists(self.mountpoint) and is_fuse(self.mountpoint):
            subprocess.run(["umount", "-l", self.mountpoint])


def ours_argv(binary, image, fmt, mountpoint, export_keys="", image_keys=""):
    """Our daemon exporting `image` writable on `mountpoint`, O_DIRECT;
    the keys (comma-separated, may be empty) are added to --export and
    --image."""
    return [binary, "--image", f"path={image},image_type={fmt},direct=on"
            + (f",{image_keys}" if image_keys else ""),
            "--export", f"type=fuse,mountpoint={mountpoint},writable=on"
            + (f",{export_keys}" if export_keys else "")]


def qsd_argv(image, fmt, mountpoint):
    """qemu-storage-daemon's FUSE export of `image`, O_DIRECT, io_uring."""
    return ["qemu-storage-daemon",
            "--blockdev", f"driver=file,node-name=file,filename={image},cache.direct=on,aio=io_uring",
            "--blockdev", f"driver={fmt},node-name=fmt,file=file",
            "--export", f"type=fuse,id=exp,node-name=fmt,mountpoint={mountpoint},writable=on"]


def backends(args, fmt, image, mountpoint):
    """{name: (argv, mountpoint)}; `--variant NAME=KEYS` adds
    ours-devfuse@NAME and ours-uring@NAME with KEYS added to the export."""
    ours = ours_argv(args.bin, image, fmt, mountpoint,
                     f"num_queues={getattr(args, 'num_queues', 2)}")
    qsd = qsd_argv(image, fmt, mountpoint)
    table = {
        "ours-devfuse": (ours, mountpoint),
        "ours-uring": (ours[:-1] + [ours[-1] + ",io_uring=on"], mountpoint),
        "qsd": (qsd, mountpoint),
        # fio on the image file itself (the limit): on its data extent,
        # the same blocks of the disk as the exports (file_target).
        "fio-file": (None, None),
    }
    for variant in getattr(args, "variant", None) or []:
        name, keys = variant.split("=", 1)
        for base in ("ours-devfuse", "ours-uring"):
            argv = table[base][0]
            table[f"{base}@{name}"] = (argv[:-1] + [argv[-1] + "," + keys], mountpoint)
    return table


@contextlib.contextmanager
def uring_enabled():
    """enable_uring on for the block, restored after."""
    old = open(ENABLE_URING).read().strip()
    try:
        with open(ENABLE_URING, "w") as f:
            f.write("1")
        yield
    finally:
        with open(ENABLE_URING, "w") as f:
            f.write("1" if old in ("Y", "1") else "0")


def one_format_setup(args):
    """The image of `args.format` (made here), and the backends table on
    the mountpoint `args.dir`/export (the diagnosis scripts' set-up)."""
    image = make_images(args)[args.format]
    mountpoint = os.path.join(args.dir, "export")
    open(mountpoint, "a").close()
    return image, backends(args, args.format, image, mountpoint)


def fio(target, jobs, depth, args, extra=()):
    out = run(["fio", "--name=bench", f"--filename={target}", "--rw=randrw",
               "--rwmixread=70", "--bs=4k", "--direct=1", "--ioengine=io_uring",
               f"--iodepth={depth}", f"--numjobs={jobs}", "--group_reporting",
               "--time_based", f"--runtime={args.seconds}", f"--size={args.size}",
               "--output-format=json", *extra])
    job = json.loads(out[out.index("{"):])["jobs"][0]
    r, w = job["read"], job["write"]
    return {
        "read_mib": r["bw"] / 1024, "write_mib": w["bw"] / 1024,
        "read_lat_us": r["lat_ns"]["mean"] / 1000, "write_lat_us": w["lat_ns"]["mean"] / 1000,
        "bytes": r["io_bytes"] + w["io_bytes"],
        # fio's own CPU (user + system, % of one CPU, per job): near 100
        # the application's thread, not the backend, sets the pace.
        "fio_cpu_pct": job["usr_cpu"] + job["sys_cpu"],
    }


def make_images(args):
    raw = os.path.join(args.dir, "disk.raw")
    log(f"filling {raw} ({args.size} bytes)")
    run(["qemu-img", "create", "-q", "-f", "raw", raw, str(args.size)])
    run(["fio", "--name=fill", f"--filename={raw}", "--rw=write", "--bs=1M",
         f"--size={args.size}", "--direct=1", "--ioengine=io_uring", "--iodepth=8"])
    images = {"raw": raw}
    if "qcow2" in args.formats:
        q = os.path.join(args.dir, "disk.qcow2")
        run(["qemu-img", "convert", "-O", "qcow2", raw, q])
        images["qcow2"] = q
    return images


def file_target(image):
    """(path, fio options) for fio-file on `image`: fio on the bytes of
    the image file that hold its guest data, so the limit is measured on
    the same blocks of the disk as the exports (two files of one disk can
    differ: 378 against 276 MiB/s at (1,64) in one measurement). A raw
    image is all data. A qcow2 image made by make_images holds its data
    in two runs of the file with one L2 table between them (at 64 KiB
    clusters an L2 table maps 512 MiB): fio runs on the first, the first
    512 MiB of guest data, and never writes over metadata. The options
    go after fio's own --size, which they override."""
    if not image.endswith(".qcow2"):
        return image, []
    extents = json.loads(run(["qemu-img", "map", "--output=json", image]))
    first = extents[0] if extents else {}
    if not first.get("data") or "offset" not in first or first["length"] < (64 << 20):
        raise RuntimeError(f"{image}: no run of guest data at its start")
    return image, [f"--offset={first['offset']}", f"--size={first['length']}"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 64 MiB, 2 s, 1 repeat, 2 cells")
    p.add_argument("--dir", default="/var/tmp/ch-fuse-bench")
    p.add_argument("--bin", default=shutil.which("ch-storage-daemon") or "target/release/ch-storage-daemon")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--size", type=int, default=1 << 30)
    p.add_argument("--formats", default="raw,qcow2")
    p.add_argument("--json")
    p.add_argument("--variant", action="append", default=[],
                   help="NAME=KEYS: also run ours-devfuse@NAME and ours-uring@NAME "
                        "with KEYS added to the export (e.g. poll=poll_max_us=32)")
    p.add_argument("--backends", help="comma list of backends to run, each with its "
                   "@variants (default: all)")
    p.add_argument("--cells", help="comma list of JOBSxDEPTH cells (default: all four)")
    args = p.parse_args()
    cells = CELLS
    if args.quick:
        args.size, args.seconds, args.repeats, cells = 64 << 20, 2, 1, [(1, 1), (4, 64)]
    if args.cells:
        cells = [tuple(int(x) for x in c.split("x")) for c in args.cells.split(",")]
    args.formats = args.formats.split(",")
    os.makedirs(args.dir, exist_ok=True)
    old_uring = open(ENABLE_URING).read().strip()
    samples = []
    try:
        with open(ENABLE_URING, "w") as f:
            f.write("1")
        images = make_images(args)
        mountpoint = os.path.join(args.dir, "export")
        open(mountpoint, "a").close()
        for fmt in args.formats:
            names = list(backends(args, fmt, images[fmt], mountpoint))
            if args.backends:
                # A backend named here brings its @variants along.
                names = [n for n in names if n.split("@")[0] in args.backends.split(",")]
            args.names = names
            for rep in range(args.repeats):
                order = names[rep % len(names):] + names[:rep % len(names)]
                for name in order:
                    argv, mp = backends(args, fmt, images[fmt], mountpoint)[name]
                    with Daemon(name, argv, mp) as d:
                        target, extra = (mp, []) if mp else file_target(images[fmt])
                        for jobs, depth in cells:
                            before = d.cpu()
                            s = fio(target, jobs, depth, args, extra)
                            s["cpu_s_per_gib"] = (d.cpu() - before) / (s["bytes"] / (1 << 30))
                            s.update(format=fmt, backend=name, jobs=jobs, depth=depth, repeat=rep)
                            samples.append(s)
                            log(f"{fmt} {name} ({jobs},{depth}) rep {rep}: "
                                f"r {s['read_mib']:.1f} w {s['write_mib']:.1f} MiB/s")
    finally:
        with open(ENABLE_URING, "w") as f:
            f.write("1" if old_uring in ("Y", "1") else "0")
    report(samples, args, cells)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(samples, f, indent=1)


def median(samples, fmt, backend, cell, key):
    vals = [s[key] for s in samples
            if (s["format"], s["backend"], s["jobs"], s["depth"]) == (fmt, backend) + cell]
    return statistics.median(vals) if vals else float("nan")


def report(samples, args, cells):
    names = getattr(args, "names", ["ours-devfuse", "ours-uring", "qsd", "fio-file"])
    print(f"fio randrw 70/30 bs=4k direct=1 io_uring, {args.size >> 20} MiB image, "
          f"{args.seconds} s per run, medians of {args.repeats} interleaved repeats\n")
    for fmt in args.formats:
        print(f"### {fmt}\n")
        print("| jobs,depth | backend | read MiB/s | write MiB/s | read lat us | write lat us "
              "| CPU s/GiB | fio CPU % per job |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for cell in cells:
            for n in names:
                m = lambda k: median(samples, fmt, n, cell, k)
                cpu = "" if n == "fio-file" else f"{m('cpu_s_per_gib'):.2f}"
                print(f"| {cell[0]},{cell[1]} | {n} | {m('read_mib'):.1f} | {m('write_mib'):.1f} "
                      f"| {m('read_lat_us'):.0f} | {m('write_lat_us'):.0f} | {cpu} "
                      f"| {m('fio_cpu_pct'):.0f} |")
        print()
        print("| jobs,depth | devfuse/qsd bw | devfuse/qsd lat | uring/devfuse bw | uring/devfuse lat | uring/fio bw |")
        print("| --- | --- | --- | --- | --- | --- |")
        for cell in cells:
            # A backend left out (--backends) gives nan here.
            bw = lambda n: median(samples, fmt, n, cell, "read_mib") + median(samples, fmt, n, cell, "write_mib")
            lat = lambda n: median(samples, fmt, n, cell, "read_lat_us")
            print(f"| {cell[0]},{cell[1]} | {bw('ours-devfuse') / bw('qsd'):.2f} "
                  f"| {lat('ours-devfuse') / lat('qsd'):.2f} "
                  f"| {bw('ours-uring') / bw('ours-devfuse'):.2f} "
                  f"| {lat('ours-uring') / lat('ours-devfuse'):.2f} "
                  f"| {bw('ours-uring') / bw('fio-file'):.2f} |")
        print()
        variants = [n for n in names if "@" in n]
        if variants:
            print("| jobs,depth | variant | bw / without | read lat / without | CPU / without |")
            print("| --- | --- | --- | --- | --- |")
            for cell in cells:
                for v in variants:
                    base = v.split("@")[0]
                    m = lambda n, k: median(samples, fmt, n, cell, k)
                    bw = lambda n: m(n, "read_mib") + m(n, "write_mib")
                    print(f"| {cell[0]},{cell[1]} | {v} | {bw(v) / bw(base):.2f} "
                          f"| {m(v, 'read_lat_us') / m(base, 'read_lat_us'):.2f} "
                          f"| {m(v, 'cpu_s_per_gib') / m(base, 'cpu_s_per_gib'):.2f} |")
            print()


if __name__ == "__main__":
    main()
