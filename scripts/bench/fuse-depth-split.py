#!/usr/bin/env python3
"""Where a deep queue's requests wait: for each backend and (numjobs,
iodepth) cell, fio runs time-based on the exported file (fuse-export.py's
backends and image) and the kernel's tracepoints are recorded through
tracefs for a short window in the middle of the run.

Printed per run (markdown on stdout):
- the segments of a request, each as its mean time and, by Little's
  law (rate x mean time), how many requests sit in it on average:
  fio's io_uring submit -> CQE, FUSE request sent -> ended, a ring
  entry's request CQE -> its COMMIT_AND_FETCH (ring mode only: the
  time the daemon holds a request), the daemon's image I/O submit ->
  CQE, and the block layer's issue -> complete (the device);
- where the CPU time went, per CPU, by task (sched_switch);
- how long a woken fio or daemon thread waited to run, split by whether
  the CPU it was woken on was idle and whether the other CPUs were;
- the workqueue functions run most (O_DIRECT write completions run in
  a per-CPU workqueue on the CPU that took the disk's interrupt).

Unlike fuse-roundtrip.py --trace (depth 1, perf record), this records
with ftrace: at depth 64 every event is kept (block_rq_complete
included), which `perf record` on this machine's kernel loses.

Data enters as an image this script makes (qemu-img, fio) and as the
text of /sys/kernel/tracing/trace; it leaves as markdown on stdout.
Needs root (mounts, enable_uring, which it restores; tracefs, whose
events and buffer size it resets).

Usage: scripts/bench/fuse-depth-split.py [--bin FILE] [--dir DIR]
       [--format raw|qcow2] [--backends a,b] [--cells 1x64,4x64]
       [--seconds S] [--window S]
"""

import argparse
import collections
import os
import re
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
fe = __import__("fuse-export")

TRACEFS = "/sys/kernel/tracing"
EVENTS = ["fuse:fuse_request_send", "fuse:fuse_request_end",
          "io_uring:io_uring_submit_req", "io_uring:io_uring_complete",
          "block:block_rq_issue", "block:block_rq_complete",
          "sched:sched_switch", "sched:sched_wakeup",
          "workqueue:workqueue_execute_start"]
LINE = re.compile(r"^\s*(.+?)-(\d+)\s+\[(\d+)\]\s+\S+\s+([\d.]+):\s+(\w+):\s+(.*)$")
FIELD = re.compile(r"(\w+)[ =](\S+?),?(?=\s|$)")


def tracefs(name, value):
    with open(os.path.join(TRACEFS, name), "w") as f:
        f.write(value)


def mount_tracefs():
    """Mounts tracefs where it is missing (a fresh machine has it empty)."""
    if not os.path.exists(os.path.join(TRACEFS, "tracing_on")):
        subprocess.run(["mount", "-t", "tracefs", "nodev", TRACEFS], check=True)


def record(window):
    """The trace text of `window` seconds, all EVENTS on."""
    tracefs("tracing_on", "0")
    tracefs("trace", "")
    tracefs("buffer_size_kb", "65536")
    tracefs("set_event", "\n".join(EVENTS) + "\n")
    try:
        tracefs("tracing_on", "1")
        time.sleep(window)
        tracefs("tracing_on", "0")
        with open(os.path.join(TRACEFS, "trace")) as f:
            return f.read()
    finally:
        tracefs("tracing_on", "0")
        tracefs("set_event", "")
        tracefs("trace", "")
        tracefs("buffer_size_kb", "1408")


def parse(text):
    """[(time s, comm, pid, cpu, event, raw fields)]."""
    events = []
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            comm, pid, cpu, ts, name, rest = m.groups()
            events.append((float(ts), comm, int(pid), int(cpu), name, rest))
    return events


def fields(rest):
    out = {}
    for k, v in FIELD.findall(rest):
        out.setdefault(k, v)
    return out


def durations(events, start, end):
    """Seconds from each start event to the next end event of the same key;
    `start`/`end` map an event to its key or None."""
    open_, out = {}, []
    for e in events:
        k = start(e)
        if k is not None:
            open_[k] = e[0]
            continue
        k = end(e)
        if k is not None and k in open_:
            out.append(e[0] - open_.pop(k))
    return out


def segments(events):
    """[(segment, n, mean us, requests in it)]."""
    fuse_rings, data_rings, app_rings = set(), set(), set()
    for e in events:
        if e[4] != "io_uring_submit_req":
            continue
        f = fields(e[5])
        if f.get("opcode") == "URING_CMD":
            fuse_rings.add(f["ring"])
        elif e[1].startswith("fuse") or e[1].startswith("ch-storage"):
            data_rings.add(f["ring"])
        else:
            app_rings.add(f["ring"])
    data_rings -= fuse_rings

    def uring(rings, name, key):
        def f(e):
            if e[4] != name:
                return None
            fl = fields(e[5])
            return (fl["ring"], fl[key]) if fl.get("ring") in rings else None
        return f

    def fuse(name):
        return lambda e: fields(e[5]).get("req") if e[4] == name else None

    def block(name):
        def f(e):
            if e[4] != name:
                return None
            m = re.search(r"(\d+) \+ (\d+)", e[5])
            return m.group(1) if m else None
        return f

    span = events[-1][0] - events[0][0] if events else 0
    rows = []
    for label, start, end in [
        ("fio: io_uring submit -> CQE",
         uring(app_rings, "io_uring_submit_req", "req"), uring(app_rings, "io_uring_complete", "req")),
        ("FUSE: request sent -> ended", fuse("fuse_request_send"), fuse("fuse_request_end")),
        ("ring entry: request CQE -> commit",
         uring(fuse_rings, "io_uring_complete", "user_data"),
         uring(fuse_rings, "io_uring_submit_req", "user_data")),
        ("daemon image I/O: submit -> CQE",
         uring(data_rings, "io_uring_submit_req", "req"), uring(data_rings, "io_uring_complete", "req")),
        ("block: issue -> complete", block("block_rq_issue"), block("block_rq_complete")),
    ]:
        d = durations(events, start, end)
        if d and span > 0:
            mean = statistics.mean(d)
            rows.append((label, len(d), mean * 1e6, len(d) / span * mean))
        else:
            rows.append((label, 0, None, None))
    return rows


def cpu_shares(events):
    """{cpu: [(task, share)]} from sched_switch, tasks above 1 %."""
    busy = collections.defaultdict(collections.Counter)
    last = {}
    for ts, _, _, cpu, name, rest in events:
        if name != "sched_switch":
            continue
        prev = re.sub(r"/\d+$|\d+$", "", fields(rest).get("prev_comm", "?"))
        if cpu in last:
            busy[cpu][prev] += ts - last[cpu]
        last[cpu] = ts
    out = {}
    for cpu, c in sorted(busy.items()):
        total = sum(c.values()) or 1
        out[cpu] = [(t, v / total) for t, v in c.most_common() if v / total > 0.01]
    return out


def wake_latency(events):
    """{(who, where): [seconds from wake-up to running]}."""
    running, woken, out = {}, {}, collections.defaultdict(list)
    cpus = sorted({e[3] for e in events})
    for ts, _, _, cpu, name, rest in events:
        if name == "sched_switch":
            f = dict(re.findall(r"(\w+)=(\S+)", rest))
            running[cpu] = f.get("next_comm", "")
            key = woken.pop(f.get("next_pid"), None)
            if key:
                out[key[0]].append(ts - key[1])
        elif name == "sched_wakeup":
            f = dict(re.findall(r"(\w+)=(\S+)", rest))
            comm = f.get("comm", "")
            who = "fio" if comm == "fio" else "daemon" if comm.startswith("fuse") else None
            if who is None or "target_cpu" not in f:
                continue
            target = int(f["target_cpu"])
            idle = lambda c: running.get(c, "").startswith("swapper")
            others = [c for c in cpus if c != target]
            where = ("on an idle CPU" if idle(target) else "on a busy CPU") + (
                ", another idle" if any(idle(c) for c in others) else ", none other idle")
            woken[f["pid"]] = ((who, where), ts)
    return out


def workqueue(events, span):
    c = collections.Counter(e[5].split()[-1] for e in events if e[4] == "workqueue_execute_start")
    return [(fn, n / span) for fn, n in c.most_common(3)] if span > 0 else []


def report(name, cell, mib, events):
    span = events[-1][0] - events[0][0] if events else 0
    print(f"\n### {name}, {cell[0]} job(s) x depth {cell[1]}: {mib:.1f} MiB/s "
          f"(traced {span:.2f} s)\n")
    print("| segment | requests | mean us | in it (Little) |")
    print("| --- | --- | --- | --- |")
    for label, n, mean, inside in segments(events):
        if n:
            print(f"| {label} | {n} | {mean:.0f} | {inside:.1f} |")
    print("\n| CPU | tasks (share of the traced time) |")
    print("| --- | --- |")
    for cpu, tasks in cpu_shares(events).items():
        print(f"| {cpu} | " + ", ".join(f"{t} {100 * s:.0f} %" for t, s in tasks) + " |")
    print("\n| woken | where | wake-ups | mean us to run |")
    print("| --- | --- | --- | --- |")
    for (who, where), lat in sorted(wake_latency(events).items()):
        if len(lat) >= 10:
            print(f"| {who} | {where} | {len(lat)} | {statistics.mean(lat) * 1e6:.0f} |")
    wq = workqueue(events, span)
    if wq:
        print("\nworkqueue functions per second: "
              + ", ".join(f"{fn} {rate:.0f}" for fn, rate in wq))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", default="target/release/ch-storage-daemon")
    p.add_argument("--dir", default="/var/tmp/ch-fuse-split")
    p.add_argument("--size", type=int, default=256 << 20)
    p.add_argument("--format", default="raw")
    p.add_argument("--backends", default="ours-uring,ours-devfuse,fio-file")
    p.add_argument("--cells", default="1x64")
    p.add_argument("--seconds", type=float, default=5, help="fio's run time")
    p.add_argument("--window", type=float, default=0.5, help="traced seconds, mid-run")
    p.add_argument("--num-queues", type=int, default=2, help="our exports' num_queues")
    args = p.parse_args()
    args.formats = [args.format]
    os.makedirs(args.dir, exist_ok=True)
    mount_tracefs()
    cells = [tuple(int(x) for x in c.split("x")) for c in args.cells.split(",")]
    print(f"fio randrw 70/30 bs=4k direct=1 io_uring, {args.format} image of {args.size} bytes, "
          f"{args.seconds:g} s runs, {args.window:g} s traced from 2 s in")
    with fe.uring_enabled():
        image, table = fe.one_format_setup(args)
        for cell in cells:
            for name in args.backends.split(","):
                argv, mountpoint = table[name]
                with fe.Daemon(name, argv, mountpoint):
                    target, extra = (mountpoint, []) if mountpoint else fe.file_target(image)
                    fio = subprocess.Popen(
                        ["fio", "--name=split", f"--filename={target}", "--rw=randrw",
                         "--rwmixread=70", "--bs=4k", "--direct=1", "--ioengine=io_uring",
                         f"--iodepth={cell[1]}", f"--numjobs={cell[0]}", "--group_reporting",
                         "--time_based", f"--runtime={args.seconds}", f"--size={args.size}",
                         "--output-format=json", *extra], stdout=subprocess.PIPE, text=True)
                    time.sleep(min(2.0, args.seconds / 3))
                    text = record(args.window)
                    out, _ = fio.communicate()
                    job = fe.json.loads(out[out.index("{"):])["jobs"][0]
                    mib = (job["read"]["bw"] + job["write"]["bw"]) / 1024
                report(name, cell, mib, parse(text))


if __name__ == "__main__":
    main()
