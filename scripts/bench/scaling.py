#!/usr/bin/env python3
"""Queue scaling of the virtio-blk device path: `blk-bench --queues N`
against `fio --numjobs=N` (io_uring, O_DIRECT) on the same file, for N =
1, 2, 4, ... up to half the host's CPUs, on a file in tmpfs and a file on
disk, raw and allocated qcow2; interleaved and repeated; one table of
medians with each thread's CPU per request.

Data enters as the images this script makes (random data written by
Python, the qcow2 made by our own `ch-img convert`, so no qemu-img is
needed) and as the JSON blk-bench and fio print; it leaves as one
markdown table on stdout (progress on stderr) and, with --json, every
sample.

CPU figures, per request (all requests of the run), counted like for
like: "ours" is blk-bench's whole process less its driver threads
(`blk-bench-qN`, the guest's stand-in), measured by blk-bench itself
over the run (the process CPU clock, so io_uring's io-wq workers that
exited during the run count too); "fio" is fio's whole process (user +
system from wait4, its io-wq workers included, which do the copy on
tmpfs). "ours / fio CPU" is their ratio within each repeat, then the
median. Ours is split by thread kind: "worker" the `virtio-blk-qN`
threads (the device's queue workers; "max" the busiest queue's, per
request of its queue), "io-wq" io_uring's `iou-wrk-*` workers, "driver"
the guest's stand-in (not in "ours").

fio: --fio CMD, else the FIO environment variable (a command line, as
`. target-device/fio-env.sh` sets it on a bare host: the Linux test
guest's fio with its own libraries), else --fio-root DIR (an unpacked
Linux test guest initramfs), else `fio` on PATH.

Usage: scripts/bench/scaling.py [--bin DIR] [--tmpfs-dir DIR]
       [--disk-dir DIR] [--size BYTES] [--queues 1,2,4] [--qd N]
       [--runtime S] [--repeats N] [--only tmpfs|disk] [--formats raw,qcow2]
       [--fio CMD | --fio-root DIR] [--json FILE] [--keep]
"""

import argparse
import json
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import time


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run_timed(argv, timeout):
    """Runs argv; returns (stdout, user+system CPU seconds of the child and
    everything it waited for)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=timeout, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed ({p.returncode}): "
                           f"{p.stderr.strip()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return p.stdout, cpu


def fio_command(args):
    """The fio command as a list, or exits with how to provide one."""
    if args.fio:
        return shlex.split(args.fio)
    if os.environ.get("FIO"):
        return shlex.split(os.environ["FIO"])
    if args.fio_root:
        r = args.fio_root
        libs = ":".join(f"{r}/{d}" for d in [
            "lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu",
            "usr/lib/x86_64-linux-gnu/ceph"])
        return [f"{r}/lib64/ld-linux-x86-64.so.2", "--library-path", libs,
                f"{r}/usr/bin/fio"]
    if shutil.which("fio"):
        return ["fio"]
    sys.exit("scaling.py: no fio: install it, set FIO (. target-device/"
             "fio-env.sh), or pass --fio-root with an unpacked Linux test "
             "guest initramfs")


def make_raw(path, size):
    """A raw file of random data (every block allocated), written once."""
    if os.path.exists(path) and os.path.getsize(path) == size:
        return
    log(f"writing {size >> 20} MiB of random data to {path}")
    chunk = 4 << 20
    with open(path + ".tmp", "wb") as f:
        left = size
        while left > 0:
            n = min(chunk, left)
            f.write(os.urandom(n))
            left -= n
        f.flush()
        os.fsync(f.fileno())
    os.rename(path + ".tmp", path)


def make_qcow2(ch_img, raw, path):
    """Every cluster allocated: our ch-img converts the random raw file."""
    if os.path.exists(path):
        return
    log(f"converting {raw} to {path}")
    run_timed([ch_img, "convert", "-f", "raw", "-O", "qcow2", "-t", "none",
               raw, path + ".tmp"], 1800)
    os.rename(path + ".tmp", path)


def blk_bench(args, image, queues):
    argv = [os.path.join(args.bin, "blk-bench"), "--image", image,
            "--engine", "io_uring", "--direct", "on", "--queues", str(queues),
            "--qd", str(args.qd), "--bs", args.bs, "--rw", "randread",
            "--runtime", str(args.runtime), "--output", "json"]
    out, _ = run_timed(argv, args.runtime * 4 + 120)
    v = json.loads(out)
    ops = v["ops"]
    per_queue = max(ops / queues, 1)
    workers = []
    switches = []
    for t in v.get("threads", []):
        if t["name"].startswith("virtio-blk-q"):
            workers.append(t["cpu_s"] * 1e6 / per_queue)
            switches.append(t["voluntary_switches_per_op"] * queues)
    cpu = v["cpu_us_per_op"]
    return {
        "iops": v["ops_per_sec"],
        "lat_mean_us": v["lat_mean_us"],
        "cpu_us": cpu["whole_less_driver"],
        "whole_us": cpu["whole"],
        "worker_us": cpu["worker"],
        "worker_max_us": max(workers, default=0.0),
        "io_wq_us": cpu["io_wq"],
        "driver_us": cpu["driver"],
        "worker_sleeps": statistics.mean(switches) if switches else 0.0,
        "argv": shlex.join(argv),
    }


def fio_run(args, fio, raw, jobs):
    argv = fio + ["--name=scaling", f"--filename={raw}", "--ioengine=io_uring",
                  "--direct=1", "--rw=randread", f"--bs={args.bs}",
                  f"--iodepth={args.qd}", f"--numjobs={jobs}",
                  "--group_reporting", "--time_based",
                  f"--runtime={args.runtime}", "--output-format=json"]
    out, cpu = run_timed(argv, args.runtime * 4 + 120)
    v = json.loads(out[out.index("{"):])
    job = v["jobs"][0]["read"]
    ios = max(job["total_ios"], 1)
    return {
        "iops": job["iops"],
        "lat_mean_us": job["lat_ns"]["mean"] / 1000.0,
        "cpu_us": cpu * 1e6 / ios,
        "argv": shlex.join(argv),
    }


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default="target/release",
                    help="folder with blk-bench and ch-img")
    ap.add_argument("--tmpfs-dir", default="/dev/shm/ch-scaling")
    ap.add_argument("--disk-dir", default="/var/tmp/ch-scaling")
    ap.add_argument("--size", type=int, default=1 << 30)
    ap.add_argument("--queues", help="comma list (default 1, 2, 4, ... up "
                    "to half the CPUs)")
    ap.add_argument("--qd", type=int, default=32, help="per queue / job")
    ap.add_argument("--bs", default="4k")
    ap.add_argument("--runtime", type=int, default=5, help="seconds per run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", choices=["tmpfs", "disk"])
    ap.add_argument("--formats", default="raw,qcow2")
    ap.add_argument("--fio")
    ap.add_argument("--fio-root")
    ap.add_argument("--json")
    ap.add_argument("--keep", action="store_true",
                    help="keep the images for the next run")
    args = ap.parse_args()

    fio = fio_command(args)
    cpus = os.cpu_count() or 1
    if args.queues:
        levels = [int(x) for x in args.queues.split(",")]
    else:
        levels, n = [], 1
        while n <= max(cpus // 2, 1):
            levels.append(n)
            n *= 2
    formats = args.formats.split(",")
    media = [m for m in [("tmpfs", args.tmpfs_dir), ("disk", args.disk_dir)]
             if args.only in (None, m[0])]
    ch_img = os.path.join(args.bin, "ch-img")
    images = {}
    for medium, d in media:
        os.makedirs(d, exist_ok=True)
        raw = os.path.join(d, "scaling.raw")
        make_raw(raw, args.size)
        images[(medium, "raw")] = raw
        if "qcow2" in formats:
            q = os.path.join(d, "scaling.qcow2")
            make_qcow2(ch_img, raw, q)
            images[(medium, "qcow2")] = q

    samples = []
    loads = [loadavg()]
    started = time.time()
    for rep in range(args.repeats):
        for medium, _ in media:
            raw = images[(medium, "raw")]
            for n in levels:
                runs = [("fio", None)] + [("ours", f) for f in formats]
                # Interleave: rotate who goes first on every repeat.
                k = rep % len(runs)
                for who, fmt in runs[k:] + runs[:k]:
                    label = f"{medium} {fmt or 'fio'} q{n} rep{rep + 1}"
                    log(f"[{time.time() - started:6.0f}s] {label}")
                    if who == "fio":
                        r = fio_run(args, fio, raw, n)
                    else:
                        r = blk_bench(args, images[(medium, fmt)], n)
                    r.update(medium=medium, format=fmt, who=who, queues=n,
                             repeat=rep, load=loadavg())
                    loads.append(r["load"])
                    samples.append(r)

    def pick(medium, n, who, fmt=None):
        return [s for s in samples if s["medium"] == medium
                and s["queues"] == n and s["who"] == who
                and (fmt is None or s["format"] == fmt)]

    print(f"Machine: {cpus} CPUs, {os.uname().release}; load average "
          f"{min(loads):.1f} to {max(loads):.1f}; {args.repeats} interleaved "
          f"repeats of {args.runtime} s, medians; {args.bs} random reads, "
          f"QD {args.qd} per queue/job, io_uring, O_DIRECT, "
          f"{args.size >> 20} MiB files.")
    print()
    print("| medium | image | queues / jobs | fio IOPS | ours IOPS | ours / fio "
          "| fio CPU us/req (whole) | ours CPU us/req (whole less driver) "
          "| ours / fio CPU | worker us/req (max) | io-wq us/req "
          "| driver us/req | worker sleeps/req |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
          "| ---: | ---: | ---: |")
    for medium, _ in media:
        for fmt in formats:
            for n in levels:
                fs = pick(medium, n, "fio")
                os_ = pick(medium, n, "ours", fmt)
                # Ratios from the same repeat, then the median.
                by_rep = {s["repeat"]: s for s in fs}
                ratio = [o["iops"] / by_rep[o["repeat"]]["iops"]
                         for o in os_ if o["repeat"] in by_rep]
                cratio = [o["cpu_us"] / by_rep[o["repeat"]]["cpu_us"]
                          for o in os_ if o["repeat"] in by_rep]
                print(f"| {medium} | {fmt} | {n} "
                      f"| {median([s['iops'] for s in fs]):.0f} "
                      f"| {median([s['iops'] for s in os_]):.0f} "
                      f"| {median(ratio):.2f} "
                      f"| {median([s['cpu_us'] for s in fs]):.2f} "
                      f"| {median([s['cpu_us'] for s in os_]):.2f} "
                      f"| {median(cratio):.2f} "
                      f"| {median([s['worker_us'] for s in os_]):.2f} "
                      f"({median([s['worker_max_us'] for s in os_]):.2f}) "
                      f"| {median([s['io_wq_us'] for s in os_]):.2f} "
                      f"| {median([s['driver_us'] for s in os_]):.2f} "
                      f"| {median([s['worker_sleeps'] for s in os_]):.3f} |")
    print()
    print("Commands (last repeat):")
    seen = set()
    for s in reversed(samples):
        key = (s["medium"], s["format"], s["queues"], s["who"])
        if key not in seen:
            seen.add(key)
            print(f"    {s['argv']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(samples, f, indent=1)
    if not args.keep:
        for p in images.values():
            os.remove(p)


if __name__ == "__main__":
    main()
