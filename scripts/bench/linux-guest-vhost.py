#!/usr/bin/env python3
"""The Linux test guest's fio workload with our vhost-user-blk backend
(ch-storage-daemon) and with qemu-storage-daemon, interleaved: the guest's
fio figures side by side, and each backend's CPU seconds per GiB moved.

Each run makes a fresh image, starts one backend serving it over
vhost-user-blk, boots the guest of scripts/build-linux-guest.sh under
qemu-system-x86_64 (TCG unless --accel kvm) and lets /init run its `fio`
step (stonewalled groups of random writes with crc32c verify, each then
read back; see scripts/linux-guest-init.sh). The guest's numbers come from
the `CHTEST result name=fio-...` lines on the serial console. The backend's
CPU time is utime+stime from /proc/PID/stat, read after the guest powered
off and before the backend is stopped; GiB moved is the sum of what fio
read and wrote in the guest (boot-time reads of the partition probe are
not counted, so the figure slightly overstates CPU per GiB for both).

Under TCG the emulated guest is the bottleneck (a few thousand IOPS), so
the IOPS columns are a sanity comparison, not a performance figure; the
CPU per GiB column is the backend's own cost and is the one to compare.

Data leaves as a markdown table on stdout (progress on stderr) and, with
--json, every run's raw figures.

Usage: scripts/bench/linux-guest-vhost.py [--backends ours,qemu]
       [--repeats N] [--format qcow2|raw] [--queues N] [--cpus N]
       [--fio-size BYTES] [--fio-engines libaio+io_uring] [--fio-qds 1+32]
       [--fio-jobs 1+2] [--accel tcg|kvm] [--daemon PATH] [--json FILE]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GUEST_TIMEOUT = 900
DAEMON_TIMEOUT = 20
DISK_SIZE = 256 << 20
MEMORY = "1G"


def log(msg):
    print(f"linux-guest-vhost: {msg}", file=sys.stderr, flush=True)


def guest_files():
    kernel = os.environ.get("CH_LINUX_KERNEL")
    initramfs = os.environ.get("CH_LINUX_INITRAMFS")
    if kernel and initramfs:
        return kernel, initramfs
    out = subprocess.run(
        [os.path.join(REPO, "scripts/build-linux-guest.sh")],
        check=True, stdout=subprocess.PIPE, text=True,
    ).stdout
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return values["CH_LINUX_KERNEL"], values["CH_LINUX_INITRAMFS"]


def our_daemon(path):
    if path:
        return path
    subprocess.run(
        ["cargo", "build", "--release", "-q", "-p", "storage-daemon", "--bin", "ch-storage-daemon"],
        cwd=REPO, check=True,
    )
    meta = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps"],
        cwd=REPO, check=True, stdout=subprocess.PIPE, text=True,
    ).stdout
    return os.path.join(json.loads(meta)["target_directory"], "release", "ch-storage-daemon")


def backend_argv(backend, daemon, image, fmt, socket, queues):
    if backend == "ours":
        return [
            daemon, "--image", f"path={image},image_type={fmt}",
            "--export", f"type=vhost-user-blk,socket={socket},num_queues={queues},writable=on",
        ]
    return [
        "qemu-storage-daemon",
        "--blockdev", f"driver=file,node-name=file,filename={image},discard=unmap",
        "--blockdev", f"driver={fmt},node-name=disk,file=file,discard=unmap",
        "--export",
        f"type=vhost-user-blk,id=export,node-name=disk,addr.type=unix,addr.path={socket},"
        f"writable=on,num-queues={queues}",
    ]


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    # Fields after the ")" that ends the command name: utime is field 14,
    # stime field 15 of the whole line.
    fields = stat[stat.rindex(")") + 2:].split()
    ticks = int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def stop(proc, what):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(DAEMON_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"{what} ignored SIGTERM for {DAEMON_TIMEOUT} s")
    return proc.returncode


def parse_results(serial):
    results = {}
    for line in serial.splitlines():
        i = line.find("CHTEST result ")
        if i < 0:
            continue
        words = dict(w.split("=", 1) for w in line[i:].split() if "=" in w)
        results[words.get("name", "?")] = words
    return results


def one_run(args, backend, files, daemon):
    kernel, initramfs = files
    with tempfile.TemporaryDirectory(prefix="ch-lgv-") as tmp:
        image = os.path.join(tmp, f"disk.{args.format}")
        subprocess.run(["qemu-img", "create", "-q", "-f", args.format, image, str(DISK_SIZE)], check=True)
        socket = os.path.join(tmp, "disk.sock")
        daemon_log = open(os.path.join(tmp, "backend.log"), "w+")
        proc = subprocess.Popen(
            backend_argv(backend, daemon, image, args.format, socket, args.queues),
            stdin=subprocess.DEVNULL, stdout=daemon_log, stderr=subprocess.STDOUT,
        )
        try:
            end = time.monotonic() + DAEMON_TIMEOUT
            while not os.path.exists(socket):
                if proc.poll() is not None or time.monotonic() > end:
                    daemon_log.seek(0)
                    raise RuntimeError(f"{backend} backend did not listen:\n{daemon_log.read()}")
                time.sleep(0.05)
            serial_path = os.path.join(tmp, "serial.log")
            chtest = (
                f"chtest=info,fio chtest.fio_size={args.fio_size} "
                f"chtest.fio_engines={args.fio_engines} chtest.fio_qds={args.fio_qds} "
                f"chtest.fio_jobs={args.fio_jobs}"
            )
            qemu = [
                "qemu-system-x86_64", "-M", "q35", "-accel", args.accel,
                *(["-cpu", "host"] if args.accel == "kvm" else []),
                "-m", MEMORY, "-smp", str(args.cpus),
                "-nodefaults", "-display", "none", "-no-reboot",
                "-serial", f"file:{serial_path}",
                "-object", f"memory-backend-memfd,id=mem,size={MEMORY},share=on",
                "-numa", "node,memdev=mem",
                "-chardev", f"socket,id=disk0,path={socket}",
                "-device", f"vhost-user-blk-pci,chardev=disk0,num-queues={args.queues}",
                "-kernel", kernel, "-initrd", initramfs,
                "-append", f"console=ttyS0 quiet loglevel=1 panic=-1 {chtest}",
            ]
            start = time.monotonic()
            vm = subprocess.run(qemu, stdin=subprocess.DEVNULL, capture_output=True,
                                text=True, timeout=GUEST_TIMEOUT)
            elapsed = time.monotonic() - start
            if vm.returncode != 0:
                raise RuntimeError(f"qemu exited {vm.returncode}: {vm.stderr}")
            cpu = cpu_seconds(proc.pid)
        finally:
            rc = stop(proc, backend)
        with open(serial_path, errors="replace") as f:
            serial = f.read()
        if rc != 0:
            raise RuntimeError(f"{backend} backend exited with {rc}")
        results = parse_results(serial)
        failed = [r for r in results.values() if r.get("status") != "ok"]
        if failed or "CHTEST done failures=0" not in serial:
            raise RuntimeError(f"guest checks failed with {backend}:\n{serial[-3000:]}")
        fio = {n: r for n, r in results.items() if n.startswith("fio-")}
        moved = sum(int(r["read_kib"]) + int(r["write_kib"]) for r in fio.values()) * 1024
        return {"backend": backend, "cpu_s": cpu, "bytes": moved, "elapsed_s": elapsed, "fio": fio}


def median(values):
    return statistics.median(values) if values else float("nan")


def table(runs, backends):
    groups = sorted({g for r in runs for g in r["fio"]}, key=lambda g: (g == "fio-reverify", g))
    head = ["fio group (guest)"]
    for b in backends:
        head += [f"{b} write IOPS", f"{b} read IOPS"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for g in groups:
        row = [g]
        for b in backends:
            mine = [r["fio"][g] for r in runs if r["backend"] == b and g in r["fio"]]
            row.append(f"{median([float(x['write_iops']) for x in mine]):.0f}")
            row.append(f"{median([float(x['read_iops']) for x in mine]):.0f}")
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append("| backend | runs | CPU s per GiB moved (median) | samples |")
    lines.append("| --- | --- | --- | --- |")
    per_gib = {}
    for b in backends:
        samples = [r["cpu_s"] / (r["bytes"] / (1 << 30)) for r in runs if r["backend"] == b and r["bytes"]]
        per_gib[b] = median(samples)
        text = ", ".join(f"{s:.2f}" for s in samples)
        lines.append(f"| {b} | {len(samples)} | {per_gib[b]:.2f} | {text} |")
    if "ours" in per_gib and "qemu" in per_gib and per_gib["qemu"]:
        lines.append("")
        lines.append(f"ours / qemu-storage-daemon CPU per GiB: {per_gib['ours'] / per_gib['qemu']:.2f} x")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default="ours,qemu")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--format", default="qcow2", choices=["qcow2", "raw"])
    p.add_argument("--queues", type=int, default=2)
    p.add_argument("--cpus", type=int, default=2)
    p.add_argument("--fio-size", type=int, default=32 << 20, help="bytes per fio job")
    p.add_argument("--fio-engines", default="libaio+io_uring")
    p.add_argument("--fio-qds", default="1+32")
    p.add_argument("--fio-jobs", default="1+2")
    p.add_argument("--accel", default="tcg")
    p.add_argument("--daemon", help="ch-storage-daemon binary (default: cargo build --release)")
    p.add_argument("--json")
    args = p.parse_args()
    backends = [b for b in args.backends.split(",") if b]
    if any(b not in ("ours", "qemu") for b in backends):
        p.error("--backends takes ours and/or qemu")
    files = guest_files()
    daemon = our_daemon(args.daemon) if "ours" in backends else None
    runs = []
    for rep in range(args.repeats):
        order = backends[rep % len(backends):] + backends[:rep % len(backends)]
        for b in order:
            log(f"repeat {rep + 1}/{args.repeats}: {b}")
            run = one_run(args, b, files, daemon)
            log(f"  {run['cpu_s']:.2f} CPU s, {run['bytes'] / (1 << 20):.0f} MiB, {run['elapsed_s']:.1f} s")
            runs.append(run)
    print(f"Linux guest fio over vhost-user-blk ({args.format}, {args.queues} queues, "
          f"{args.cpus} vCPUs, accel {args.accel}, {args.repeats} repeats, medians)\n")
    print(table(runs, backends))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)


if __name__ == "__main__":
    main()
