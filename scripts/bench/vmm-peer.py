#!/usr/bin/env python3
"""Side by side with the peer: the same guest I/O under upstream Cloud
Hypervisor's `cloud-hypervisor` and under ours. The bare-metal test guest
(tests/guest) boots under each VMM with the same image, vCPUs and queues
and runs its load mode (`load=SECONDS depth=N bs=B rw=RW`: every queue
kept busy at the set depth); the script prints one table of medians: the
guest's IOPS and the VMM's CPU per guest request, split by thread kind.

CPU per request counts the whole VMM process less the threads that stand
in for the guest (its vCPU threads, `vcpuN` in both VMMs), divided by the
requests the guest completed. It is sampled from /proc/PID/stat (the
whole process, threads that exited included) and /proc/PID/task/*/stat
(each thread, named by /proc/PID/task/*/comm) when the guest prints `LOAD
ready` (it then waits about 0.5 s with nothing in flight; a run whose
sample lands after `LOAD start` is run again, up to 3 times) and after `LOAD done` (the disks
are idle again, the guest parked). Thread kinds: "vcpu" `vcpuN`; "queue
workers" ours `virtio-blk-qN`, upstream `<disk id>_qN`; "io-wq"
io_uring's `iou-wrk-*`/`iou-sqp-*`; "other" the rest (main, API, signal
and KVM threads) and threads that exited during the load. utime+stime
are in clock ticks (10 ms each).

Runs are interleaved: every repeat runs every image under every VMM, the
VMM order alternating between repeats. Each image is made fresh by the
script: a raw file of random data (Python), and a fully allocated qcow2
converted from it with qemu-img; `--formats` may also name `blank-qcow2`,
an empty qcow2 (`qemu-img create`) made again before every run, so that
writes allocate clusters as on a new disk.

Data enters as the binaries (ours: --bin, default target/release;
upstream's: --upstream or the CH_UPSTREAM_DIR environment variable), the
test guest (--guest, else scripts/build-test-guest.sh) and the guest's
serial log; it leaves as a markdown table on stdout (progress on stderr)
and, with --json, every run.

Usage: scripts/bench/vmm-peer.py [--bin DIR] [--upstream DIR] [--guest ELF]
       [--dir DIR] [--size BYTES] [--formats raw,qcow2] [--queues N]
       [--depth N] [--bs 4k] [--rw randread] [--seconds S] [--repeats N]
       [--also-ours KEY=VALUE,...] [--json FILE] [--keep]
"""

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from guest_vm import wait_serial, stop

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CLK_TCK = os.sysconf("SC_CLK_TCK")
KINDS = ["worker", "io-wq", "other"]


class LateSample(RuntimeError):
    """The first sample came after the load had started: the run is
    repeated."""


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def thread_kind(comm):
    """The kind of a VMM thread from its name (/proc/.../comm)."""
    if re.fullmatch(r"vcpu\d+", comm):
        return "vcpu"
    if re.fullmatch(r"iou-(wrk|sqp)-\d+", comm):
        return "io-wq"
    if re.fullmatch(r"virtio-blk-q\d+", comm) or re.fullmatch(r".+_q\d+", comm):
        return "worker"
    return "other"


def stat_ticks(path):
    """utime + stime of a /proc stat file, in clock ticks."""
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def system_busy_ticks():
    """(busy, all) CPU ticks of the whole host from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return sum(v[:8]) - idle, sum(v[:8])


def sample(pid):
    """The VMM's CPU now: whole-process ticks and {tid: (comm, ticks)}."""
    whole = stat_ticks(f"/proc/{pid}/stat")
    threads = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read().strip()
            threads[tid] = (comm, stat_ticks(f"/proc/{pid}/task/{tid}/stat"))
        except OSError:
            continue  # the thread exited meanwhile: counted in whole
    return {"whole": whole, "threads": threads, "system": system_busy_ticks(),
            "t": time.monotonic()}


def cpu_split(a, b):
    """CPU seconds between samples a and b by thread kind; 'exited' is
    what the whole process used beyond its live threads."""
    out = {"vcpu": 0, "worker": 0, "io-wq": 0, "other": 0}
    by_name = {}
    live = 0
    for tid, (comm, ticks) in b["threads"].items():
        before = a["threads"].get(tid, (comm, 0))[1]
        out[thread_kind(comm)] += ticks - before
        name = re.sub(r"\d+", "N", comm)
        by_name[name] = by_name.get(name, 0) + ticks - before
        live += ticks - before
    whole = b["whole"] - a["whole"]
    out["exited"] = max(whole - live, 0)
    out["other"] += out["exited"]
    out["whole"] = whole
    split = {k: v / CLK_TCK for k, v in out.items()}
    split["by_name"] = {k: v / CLK_TCK for k, v in sorted(by_name.items())}
    return split


def make_blank(path, size):
    """An empty qcow2 at `path` (any older one removed first); then a
    sync, so the run does not share the disk with earlier writeback."""
    if os.path.exists(path):
        os.unlink(path)
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", path, str(size)], check=True)
    os.sync()


def make_images(work, size, formats):
    """A raw image of random data and, if asked, a qcow2 converted from
    it (every cluster allocated). Returns {format: path}."""
    raw = os.path.join(work, "disk.raw")
    chunk = os.urandom(1 << 20)
    with open(raw, "wb") as f:
        for _ in range(size // len(chunk)):
            f.write(chunk)
    images = {}
    if "raw" in formats:
        images["raw"] = raw
    if "qcow2" in formats:
        q = os.path.join(work, "disk.qcow2")
        subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, q],
                       check=True)
        images["qcow2"] = q
    # Written back before the first run, so no run shares the disk with
    # the images' own writeback.
    for path in images.values():
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    if "blank-qcow2" in formats:
        # Made before each run (make_blank).
        images["blank-qcow2"] = os.path.join(work, "blank.qcow2")
    return images


def parse_load(text):
    """The guest's LOAD lines: per-queue rows and the totals."""
    queues = []
    for m in re.finditer(r"^LOAD disk(\d+) q(\d+) requests=(\d+) kicks=(\d+) "
                         r"interrupts=(\d+)$", text, re.M):
        queues.append({"disk": int(m[1]), "queue": int(m[2]), "requests": int(m[3]),
                       "kicks": int(m[4]), "interrupts": int(m[5])})
    m = re.search(r"^LOAD done requests=(\d+) elapsed_us=(\d+) clock=(\w+) iops=(\d+)$",
                  text, re.M)
    if not m or not queues:
        raise RuntimeError(f"no LOAD lines:\n{text[-3000:]}")
    total, us, clock = int(m[1]), int(m[2]), m[3]
    if total != sum(q["requests"] for q in queues):
        raise RuntimeError("LOAD done does not add up the per-queue lines")
    return queues, total, us / 1000, clock


def run_one(vmm, image_fmt, image, args, guest, work):
    """Boots the guest's load under one VMM; returns the run's figures."""
    serial = os.path.join(work, "serial.log")
    if os.path.exists(serial):
        os.unlink(serial)
    cmdline = (f"disks=1 park load={args.seconds} depth={args.depth} bs={args.bs} "
               f"rw={args.rw}")
    image_type = "qcow2" if image_fmt == "blank-qcow2" else image_fmt
    disk = (f"path={image},num_queues={args.queues},queue_size={args.queue_size},"
            f"image_type={image_type}")
    if vmm["disk_extra"]:
        disk += "," + vmm["disk_extra"]
    argv = [vmm["binary"], "--kernel", guest, "--cmdline", cmdline,
            "--cpus", f"boot={args.queues}", "--memory", "size=128M",
            "--disk", disk, "--serial", f"file={serial}"] + vmm["extra_args"]
    err = open(os.path.join(work, f"{vmm['name']}.stderr"), "w")
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err)
    deadline = time.monotonic() + args.seconds + 180
    try:
        wait_serial(proc, serial, "LOAD ready", deadline)
        a = sample(proc.pid)
        with open(serial, errors="replace") as f:
            if "LOAD start" in f.read():
                raise LateSample("the first sample landed after LOAD start")
        wait_serial(proc, serial, "LOAD start", deadline)
        t_start = time.monotonic()
        wait_serial(proc, serial, "LOAD done", deadline)
        t_done = time.monotonic()
        text = wait_serial(proc, serial, "RESULT: PASS", deadline)
        b = sample(proc.pid)
    finally:
        stop(proc)
        err.close()
    queues, total, ms, clock = parse_load(text)
    cpu = cpu_split(a, b)
    busy = (b["system"][0] - a["system"][0]) / CLK_TCK
    window = b["t"] - a["t"]
    return {
        "vmm": vmm["name"], "image": image_fmt, "requests": total, "guest_ms": ms,
        "guest_clock": clock,
        "host_ms": (t_done - t_start) * 1000, "queues": queues, "cpu_s": cpu,
        "window_s": window,
        # CPUs the rest of the host kept busy during the window.
        "others_cpus": max(busy - cpu["whole"], 0) / window if window > 0 else 0,
        "argv": argv,
    }


def per_request_us(run, key):
    return run["cpu_s"][key] * 1e6 / run["requests"]


def figures(run):
    """The table's numbers for one run."""
    c = run["cpu_s"]
    return {
        "iops": run["requests"] * 1000 / run["guest_ms"],
        "host_iops": run["requests"] * 1000 / run["host_ms"],
        "vmm_us": (c["whole"] - c["vcpu"]) * 1e6 / run["requests"],
        "worker_us": per_request_us(run, "worker"),
        "iowq_us": per_request_us(run, "io-wq"),
        "other_us": per_request_us(run, "other"),
        "vcpu_us": per_request_us(run, "vcpu"),
        "irq_per_req": sum(q["interrupts"] for q in run["queues"]) / run["requests"],
        "kick_per_req": sum(q["kicks"] for q in run["queues"]) / run["requests"],
        "others_cpus": run["others_cpus"],
    }


def med(runs, key):
    return statistics.median(figures(r)[key] for r in runs)


def print_table(runs, vmms, formats, args):
    cols = ["image", "VMM", "guest IOPS", "IOPS by host clock",
            "VMM CPU us/req (whole less vCPUs)", "queue workers", "io-wq",
            "other", "vCPU threads", "interrupts/req", "kicks/req",
            "host CPUs busy besides the VMM"]
    print(f"{args.rw} bs={args.bs} depth={args.depth} per queue, {args.queues} queue(s), "
          f"{args.queues} vCPU(s), {args.seconds} s per run, medians of {args.repeats} "
          "interleaved repeats; CPU figures in us per guest request")
    print()
    print("| " + " | ".join(cols) + " |")
    print("| --- | --- |" + " ---: |" * (len(cols) - 2))
    for fmt in formats:
        for v in vmms:
            rs = [r for r in runs if r["image"] == fmt and r["vmm"] == v["name"]]
            if not rs:
                continue
            print(f"| {fmt} | {v['name']} | {med(rs, 'iops'):.0f} | {med(rs, 'host_iops'):.0f} "
                  f"| {med(rs, 'vmm_us'):.2f} | {med(rs, 'worker_us'):.2f} "
                  f"| {med(rs, 'iowq_us'):.2f} | {med(rs, 'other_us'):.2f} "
                  f"| {med(rs, 'vcpu_us'):.2f} | {med(rs, 'irq_per_req'):.3f} "
                  f"| {med(rs, 'kick_per_req'):.3f} | {med(rs, 'others_cpus'):.2f} |")
    print()
    print("Per repeat, each VMM of ours against upstream in the same repeat "
          "(median, then min-max):")
    print()
    print("| image | VMM | IOPS / upstream | VMM CPU per request / upstream |")
    print("| --- | --- | ---: | ---: |")
    for fmt in formats:
        for v in vmms[1:]:
            iops, cpu = [], []
            for rep in range(args.repeats):
                ours = [r for r in runs if r["image"] == fmt and r["vmm"] == v["name"]
                        and r["repeat"] == rep]
                peer = [r for r in runs if r["image"] == fmt and r["vmm"] == vmms[0]["name"]
                        and r["repeat"] == rep]
                if ours and peer:
                    fo, fp = figures(ours[0]), figures(peer[0])
                    iops.append(fo["iops"] / fp["iops"])
                    cpu.append(fo["vmm_us"] / fp["vmm_us"])
            if iops:
                print(f"| {fmt} | {v['name']} | {statistics.median(iops):.2f} "
                      f"({min(iops):.2f}-{max(iops):.2f}) | {statistics.median(cpu):.2f} "
                      f"({min(cpu):.2f}-{max(cpu):.2f}) |")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", default=os.path.join(REPO, "target", "release"),
                   help="folder with our cloud-hypervisor (default target/release)")
    p.add_argument("--upstream", default=os.environ.get("CH_UPSTREAM_DIR"),
                   help="folder with upstream's cloud-hypervisor (default $CH_UPSTREAM_DIR)")
    p.add_argument("--guest", help="the test guest ELF (default: build it)")
    p.add_argument("--dir", help="where the images go (default: a new folder in $TMPDIR)")
    p.add_argument("--size", type=int, default=1 << 30, help="image size in bytes")
    p.add_argument("--formats", default="raw,qcow2",
                   help="raw, qcow2 (allocated), blank-qcow2 (empty, made again per run)")
    p.add_argument("--queues", type=int, default=2, help="queues = vCPUs")
    p.add_argument("--queue-size", type=int, default=128)
    p.add_argument("--depth", type=int, default=16, help="requests in flight per queue")
    p.add_argument("--bs", default="4k")
    p.add_argument("--rw", default="randread",
                   choices=["randread", "randwrite", "read", "write"])
    p.add_argument("--seconds", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--also-ours", action="append", default=[], metavar="KEY=VALUE,...",
                   help="one more row: ours with these --disk keys added (repeatable)")
    p.add_argument("--json", help="write every run here")
    p.add_argument("--keep", action="store_true", help="keep the images and logs")
    return p.parse_args()


def main():
    args = parse_args()
    formats = [f for f in args.formats.split(",") if f]
    if not args.upstream:
        sys.exit("vmm-peer.py: upstream's binaries are needed: pass --upstream DIR or set "
                 "CH_UPSTREAM_DIR (no package provides them)")
    peer = os.path.join(args.upstream, "cloud-hypervisor")
    ours = os.path.join(args.bin, "cloud-hypervisor")
    for path in (peer, ours):
        if not os.access(path, os.X_OK):
            sys.exit(f"vmm-peer.py: {path} is not an executable")
    if any("qcow2" in f for f in formats) and not shutil.which("qemu-img"):
        sys.exit("vmm-peer.py: qemu-img is needed for the qcow2 image "
                 "(apt-get install -y qemu-utils)")
    guest = args.guest
    if not guest:
        out = subprocess.run(["bash", os.path.join(REPO, "scripts", "build-test-guest.sh")],
                             check=True, stdout=subprocess.PIPE, text=True).stdout
        guest = out.strip().splitlines()[-1]
    # Upstream: no virtio-console (its default is one on the terminal).
    vmms = [{"name": "upstream", "binary": peer, "disk_extra": "",
             "extra_args": ["--console", "off"]},
            {"name": "ours", "binary": ours, "disk_extra": "", "extra_args": []}]
    for extra in args.also_ours:
        vmms.append({"name": f"ours {extra}", "binary": ours, "disk_extra": extra,
                     "extra_args": []})

    work = tempfile.mkdtemp(prefix="vmm-peer-", dir=args.dir)
    runs = []
    try:
        log(f"making images of {args.size} bytes in {work}")
        images = make_images(work, args.size, formats)
        for rep in range(args.repeats):
            order = vmms if rep % 2 == 0 else list(reversed(vmms))
            for fmt in formats:
                for v in order:
                    if fmt == "blank-qcow2":
                        make_blank(images[fmt], args.size)
                    for attempt in range(3):
                        try:
                            r = run_one(v, fmt, images[fmt], args, guest, work)
                            break
                        except LateSample as e:
                            if attempt == 2:
                                raise
                            log(f"{v['name']} {fmt}: {e} (host too busy); running it again")
                    r["repeat"] = rep
                    runs.append(r)
                    f = figures(r)
                    log(f"repeat {rep + 1}/{args.repeats} {fmt:5} {v['name']:>10}: "
                        f"{f['iops']:8.0f} IOPS (host clock {f['host_iops']:8.0f}), "
                        f"VMM {f['vmm_us']:.2f} us/req (workers {f['worker_us']:.2f}, "
                        f"io-wq {f['iowq_us']:.2f}, other {f['other_us']:.2f}), "
                        f"others busy {f['others_cpus']:.2f} CPUs")
    finally:
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"args": vars(args), "guest": guest, "runs": runs}, f, indent=1)
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(f"command: {shlex.join(sys.argv)}")
    print()
    print_table(runs, vmms, formats, args)


if __name__ == "__main__":
    main()
