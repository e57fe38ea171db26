#!/usr/bin/env python3
"""The pause of an external snapshot group (`vm.disk-snapshot-external`)
under guest write load: how long the disks' queues stay parked, as the
VMM measures it, and the longest request the guest saw in the second of
each snapshot, beside the seconds without one.

The bare-metal test guest (tests/guest) boots with N disks and runs its
load mode (`load=SECONDS depth=D bs=B rw=randwrite`: every queue kept
busy at depth D) and prints, with kvm-clock, the longest request of each
second of the load (`LOAD max_latency_us_by_second=...`, submission to
the guest's reap). While it writes, the script takes `--snapshots`
snapshot groups of all N disks, one every `--every` seconds from the
second second on (each over the overlays of the one before, so the
chain grows by one per group), with our `ch-remote`. The VMM logs each
group's parked time ("N disks switched in X ms (queues parked; pausing
A ms, switching B ms, resuming C ms)"): from the first pause request to
the last resume, so it holds the drain of the requests in flight, the
switch and the resume.

Each boot starts from fresh images (qemu-img create, `--format`), in
`--dir` (default: a new folder in /dev/shm when there is one, so that
the host's disk does not decide the figures). `--boots` boots make the
rounds; the table has one row per snapshot group and a summary with the
median and the largest of each column. "guest: that second" is the
longest guest request in the second(s) the group's request spanned;
"guest: other seconds" the median over the load's seconds with no
snapshot (the first and last second left out) of their longest request:
what the guest sees anyway on this host.

Usage: scripts/bench/snapshot-pause.py [--bin DIR] [--guest ELF]
       [--dir DIR] [--disks 4] [--format qcow2|raw] [--size 256M]
       [--seconds 12] [--snapshots 4] [--every 2] [--boots 3]
       [--depth 4] [--bs 4k] [--keep]
Prints a markdown table on stdout, progress on stderr.
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from guest_vm import wait_serial, stop

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SWITCHED = re.compile(
    r"(\d+) disks switched in ([\d.]+) ms \(queues parked; pausing ([\d.]+) ms, "
    r"switching ([\d.]+) ms, resuming ([\d.]+) ms\)")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def one_boot(args, boot, work, guest):
    """One boot: the load, the snapshot groups; returns one row per group
    and the baseline (median longest request of a second without one)."""
    for f in os.listdir(work):
        os.unlink(os.path.join(work, f))
    disks = []
    for i in range(args.disks):
        path = os.path.join(work, f"d{i}.{args.format}")
        subprocess.run(["qemu-img", "create", "-q", "-f", args.format, path, args.size],
                       check=True)
        disks.append(path)
    serial = os.path.join(work, "serial.log")
    sock = os.path.join(work, "api.sock")
    cmdline = (f"disks={args.disks} park load={args.seconds} depth={args.depth} "
               f"bs={args.bs} rw=randwrite")
    argv = [os.path.join(args.bin, "cloud-hypervisor"), "-v", "--api-socket",
            f"path={sock}", "--kernel", guest, "--cmdline", cmdline,
            "--memory", "size=128M", "--serial", f"file={serial}"]
    for i, path in enumerate(disks):
        argv += ["--disk", f"path={path},id=d{i}"]
    err_path = os.path.join(work, "vmm.stderr")
    err = open(err_path, "w")
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err)
    deadline = time.monotonic() + args.seconds + 180
    spans = []
    try:
        wait_serial(proc, serial, "LOAD start", deadline)
        t0 = time.monotonic()
        for k in range(args.snapshots):
            at = t0 + 1.5 + k * args.every
            time.sleep(max(0.0, at - time.monotonic()))
            cmd = [os.path.join(args.bin, "ch-remote"), "--api-socket", sock,
                   "disk-snapshot-external"]
            for i, path in enumerate(disks):
                cmd += ["--disk", f"id=d{i},overlay={path}.s{k + 1}"]
            begin = time.monotonic() - t0
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            end = time.monotonic() - t0
            if r.returncode != 0:
                raise RuntimeError(f"snapshot {k + 1}: {r.stderr.strip()}")
            spans.append((begin, end))
        # The guest parks after its last LOAD line: that line is whole.
        text = wait_serial(proc, serial, "info parked", deadline)
        subprocess.run([os.path.join(args.bin, "ch-remote"), "--api-socket", sock,
                        "shutdown-vmm"], capture_output=True, timeout=60)
        proc.wait(timeout=60)
    finally:
        stop(proc)
        err.close()
    m = re.search(r"^LOAD max_latency_us_by_second=([\d,]+)$", text, re.M)
    if not m:
        raise RuntimeError("the guest printed no latencies (no kvm-clock?)")
    by_second = [int(v) for v in m[1].split(",")]
    with open(err_path) as f:
        switched = [tuple(float(x) for x in g.groups()) for g in SWITCHED.finditer(f.read())]
    if len(switched) != len(spans):
        raise RuntimeError(f"{len(spans)} groups asked, {len(switched)} logged")
    touched = set()
    rows = []
    for (begin, end), (n, parked, pausing, switching, resuming) in zip(spans, switched):
        seconds = range(int(begin), int(end) + 1)
        touched.update(seconds)
        guest = max(by_second[s] for s in seconds if s < len(by_second))
        rows.append({"boot": boot, "at_s": begin, "disks": int(n), "parked": parked,
                     "pausing": pausing, "switching": switching,
                     "resuming": resuming, "guest_ms": guest / 1000})
    quiet = [v for s, v in enumerate(by_second[1:args.seconds - 1], start=1)
             if s not in touched]
    return rows, (statistics.median(quiet) / 1000 if quiet else float("nan"))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", default=os.path.join(REPO, "target", "release"))
    p.add_argument("--guest")
    p.add_argument("--dir")
    p.add_argument("--disks", type=int, default=4)
    p.add_argument("--format", default="qcow2", choices=["qcow2", "raw"])
    p.add_argument("--size", default="256M")
    p.add_argument("--seconds", type=int, default=12)
    p.add_argument("--snapshots", type=int, default=4)
    p.add_argument("--every", type=float, default=2.0)
    p.add_argument("--boots", type=int, default=3)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--bs", default="4k")
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    if 1.5 + args.snapshots * args.every > args.seconds - 1:
        p.error("the snapshots do not fit in the load (raise --seconds)")
    guest = args.guest or subprocess.run(
        [os.path.join(REPO, "scripts", "build-test-guest.sh")], check=True,
        capture_output=True, text=True).stdout.strip().splitlines()[-1]
    base = args.dir or ("/dev/shm" if os.path.isdir("/dev/shm") else None)
    work = tempfile.mkdtemp(prefix="snapshot-pause-", dir=base)
    rows, baselines = [], []
    try:
        for boot in range(1, args.boots + 1):
            log(f"boot {boot}/{args.boots}")
            r, quiet = one_boot(args, boot, work, guest)
            rows += r
            baselines.append(quiet)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"kept {work}")
    print(f"External snapshot groups of {args.disks} {args.format} disks under "
          f"`load rw=randwrite depth={args.depth} bs={args.bs}` "
          f"({args.boots} boots x {args.snapshots} groups)\n")
    print("| boot | at (s) | parked ms | pausing ms | switching ms | resuming ms "
          "| guest: that second, longest request ms |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['boot']} | {r['at_s']:.1f} | {r['parked']:.3f} | {r['pausing']:.3f} "
              f"| {r['switching']:.3f} | {r['resuming']:.3f} | {r['guest_ms']:.2f} |")
    cols = ["parked", "pausing", "switching", "resuming", "guest_ms"]
    med = {c: statistics.median(r[c] for r in rows) for c in cols}
    top = {c: max(r[c] for r in rows) for c in cols}
    print(f"| median | | {med['parked']:.3f} | {med['pausing']:.3f} | "
          f"{med['switching']:.3f} | {med['resuming']:.3f} | {med['guest_ms']:.2f} |")
    print(f"| max | | {top['parked']:.3f} | {top['pausing']:.3f} | "
          f"{top['switching']:.3f} | {top['resuming']:.3f} | {top['guest_ms']:.2f} |")
    print(f"\nguest: other seconds (median of each boot's median longest request "
          f"in a second without a snapshot): "
          f"{statistics.median(baselines):.2f} ms")


if __name__ == "__main__":
    main()
