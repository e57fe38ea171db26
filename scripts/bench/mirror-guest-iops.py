#!/usr/bin/env python3
"""The guest's 4 KiB random-write IOPS while a mirror of its disk runs,
in background and in write-blocking mode, against the same load without
one, and whether (and when) each mirror reached `ready`.

The bare-metal test guest (tests/guest) boots with one `--size` qcow2
disk whose first `--data` bytes hold data, and runs its load mode
(`load=SECONDS depth=D bs=4k rw=randwrite`: every queue kept busy over
the whole disk) and prints the IOPS it got (`LOAD done ... iops=N`).
Boots rotate: one without a mirror, one where `vm.disk-mirror` to a new
qcow2 target starts as the load starts ("LOAD start" on the serial port)
in background mode, one where it starts in write-blocking mode; each
mirror runs through the load (copying the data, then following the
guest's writes). The job list is polled every 50 ms during the load:
the time from the mirror's start to its first `ready` is recorded, and
its state at the load's end. Each boot starts from a fresh copy of the
image. The table has one row per round of three boots: the IOPS, the
ratios to the IOPS without a mirror, when each job was ready ("-": not
during the load) and its state at the end; then the medians.

Usage: scripts/bench/mirror-guest-iops.py [--bin DIR] [--guest ELF]
       [--dir DIR] [--size 4G] [--data 2G] [--seconds 8] [--depth 16]
       [--queues 1] [--rounds 3] [--granularity 64K] [--keep]
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
import threading
import time

from guest_vm import wait_serial, remote

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def watch_job(args, sock, started, stop, seen):
    """Polls the job list until `stop` is set; records in `seen` the
    seconds from `started` to the job's first `ready`."""
    while not stop.is_set():
        try:
            jobs = json.loads(remote(args.bin, sock, "disk-jobs"))
        except (RuntimeError, ValueError, subprocess.TimeoutExpired):
            jobs = []
        if jobs and jobs[0]["state"] == "ready" and "ready" not in seen:
            seen["ready"] = time.monotonic() - started
        stop.wait(0.05)


def one_boot(args, work, guest, image, mode):
    """One boot of the load; `mode` is None (no mirror), "background" or
    "write-blocking". Returns the guest's IOPS, the job's state at the
    load's end and the seconds it took to reach ready (None: no mirror,
    or not ready during the load)."""
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
    seen = {}
    stop = threading.Event()
    watcher = None
    try:
        deadline = time.monotonic() + args.seconds + 180
        wait_serial(proc, serial, "LOAD start", deadline)
        if mode:
            started = time.monotonic()
            remote(args.bin, sock, "disk-mirror", "--disk", "d0", "--target", target,
                   "--granularity", args.granularity, "--mode", mode)
            watcher = threading.Thread(target=watch_job, args=(args, sock, started, stop, seen))
            watcher.start()
        text = wait_serial(proc, serial, "LOAD done", deadline)
        stop.set()
        if watcher:
            watcher.join()
        if mode:
            state = json.loads(remote(args.bin, sock, "disk-jobs"))[0]["state"]
        text = wait_serial(proc, serial, "info parked", deadline)
        remote(args.bin, sock, "shutdown-vmm")
        proc.wait(timeout=60)
    finally:
        stop.set()
        if watcher:
            watcher.join()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        err.close()
    m = re.search(r"^LOAD done .* iops=(\d+)", text, re.M)
    if not m:
        raise RuntimeError("the guest printed no LOAD done line")
    return int(m[1]), state, seen.get("ready")


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
    p.add_argument("--rounds", type=int, default=3)
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
    modes = ("background", "write-blocking")
    try:
        for rnd in range(1, args.rounds + 1):
            without, _, _ = one_boot(args, work, guest, image, None)
            runs = [one_boot(args, work, guest, image, m) for m in modes]
            log(f"round {rnd}: {without} IOPS without; " + "; ".join(
                f"{m}: {iops} IOPS, ready at {ready}, {state} at the end"
                for m, (iops, state, ready) in zip(modes, runs)))
            rows.append((rnd, without, runs))
    finally:
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    def ready_at(ready, state):
        return f"{ready:.1f} s ({state})" if ready is not None else f"- ({state})"

    print(f"The guest's 4 KiB randwrite IOPS (depth {args.depth}, {args.queues} queue(s), "
          f"{args.seconds} s) on a {args.size} qcow2 disk with {args.data} of data, "
          f"without a mirror and with one (granularity {args.granularity}) to a new qcow2 "
          f"started with the load, in each mode; 'ready at': seconds from the mirror's "
          f"start to ready ('-': not during the load), then the job's state at the "
          f"load's end:\n")
    print("| round | IOPS, no job | IOPS, background | ratio | background ready at "
          "| IOPS, write-blocking | ratio | write-blocking ready at |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for rnd, w, ((bi, bs, br), (wi, ws, wr)) in rows:
        print(f"| {rnd} | {w} | {bi} | {bi / w:.2f} | {ready_at(br, bs)} "
              f"| {wi} | {wi / w:.2f} | {ready_at(wr, ws)} |")
    wm = statistics.median(r[1] for r in rows)
    bm = statistics.median(r[2][0][0] for r in rows)
    km = statistics.median(r[2][1][0] for r in rows)
    bready = sum(1 for r in rows if r[2][0][2] is not None)
    kready = sum(1 for r in rows if r[2][1][2] is not None)
    print(f"| **median** | **{wm:.0f}** | **{bm:.0f}** | **{bm / wm:.2f}** "
          f"| ready in {bready} of {len(rows)} | **{km:.0f}** | **{km / wm:.2f}** "
          f"| ready in {kready} of {len(rows)} |")

if __name__ == "__main__":
    main()
