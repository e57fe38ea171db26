#!/usr/bin/env python3
"""NBD benchmark: our export against qemu-storage-daemon's and qemu-nbd's
(fio's nbd engine as the client), and our client (ch-img bench) against
qemu-img bench on the same servers.

Export rows: 4 KiB randread and randwrite, iodepth 1 and 32, 1 and 4
connections (fio numjobs: one connection each), over a Unix socket and
over TCP on loopback; each server serves the same raw image on tmpfs,
buffered, with io_uring (ours: engine=auto; qemu: aio=io_uring). Beside
the IOPS: the server process's CPU (user+system from /proc/PID/stat)
per request, in microseconds.

Client rows: `ch-img bench` and `qemu-img bench` (4 KiB sequential, the
only pattern qemu-img bench has; reads, and writes with -w), depth 1 and
32, against qemu-storage-daemon and qemu-nbd on a Unix socket.

Each repeat runs every server (or client) once per cell, in an order
rotated per repeat; tables quote medians and the ratios ours/theirs. The
figures depend on the machine's load: the script prints the load average
at its start and end.

Usage: scripts/bench/nbd.py [--quick] [--dir DIR] [--bin-dir DIR]
       [--repeats N] [--seconds S] [--count N] [--size BYTES]
       [--json FILE]
"""

import argparse
import contextlib
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time

SERVERS = ["ours", "qsd", "qemu-nbd"]
CLIENTS = ["ch-img", "qemu-img"]


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def cpu_seconds(pid):
    """utime + stime of a process (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def connectable(transport, where):
    try:
        if transport == "unix":
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(where)
        else:
            with socket.create_connection(("127.0.0.1", where), timeout=1):
                pass
        return True
    except OSError:
        return False


class Server:
    """One NBD server serving `image` over `transport` (unix or tcp)."""

    def __init__(self, name, args, image, transport):
        self.name, self.image, self.transport = name, image, transport
        if transport == "unix":
            self.where = os.path.join(args.dir, f"{name}.sock")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.where)
        else:
            self.where = free_port()
        export = "disk" if name == "qsd" else ""
        self.uri = (
            f"nbd+unix:///{export}?socket={self.where}"
            if transport == "unix"
            else f"nbd://127.0.0.1:{self.where}/{export}"
        )
        self.argv = self.command(args, export)
        self.proc = None

    def command(self, args, export):
        unix = self.transport == "unix"
        if self.name == "ours":
            addr = f"unix:{self.where}" if unix else f"tcp:127.0.0.1:{self.where}"
            return [
                os.path.join(args.bin_dir, "ch-storage-daemon"),
                "--image", f"path={self.image},image_type=raw",
                "--export", f"type=nbd,addr={addr},writable=on",
            ]
        if self.name == "qsd":
            addr = (
                f"addr.type=unix,addr.path={self.where}"
                if unix
                else f"addr.type=inet,addr.host=127.0.0.1,addr.port={self.where}"
            )
            return [
                "qemu-storage-daemon",
                "--blockdev", f"driver=file,filename={self.image},node-name=f,aio=io_uring",
                "--blockdev", "driver=raw,file=f,node-name=d",
                "--nbd-server", addr,
                "--export", f"type=nbd,id=e,node-name=d,name={export},writable=on",
            ]
        where = ["-k", self.where] if unix else ["-b", "127.0.0.1", "-p", str(self.where)]
        return ["qemu-nbd", "-t", "-e", "8", "--aio=io_uring", "-f", "raw", *where, self.image]

    def __enter__(self):
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        end = time.time() + 30
        while not connectable(self.transport, self.where):
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.proc.stderr.read()}")
            if time.time() > end:
                raise RuntimeError(f"{self.name} did not start")
            time.sleep(0.05)
        return self

    def cpu(self):
        return cpu_seconds(self.proc.pid)

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.transport == "unix":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.where)


def fio(uri, rw, depth, jobs, args):
    out = run([
        "fio", "--name=nbd", "--ioengine=nbd", f"--uri={uri}", f"--rw={rw}", "--bs=4k",
        f"--iodepth={depth}", f"--numjobs={jobs}", "--group_reporting", "--time_based",
        f"--runtime={args.seconds}", "--ramp_time=1", f"--size={args.size}",
        "--randrepeat=0", "--norandommap", "--output-format=json",
    ], timeout=args.seconds * 4 + 120)
    # The nbd engine prints "connected to NBD server" before the JSON.
    job = json.loads(out[out.index("{"):])["jobs"][0]
    side = job["read"] if "read" in rw else job["write"]
    return side["iops"], side["total_ios"]


def export_cell(server, rw, depth, jobs, args):
    before = server.cpu()
    iops, ios = fio(server.uri, rw, depth, jobs, args)
    cpu = server.cpu() - before
    # ramp_time's I/O is not in total_ios; scale CPU to the measured part.
    us = cpu / max(ios, 1) * 1e6 * args.seconds / (args.seconds + 1)
    return {"iops": iops, "cpu_us": us}


def bench(client, uri, write, depth, args):
    binary = os.path.join(args.bin_dir, "ch-img") if client == "ch-img" else "qemu-img"
    cmd = [binary, "bench", "-c", str(args.count), "-d", str(depth), "-s", "4096", "-f", "raw"]
    if write:
        cmd.append("-w")
    out = run(cmd + [uri], timeout=600)
    secs = float(re.search(r"Run completed in ([0-9.]+) seconds", out).group(1))
    return {"iops": args.count / secs}


def rotate(items, k):
    k %= len(items)
    return items[k:] + items[:k]


def median(samples, key, **match):
    vals = [s[key] for s in samples if all(s.get(k) == v for k, v in match.items())]
    return statistics.median(vals) if vals else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 repeat, 3 s cells, fewer requests")
    ap.add_argument("--dir", default="/dev/shm/ch-nbd-bench", help="where the image lives (tmpfs)")
    ap.add_argument("--bin-dir", default="target/release", help="where ch-img and ch-storage-daemon are")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=10, help="fio runtime per export cell")
    ap.add_argument("--count", type=int, default=200000, help="requests per bench run")
    ap.add_argument("--size", type=int, default=256 << 20, help="image size in bytes")
    ap.add_argument("--json", help="write every sample here")
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.seconds, args.count = 1, 3, 50000
    for tool in ["fio", "qemu-img", "qemu-nbd", "qemu-storage-daemon"]:
        if not shutil.which(tool):
            sys.exit(f"nbd.py: {tool} is missing")
    for b in ["ch-img", "ch-storage-daemon"]:
        if not os.access(os.path.join(args.bin_dir, b), os.X_OK):
            sys.exit(f"nbd.py: no {b} in {args.bin_dir} (cargo build --release)")
    os.makedirs(args.dir, exist_ok=True)
    image = os.path.join(args.dir, "disk.raw")
    # A fully written image: no hole changes what a read costs.
    run(["fio", "--name=fill", f"--filename={image}", "--rw=write", "--bs=1M", f"--size={args.size}"])
    load_start = os.getloadavg()
    samples = []
    cells = [(t, rw, d, j) for t in ["unix", "tcp"] for rw in ["randread", "randwrite"] for d in [1, 32] for j in [1, 4]]
    for rep in range(args.repeats):
        for t, rw, d, j in cells:
            for name in rotate(SERVERS, rep):
                with Server(name, args, image, t) as s:
                    r = export_cell(s, rw, d, j, args)
                log(f"repeat {rep} export {name} {t} {rw} qd{d} conns{j}: {r['iops']:.0f} IOPS, {r['cpu_us']:.1f} us/IO")
                samples.append({"kind": "export", "server": name, "transport": t, "rw": rw, "depth": d, "jobs": j, **r})
        for srv in ["qsd", "qemu-nbd"]:
            with Server(srv, args, image, "unix") as s:
                for write in [False, True]:
                    for d in [1, 32]:
                        for client in rotate(CLIENTS, rep):
                            r = bench(client, s.uri, write, d, args)
                            log(f"repeat {rep} client {client} on {srv} {'write' if write else 'read'} qd{d}: {r['iops']:.0f} IOPS")
                            samples.append({"kind": "client", "client": client, "server": srv, "write": write, "depth": d, **r})
    load_end = os.getloadavg()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"samples": samples, "load": [load_start, load_end]}, f, indent=1)
    print(f"load average at start {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}, "
          f"at end {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f}; {args.repeats} repeats, "
          f"{args.seconds} s fio cells, {args.count} bench requests\n")
    print("Export: fio nbd engine, 4 KiB; IOPS (server CPU us per request)\n")
    print("| transport | rw | QD | conns | ours | qemu-storage-daemon | qemu-nbd | ours/qsd | ours/qemu-nbd |")
    print("|---|---|---|---|---|---|---|---|---|")
    for t, rw, d, j in cells:
        m = {n: (median(samples, "iops", kind="export", server=n, transport=t, rw=rw, depth=d, jobs=j),
                 median(samples, "cpu_us", kind="export", server=n, transport=t, rw=rw, depth=d, jobs=j))
             for n in SERVERS}
        cell = lambda n: f"{m[n][0]:.0f} ({m[n][1]:.1f})"
        print(f"| {t} | {rw} | {d} | {j} | {cell('ours')} | {cell('qsd')} | {cell('qemu-nbd')} "
              f"| {m['ours'][0] / m['qsd'][0]:.2f} | {m['ours'][0] / m['qemu-nbd'][0]:.2f} |")
    print("\nClient: bench, 4 KiB sequential, Unix socket; IOPS\n")
    print("| server | op | QD | ch-img bench | qemu-img bench | ours/qemu |")
    print("|---|---|---|---|---|---|")
    for srv in ["qsd", "qemu-nbd"]:
        for write in [False, True]:
            for d in [1, 32]:
                a = median(samples, "iops", kind="client", client="ch-img", server=srv, write=write, depth=d)
                b = median(samples, "iops", kind="client", client="qemu-img", server=srv, write=write, depth=d)
                print(f"| {srv} | {'write' if write else 'read'} | {d} | {a:.0f} | {b:.0f} | {a / b:.2f} |")


if __name__ == "__main__":
    main()
