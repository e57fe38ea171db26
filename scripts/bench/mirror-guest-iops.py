#!/usr/bin/env python3
"""The guest's 4 KiB random-write IOPS while a background mirror of its
disk runs, against the same load without one.

The bare-metal test guest (tests/guest) boots with one `--size` qcow2
disk whose first `--data` bytes hold data, and runs its load mode
(`load=SECONDS depth=D bs=4k rw=randwrite`: every queue kept busy over
the whole disk) and prints the IOPS it got (`LOAD done ... iops=N`).
Boots alternate: one without a mirror, one where `vm.disk-mirror` to a
new qcow2 target starts as the load starts ("LOAD start" on the serial
port) and runs through it (copying the data, then the guest's writes
as they land, from `ready` on). Each boot starts from a fresh copy of
the image. The table has one row per pair of boots, the ratio of the
IOPS with the mirror to those without, the job's state at the load's
end, and the medians.

Usage: scripts/bench/mirror-guest-iops.py [--bin DIR] [--guest ELF]
       [--dir DIR] [--size 4G] [--data 2G] [--seconds 8] [--depth 16]
       [--queues 1] [--pairs 3] [--granularity 64K] [--keep]
Prints a markdown table on stdout, progress on stderr.
"""

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def wait_serial(proc, path, needle, deadline):
    while True:
        try:
            with open(path, errors="replace") as f:
                text = f.read()
        except FileNotFoundError:
            text = ""
        if needle in text:
            return text
        if "RESULT: FAIL" in text:
            raise RuntimeError(f"guest failed:\n{text[-3000:]}")
        if proc.poll() is not None:
            raise RuntimeError(f"VMM exited ({proc.returncode}) before {needle!r}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {needle!r} on the serial port in time")
        time.sleep(0.005)


def remote(args, sock, *verb):
    r = subprocess.run([os.path.join(args.bin, "ch-remote"), "--api-socket", sock, *verb],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"ch-remote {' '.join(verb)}: {r.stderr.strip()}")
    return r.stdout


def one_boot(args, work, guest, image, mirror):
    """One boot of the load; returns the guest's IOPS and the job's state
    at the load's end (None without a mirror)."""
    disk = os.path.join(work, "disk.qcow2")
    shutil.copyfile(image, disk)
    target = os.path.join(work, "target.qcow2")
    serial = os.path.join(work, "serial.log")
    sock = os.path.join(work, "api.sock")
    for f in (serial, sock, target):
        if os.path.exists(f):
            os.unlink(f)
    cmdline = f"disks=1 park load={args.seconds} depth={args.depth} bs=4k rw=randwrite"
    err = open(os.path.join(work, "vmm.stderr"), "w")
    proc = subprocess.Popen(
        [os.path.join(args.bin, "cloud-hypervisor"), "--api-socket", f"path={sock}",
         "--kernel", guest, "--cmdline", cmdline, "--memory", "size=128M",
         "--serial", f"file={serial}",
         "--disk", f"path={disk},id=d0,num_queues={args.queues}"],
        stdin=subprocess.DEVNULL, stdout=err, stderr=err)
    state = None
    try:
        deadline = time.monotonic() + args.seconds + 180
        wait_serial(proc, serial, "LOAD start", deadline)
        if mirror:
            remote(args, sock, "disk-mirror", "--disk", "d0", "--target", target,
                   "--granularity", args.granularity)
        text = wait_serial(proc, serial, "info parked", deadline)
        if mirror:
            state = json.loads(remote(args, sock, "disk-jobs"))[0]["state"]
        remote(args, sock, "shutdown-vmm")
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        err.close()
    m = re.search(r"^LOAD done .* iops=(\d+)", text, re.M)
    if not m:
        raise RuntimeError("the guest printed no LOAD done line")
    return int(m[1]), state


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", default=os.path.join(REPO, "target", "release"))
    p.add_argument("--guest")
    p.add_argument("--dir")
    p.add_argument("--size", default="4G")
    p.add_argument("--data", default="2G")
    p.add_argument("--seconds", type=int, default=8)
    p.add_argument("--depth", type=int, default=16)
    p.add_argument("--queues", type=int, default=1)
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--granularity", default="64K")
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    guest = args.guest or subprocess.run(
        [os.path.join(REPO, "scripts", "build-test-guest.sh")], check=True,
        capture_output=True, text=True).stdout.strip().splitlines()[-1]
    work = tempfile.mkdtemp(prefix="mirror-guest-iops-", dir=args.dir)
    image = os.path.join(work, "image.qcow2")
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", image, args.size], check=True)
    subprocess.run(["qemu-io", "-f", "qcow2", "-c", f"write -P 0x5a 0 {args.data}", image],
                   check=True, capture_output=True)
    rows = []
    try:
        for pair in range(1, args.pairs + 1):
            without, _ = one_boot(args, work, guest, image, False)
            with_mirror, state = one_boot(args, work, guest, image, True)
            log(f"pair {pair}: {without} IOPS without, {with_mirror} with a mirror ({state})")
            rows.append((pair, without, with_mirror, state))
    finally:
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"The guest's 4 KiB randwrite IOPS (depth {args.depth}, {args.queues} queue(s), "
          f"{args.seconds} s) on a {args.size} qcow2 disk with {args.data} of data, "
          f"without and with a background mirror (granularity {args.granularity}) to a new "
          f"qcow2 started with the load:\n")
    print("| pair | IOPS without | IOPS with mirror | ratio | job at the load's end |")
    print("| --- | --- | --- | --- | --- |")
    for pair, w, m, state in rows:
        print(f"| {pair} | {w} | {m} | {m / w:.2f} | {state} |")
    wm = statistics.median(r[1] for r in rows)
    mm = statistics.median(r[2] for r in rows)
    print(f"| **median** | **{wm:.0f}** | **{mm:.0f}** | **{mm / wm:.2f}** | |")


if __name__ == "__main__":
    main()
