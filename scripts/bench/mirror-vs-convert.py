#!/usr/bin/env python3
"""How fast `vm.disk-mirror` copies an idle guest's disk, against
`qemu-img convert` of the same image to the same kind of target.

The bare-metal test guest (tests/guest) boots parked (`disks=1 park`: it
does no I/O) with one disk, a `--size` image of `--format` whose first
`--data` bytes are written (qemu-io, a pattern) and the rest left
unallocated. Then, `--rounds` times, interleaved, in the same folder:

- mirror: `ch-remote disk-mirror` to a new target of `--target-format`;
  the time from the request to the job's `ready` (polled every 10 ms
  with `ch-remote disk-jobs`), plus the cancel that closes the target
  (a cancel at ready flushes it: the copy is on disk, as convert's is);
- convert: `qemu-img convert -U -O FMT SOURCE TARGET` (`-U`: the VMM
  holds the image's lock), run to its end. Its default target cache
  mode is `unsafe` (no fdatasync: the copy may still be in the page
  cache when it exits), so it runs twice: as it is, and with
  `-t writeback` (it fdatasyncs at close, as the mirror's cancel does).

Each target is deleted before the next; each run starts after a
sync (no dirty page cache left by the source's making or another
run), and the order of the three runs turns every round. The table has one row per
round and the median; "ratio" is convert's time (`-t writeback`) over
the mirror's (above 1: the mirror is faster).

Usage: scripts/bench/mirror-vs-convert.py [--bin DIR] [--guest ELF]
       [--dir DIR] [--format qcow2|raw] [--target-format qcow2|raw]
       [--size 2G] [--data 1G] [--rounds 5] [--keep]
Prints a markdown table on stdout, progress on stderr.
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from guest_vm import wait_serial, remote

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def mirror_once(args, sock, target):
    start = time.monotonic()
    job = json.loads(remote(args.bin, sock, "disk-mirror", "--disk", "d0", "--target", target,
                            "--format", args.target_format))["job"]
    while True:
        state = next(j for j in json.loads(remote(args.bin, sock, "disk-jobs"))
                     if j["id"] == job)
        if state["state"] == "ready":
            break
        if state["state"] in ("failed", "cancelled", "completed"):
            raise RuntimeError(f"mirror ended {state}")
        if time.monotonic() - start > 600:
            raise RuntimeError("mirror not ready in 10 minutes")
        time.sleep(0.01)
    ready = time.monotonic() - start
    remote(args.bin, sock, "disk-job-cancel", job)
    total = time.monotonic() - start
    log(f"  mirror: ready after {ready:.3f} s, cancelled (target closed) after {total:.3f} s")
    return total


def convert_once(args, source, target, cache):
    start = time.monotonic()
    subprocess.run(["qemu-img", "convert", "-U", "-t", cache, "-f", args.format,
                    "-O", args.target_format, source, target], check=True, timeout=600)
    return time.monotonic() - start


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", default=os.path.join(REPO, "target", "release"))
    p.add_argument("--guest")
    p.add_argument("--dir")
    p.add_argument("--format", default="qcow2", choices=["qcow2", "raw"])
    p.add_argument("--target-format", default="qcow2", choices=["qcow2", "raw"])
    p.add_argument("--size", default="2G")
    p.add_argument("--data", default="1G")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--keep", action="store_true")
    args = p.parse_args()
    guest = args.guest or subprocess.run(
        [os.path.join(REPO, "scripts", "build-test-guest.sh")], check=True,
        capture_output=True, text=True).stdout.strip().splitlines()[-1]
    work = tempfile.mkdtemp(prefix="mirror-vs-convert-", dir=args.dir)
    source = os.path.join(work, f"src.{args.format}")
    subprocess.run(["qemu-img", "create", "-q", "-f", args.format, source, args.size],
                   check=True)
    subprocess.run(["qemu-io", "-f", args.format, "-c", f"write -P 0x5a 0 {args.data}",
                    source], check=True, capture_output=True)
    serial = os.path.join(work, "serial.log")
    sock = os.path.join(work, "api.sock")
    err = open(os.path.join(work, "vmm.stderr"), "w")
    proc = subprocess.Popen(
        [os.path.join(args.bin, "cloud-hypervisor"), "--api-socket", f"path={sock}",
         "--kernel", guest, "--cmdline", "disks=1 park", "--memory", "size=128M",
         "--serial", f"file={serial}", "--disk", f"path={source},id=d0"],
        stdin=subprocess.DEVNULL, stdout=err, stderr=err)
    rows = []
    try:
        wait_serial(proc, serial, "info parked", time.monotonic() + 120)
        target = os.path.join(work, f"dst.{args.target_format}")
        ops = {
            "mirror": lambda: mirror_once(args, sock, target),
            "unsafe": lambda: convert_once(args, source, target, "unsafe"),
            "writeback": lambda: convert_once(args, source, target, "writeback"),
        }
        for r in range(1, args.rounds + 1):
            # The order turns every round, and each run starts with no
            # dirty page cache (the source's first write, another run's
            # target), so neither side pays for the other's writeback.
            names = list(ops)
            names = names[(r - 1) % len(names):] + names[:(r - 1) % len(names)]
            took = {}
            for name in names:
                os.sync()
                took[name] = ops[name]()
                os.unlink(target)
            m, u, c = took["mirror"], took["unsafe"], took["writeback"]
            log(f"round {r} ({', '.join(names)}): mirror {m:.3f} s, convert {u:.3f} s, "
                f"-t writeback {c:.3f} s")
            rows.append((r, m, u, c))
        remote(args.bin, sock, "shutdown-vmm")
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        err.close()
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"Mirror of an idle guest's {args.size} {args.format} disk ({args.data} of data, "
          f"the rest unallocated) to a new {args.target_format}, against "
          f"`qemu-img convert -U -O {args.target_format}`, interleaved:\n")
    print("| round | mirror s (to ready + cancel) | convert s (-t unsafe) | convert s "
          "(-t writeback) | ratio convert (writeback) / mirror |")
    print("| --- | --- | --- | --- | --- |")
    for r, m, u, c in rows:
        print(f"| {r} | {m:.3f} | {u:.3f} | {c:.3f} | {c / m:.2f} |")
    mm, um, cm = (statistics.median(x[i] for x in rows) for i in (1, 2, 3))
    print(f"| **median** | **{mm:.3f}** | **{um:.3f}** | **{cm:.3f}** | **{cm / mm:.2f}** |")


if __name__ == "__main__":
    main()
