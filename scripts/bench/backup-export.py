#!/usr/bin/env python3
"""The point-in-time backup export (`vm.disk-backup-begin`/`-end`,
docs/backup.md) of a running disk: how fast a full backup reads, against
qemu-storage-daemon's NBD export of the same image, and what a backup
costs the guest's writes.

Images: a raw file of random data (Python) and a fully allocated qcow2
converted from it with qemu-img, `--size` bytes each, in a new folder
under `--dir`; every scratch file goes to the same folder.

Part "read" (each image of `--formats`): our `cloud-hypervisor` boots
the bare-metal test guest (tests/guest) with the image as its one disk
and the command line `park`: after its block checks the guest idles and
the VM stays up through every repeat. Each repeat reads the whole image
once through each server, the order alternating between repeats:
- ours: `ch-remote disk-backup-begin` (a Unix socket, a new scratch
  qcow2), `nbdcopy URI null:`, `ch-remote disk-backup-end`;
- qsd: `qemu-storage-daemon` with the same image (`--blockdev` file
  with aio=io_uring and the format driver, both read-only with
  force-share, since the VM holds the image) and `--export type=nbd`
  over a Unix socket, started before and stopped after the read;
  `nbdcopy URI null:` the same way.
Only nbdcopy is timed (its own defaults: its connections, requests in
flight and extent queries). The page cache is warm for both: the image
file is read once (`cat`, untimed) before every read, and neither server
is asked for O_DIRECT. The table has the medians; the ratio is
ours/qsd of the copy time within each repeat (median, then min-max):
below 1.0 ours is faster.

Part "iops" (the qcow2): the guest boots with
`load=S depth=D bs=B rw=randwrite` (every queue kept busy, `--queues`
queues and vCPUs) and prints its IOPS by its own clock. Each repeat
boots it once per mode, the order alternating: "no backup"; "backup
open" (begun when the guest prints `LOAD ready`, about 0.5 s before the
load starts, ended after the load; nothing reads it: the cost of
copy-before-write alone); "backup read" (the same, and nbdcopy reads the
export to null: from the begin until the load is done, again and again).
Every first write to a granule waits for its copy to the scratch, so
the cost falls on the first pass over the disk; the table also has the
scratch file's size at the end (what was copied) and how many whole
reads nbdcopy finished during the load.

Usage: scripts/bench/backup-export.py [--bin DIR] [--guest ELF]
       [--dir DIR] [--size BYTES] [--formats qcow2,raw] [--parts read,iops]
       [--repeats N] [--seconds S] [--queues N] [--depth N] [--bs 4k]
       [--json FILE] [--keep]
Prints markdown tables on stdout, progress on stderr.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from guest_vm import POLL_S, serial_text, wait_serial, stop

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MODES = ["no backup", "backup open", "backup read"]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def make_images(work, size, formats):
    """A raw image of random data and a qcow2 converted from it (every
    cluster allocated), written back to the disk. Returns {format: path}."""
    raw = os.path.join(work, "disk.raw")
    chunk = os.urandom(1 << 20)
    with open(raw, "wb") as f:
        for i in range(size // len(chunk)):
            # A different first 8 bytes per MiB: no two MiB alike.
            f.write(i.to_bytes(8, "little") + chunk[8:])
    images = {"raw": raw}
    if "qcow2" in formats:
        q = os.path.join(work, "disk.qcow2")
        subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, q],
                       check=True)
        images["qcow2"] = q
    for path in images.values():
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    return images


class Vm:
    """Our VMM with the test guest and one disk, driven over its API
    socket with our ch-remote."""

    def __init__(self, args, guest, work, image, fmt, cmdline, queues=1):
        self.args, self.work = args, work
        self.sock = os.path.join(work, "api.sock")
        self.serial = os.path.join(work, "serial.log")
        for p in (self.sock, self.serial):
            if os.path.exists(p):
                os.unlink(p)
        argv = [os.path.join(args.bin, "cloud-hypervisor"), "--api-socket",
                f"path={self.sock}", "--kernel", guest, "--cmdline", cmdline,
                "--cpus", f"boot={queues}", "--memory", "size=128M",
                "--serial", f"file={self.serial}",
                "--disk", f"path={image},id=d0,image_type={fmt},num_queues={queues}"]
        self.err = open(os.path.join(work, "vmm.stderr"), "w")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.err,
                                     stderr=self.err)

    def wait(self, needle, seconds):
        return wait_serial(self.proc, self.serial, needle, time.monotonic() + seconds)

    def remote(self, *cmd):
        r = subprocess.run([os.path.join(self.args.bin, "ch-remote"), "--api-socket",
                            self.sock, *cmd], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"ch-remote {' '.join(cmd)}: {r.stderr.strip()}")
        return r.stdout

    def backup_begin(self, name):
        sock = os.path.join(self.work, f"{name}.sock")
        scratch = os.path.join(self.work, f"{name}-scratch.qcow2")
        out = self.remote("disk-backup-begin", "--disk", "d0", "--addr", f"unix:{sock}",
                          "--scratch", scratch)
        return json.loads(out)["uri"], scratch

    def backup_end(self):
        return json.loads(self.remote("disk-backup-end", "--disk", "d0") or "{}")

    def close(self):
        try:
            if self.proc.poll() is None:
                self.remote("shutdown-vmm")
                self.proc.wait(timeout=30)
        except (RuntimeError, subprocess.TimeoutExpired):
            pass
        finally:
            stop(self.proc)
            self.err.close()


def nbdcopy(uri):
    """Reads the whole export to null:; seconds."""
    t = time.monotonic()
    subprocess.run(["nbdcopy", uri, "null:"], check=True, timeout=600)
    return time.monotonic() - t


def warm(path):
    subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)


def qsd_start(image, fmt, work):
    sock = os.path.join(work, "qsd.sock")
    if os.path.exists(sock):
        os.unlink(sock)
    argv = ["qemu-storage-daemon",
            "--blockdev", f"driver=file,filename={image},node-name=f,aio=io_uring,"
            "read-only=on,force-share=on",
            "--blockdev", f"driver={fmt},file=f,node-name=d,read-only=on,force-share=on",
            "--nbd-server", f"addr.type=unix,addr.path={sock}",
            "--export", "type=nbd,id=e,node-name=d,name=d"]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not os.path.exists(sock):
        if proc.poll() is not None:
            raise RuntimeError(f"qemu-storage-daemon: {proc.stderr.read()}")
        if time.monotonic() > deadline:
            stop(proc)
            raise RuntimeError("qemu-storage-daemon did not start")
        time.sleep(POLL_S)
    return proc, f"nbd+unix:///d?socket={sock}"


def multi_conn(uri):
    r = subprocess.run(["nbdinfo", "--can", "multi-conn", uri], capture_output=True)
    return "yes" if r.returncode == 0 else "no"


def part_read(args, guest, work, images, formats):
    """Full backup reads against qsd, per format; a list of runs."""
    runs = []
    for fmt in formats:
        image = images[fmt]
        vm = Vm(args, guest, work, image, fmt, "park")
        try:
            vm.wait("RESULT: PASS", 120)
            for rep in range(args.repeats):
                order = ["ours", "qsd"] if rep % 2 == 0 else ["qsd", "ours"]
                for server in order:
                    warm(image)
                    if server == "ours":
                        t = time.monotonic()
                        uri, _ = vm.backup_begin("read")
                        begin_ms = (time.monotonic() - t) * 1000
                        mc = multi_conn(uri)
                        secs = nbdcopy(uri)
                        t = time.monotonic()
                        ended = vm.backup_end()
                        end_ms = (time.monotonic() - t) * 1000
                        if ended.get("status", "completed") == "failed":
                            raise RuntimeError(f"backup failed: {ended}")
                        extra = {"begin_ms": begin_ms, "end_ms": end_ms}
                    else:
                        proc, uri = qsd_start(image, fmt, work)
                        try:
                            mc = multi_conn(uri)
                            secs = nbdcopy(uri)
                        finally:
                            stop(proc)
                        extra = {}
                    run = {"part": "read", "format": fmt, "server": server, "repeat": rep,
                           "seconds": secs, "multi_conn": mc,
                           "mib_s": args.size / secs / (1 << 20), **extra}
                    runs.append(run)
                    log(f"read {fmt} repeat {rep + 1}/{args.repeats} {server:4}: "
                        f"{secs:.3f} s ({run['mib_s']:.0f} MiB/s), load {loadavg()}")
        finally:
            vm.close()
    return runs


def reader_loop(uri, stop_event, done):
    """nbdcopy to null: again and again until stop_event; appends each
    finished read's seconds to done."""
    while not stop_event.is_set():
        t = time.monotonic()
        p = subprocess.Popen(["nbdcopy", uri, "null:"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        while p.poll() is None:
            if stop_event.wait(0.02):
                p.terminate()
                p.wait()
                return
        if p.returncode != 0:
            raise RuntimeError(f"nbdcopy failed ({p.returncode})")
        done.append(time.monotonic() - t)


def load_run(args, guest, work, image, mode):
    """One boot with the write load in one mode; the run's figures."""
    cmdline = (f"disks=1 park load={args.seconds} depth={args.depth} bs={args.bs} "
               "rw=randwrite")
    vm = Vm(args, guest, work, image, "qcow2", cmdline, args.queues)
    run = {"part": "iops", "mode": mode, "reads_done": 0, "scratch_mib": 0.0}
    try:
        vm.wait("LOAD ready", 120)
        stop_event, done, thread = threading.Event(), [], None
        if mode != "no backup":
            t = time.monotonic()
            uri, scratch = vm.backup_begin("load")
            run["begin_ms"] = (time.monotonic() - t) * 1000
            if "LOAD start" in serial_text(vm.serial):
                log("  (the load started before the backup began)")
            if mode == "backup read":
                thread = threading.Thread(target=reader_loop, args=(uri, stop_event, done))
                thread.start()
        vm.wait("LOAD done", args.seconds + 120)
        if thread:
            stop_event.set()
            thread.join()
            run["reads_done"] = len(done)
        if mode != "no backup":
            run["scratch_mib"] = os.path.getsize(scratch) / (1 << 20)
            ended = vm.backup_end()
            if ended.get("status", "completed") == "failed":
                raise RuntimeError(f"backup failed: {ended}")
        text = vm.wait("RESULT: PASS", 60)
    finally:
        vm.close()
    line = next(l for l in text.splitlines() if l.startswith("LOAD done "))
    fields = dict(kv.split("=") for kv in line.split()[2:])
    run["iops"] = int(fields["iops"])
    run["clock"] = fields["clock"]
    return run


def part_iops(args, guest, work, image):
    runs = []
    for rep in range(args.repeats):
        order = MODES if rep % 2 == 0 else list(reversed(MODES))
        for mode in order:
            run = load_run(args, guest, work, image, mode)
            run["repeat"] = rep
            runs.append(run)
            log(f"iops repeat {rep + 1}/{args.repeats} {mode:11}: {run['iops']} IOPS, "
                f"scratch {run['scratch_mib']:.0f} MiB, reads {run['reads_done']}, "
                f"load {loadavg()}")
    return runs


def spread(values):
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def print_read(runs, formats, args):
    print(f"Full read of a {args.size >> 20} MiB image with `nbdcopy URI null:`, "
          f"medians of {args.repeats} interleaved repeats, page cache warm for both")
    print()
    print("| image | server | multi-conn | copy s | MiB/s | begin ms | end ms "
          "| ours/qsd copy time |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for fmt in formats:
        by = {s: [r for r in runs if r["format"] == fmt and r["server"] == s]
              for s in ("ours", "qsd")}
        ratios = []
        for rep in range(args.repeats):
            o = [r for r in by["ours"] if r["repeat"] == rep]
            q = [r for r in by["qsd"] if r["repeat"] == rep]
            if o and q:
                ratios.append(o[0]["seconds"] / q[0]["seconds"])
        for s in ("ours", "qsd"):
            rs = by[s]
            if not rs:
                continue
            def med(key, rs=rs):
                return statistics.median(r[key] for r in rs)
            be = (f"{med('begin_ms'):.1f} | {med('end_ms'):.1f}" if s == "ours"
                  else "- | -")
            ratio = spread(ratios) if s == "ours" and ratios else ""
            print(f"| {fmt} | {'ours (backup export)' if s == 'ours' else 'qsd'} "
                  f"| {rs[0]['multi_conn']} | {med('seconds'):.3f} | {med('mib_s'):.0f} "
                  f"| {be} | {ratio} |")


def print_iops(runs, args):
    print(f"Guest random writes: `load={args.seconds} depth={args.depth} bs={args.bs} "
          f"rw=randwrite`, {args.queues} queue(s) and vCPU(s), {args.size >> 20} MiB "
          f"qcow2, medians of {args.repeats} interleaved repeats")
    print()
    print("| mode | guest IOPS | / no backup (per repeat) | scratch MiB at the end "
          "| whole reads during the load |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for mode in MODES:
        rs = [r for r in runs if r["mode"] == mode]
        if not rs:
            continue
        ratios = []
        for rep in range(args.repeats):
            base = [r for r in runs if r["mode"] == "no backup" and r["repeat"] == rep]
            this = [r for r in rs if r["repeat"] == rep]
            if base and this:
                ratios.append(this[0]["iops"] / base[0]["iops"])
        ratio = "1" if mode == "no backup" else spread(ratios)
        scratch = ("-" if mode == "no backup"
                   else f"{statistics.median(r['scratch_mib'] for r in rs):.0f}")
        reads = ("-" if mode != "backup read"
                 else f"{statistics.median(r['reads_done'] for r in rs):g}")
        print(f"| {mode} | {statistics.median(r['iops'] for r in rs):.0f} | {ratio} "
              f"| {scratch} | {reads} |")


def parse_size(text):
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    if text[-1:].lower() in units:
        return int(text[:-1]) * units[text[-1].lower()]
    return int(text)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", default=os.path.join(REPO, "target", "release"),
                   help="folder with our cloud-hypervisor and ch-remote")
    p.add_argument("--guest", help="the test guest ELF (default: build it)")
    p.add_argument("--dir", help="where the images and scratch files go "
                   "(default: a new folder in $TMPDIR)")
    p.add_argument("--size", type=parse_size, default=1 << 30, help="image size (1G)")
    p.add_argument("--formats", default="qcow2,raw", help="images of the read part")
    p.add_argument("--parts", default="read,iops")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seconds", type=int, default=10, help="load seconds per boot")
    p.add_argument("--queues", type=int, default=1, help="queues = vCPUs (iops part)")
    p.add_argument("--depth", type=int, default=32, help="requests in flight per queue")
    p.add_argument("--bs", default="4k")
    p.add_argument("--json", help="write every run here")
    p.add_argument("--keep", action="store_true", help="keep the images and logs")
    args = p.parse_args()
    formats = [f for f in args.formats.split(",") if f]
    parts = [x for x in args.parts.split(",") if x]
    for tool in ["qemu-img", "qemu-storage-daemon", "nbdcopy", "nbdinfo"]:
        if not shutil.which(tool):
            sys.exit(f"backup-export.py: {tool} is needed (apt-get install -y qemu-utils "
                     "qemu-system-common libnbd-bin)")
    for b in ("cloud-hypervisor", "ch-remote"):
        if not os.access(os.path.join(args.bin, b), os.X_OK):
            sys.exit(f"backup-export.py: no {b} in {args.bin}")
    guest = args.guest or subprocess.run(
        [os.path.join(REPO, "scripts", "build-test-guest.sh")], check=True,
        capture_output=True, text=True).stdout.strip().splitlines()[-1]
    work = tempfile.mkdtemp(prefix="backup-export-", dir=args.dir)
    log(f"load average at the start: {loadavg()}")
    runs = []
    try:
        log(f"making images of {args.size} bytes in {work}")
        images = make_images(work, args.size, set(formats) | {"qcow2"})
        if "read" in parts:
            runs += part_read(args, guest, work, images, formats)
        if "iops" in parts:
            runs += part_iops(args, guest, work, images["qcow2"])
    finally:
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), "runs": runs}, f, indent=1)
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    log(f"load average at the end: {loadavg()}")
    if "read" in parts:
        print_read([r for r in runs if r["part"] == "read"], formats, args)
        print()
    if "iops" in parts:
        print_iops([r for r in runs if r["part"] == "iops"], args)


if __name__ == "__main__":
    main()
