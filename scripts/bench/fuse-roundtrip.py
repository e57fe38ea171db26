#!/usr/bin/env python3
"""Where a FUSE request's time goes, and what it costs in counts a noisy
machine does not change: context switches and CPU per I/O of the daemon
and of fio, and (with --trace) a per-request latency breakdown from
kernel tracepoints.

For each backend (ours over /dev/fuse, ours over FUSE-over-io_uring,
qemu-storage-daemon, fio on the image file itself) and each (numjobs,
iodepth) cell, fio runs a fixed number of 4 KiB randrw 70/30 O_DIRECT
I/Os on the exported file (fio-export.py's backends and image). Counts:
the daemon's voluntary and involuntary context switches (every thread,
/proc/PID/task/*/status), its on-CPU time and migrations (`perf stat -p`:
task-clock is exact where utime+stime are tick samples), fio's context
switches and on-CPU time (`perf stat` around fio), each divided by the
I/Os done.

--trace (depth-1 cells with one job only): `perf record -a` of the
tracepoints fuse:fuse_request_send/end, block:block_rq_issue,
io_uring:io_uring_submit_req/complete during a shorter run; each fio I/O is followed by keys from fio's submit to
fio's completion (see `breakdown`): fio -> FUSE queued, queued ->
block issue (the daemon's wake-up, parse and submit), device + the
daemon's wake-up (issue -> the image I/O's CQE, posted when the woken
thread runs), CQE -> FUSE reply ended, reply -> fio's completion, fio's
own turn-around. Medians in microseconds.

--variant NAME=KEYS adds a backend `ours-devfuse@NAME` / `ours-uring@NAME`
whose export gets the extra KEYS (e.g. `--variant nopoll=poll_max_us=0`),
for A/B runs of export options.

--null measures the bare FUSE round trip instead: one thread preads 4
KiB at the end of the exported file, which every daemon answers with
an empty read without any I/O (on the image file itself the kernel
answers at once): the floor of any FUSE daemon at queue depth 1.

--buffered puts the image where --dir says with the daemons' backends
not O_DIRECT (ours direct=off, qsd cache.direct=off): with --dir on a
tmpfs the "device" is a memory copy and what is left is the FUSE round
trip itself (the floor of any FUSE daemon here).

Data enters as an image this script makes (qemu-img, fio) and as
/proc, getrusage and `perf script` output; it leaves as markdown on
stdout. Needs root (mounts, enable_uring, which it restores; perf).

Usage: scripts/bench/fuse-roundtrip.py [--bin FILE] [--dir DIR] [--ios N]
       [--format raw|qcow2] [--backends a,b] [--cells 1x1,4x1] [--trace]
       [--variant NAME=KEYS]... [--buffered] [--null]
"""

import argparse
import bisect
import glob
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
fe = __import__("fuse-export")

# The device's end is not traced directly: on this machine's kernel
# block_rq_complete fires for about 1 request in 200 and
# irq_handler_entry for 1 interrupt in 100 (counted against
# /proc/interrupts). At depth 1 the thread waiting for the I/O sleeps
# until the interrupt wakes it and posts the I/O's CQE when it runs, so
# "device+wake" runs from the block issue to that CQE (see `breakdown`).
TRACEPOINTS = ["fuse:fuse_request_send", "fuse:fuse_request_end",
               "block:block_rq_issue",
               "io_uring:io_uring_submit_req", "io_uring:io_uring_complete"]
SEGMENTS = ["fio->fuse", "fuse->issue", "device+wake", "cqe->reply", "reply->fio",
            "fio turn", "cycle"]


def ctx_switches(pid):
    """(voluntary, involuntary) context switches of every thread of pid."""
    vol = invol = 0
    for status in glob.glob(f"/proc/{pid}/task/*/status"):
        try:
            for line in open(status):
                if line.startswith("voluntary_ctxt_switches"):
                    vol += int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    invol += int(line.split()[1])
        except OSError:
            pass
    return vol, invol


def perf_stat(path):
    """{event: value} from a `perf stat -x,` output file."""
    values = {}
    for line in open(path):
        parts = line.strip().split(",")
        if len(parts) > 2 and parts[0].replace(".", "").isdigit():
            values[parts[2]] = float(parts[0])
    return values


STAT_EVENTS = "task-clock,context-switches,cpu-migrations"


class DaemonStat:
    """`perf stat` attached to a daemon: on-CPU ms (task-clock, exact,
    unlike the tick-sampled utime+stime) and context switches."""

    def __init__(self, pid, path):
        self.path = path
        self.proc = subprocess.Popen(["perf", "stat", "-x,", "-o", path, "-e", STAT_EVENTS,
                                      "-p", str(pid)], stderr=subprocess.DEVNULL)
        time.sleep(0.5)

    def stop(self):
        self.proc.send_signal(2)
        self.proc.wait()
        return perf_stat(self.path)


def fio_fixed(target, jobs, depth, ios, size, stat_path=None, extra=()):
    """fio for `ios` I/Os in all: (bytes, mean latency us, fio's perf stat)."""
    stat = ["perf", "stat", "-x,", "-o", stat_path, "-e", STAT_EVENTS, "--"] if stat_path else []
    out = fe.run(stat + ["fio", "--name=rt", f"--filename={target}", "--rw=randrw",
                  "--rwmixread=70", "--bs=4k", "--direct=1", "--ioengine=io_uring",
                  f"--iodepth={depth}", f"--numjobs={jobs}", "--group_reporting",
                  f"--number_ios={max(1, ios // jobs)}", f"--size={size}",
                  "--output-format=json", *extra])
    job = fe.json.loads(out[out.index("{"):])["jobs"][0]
    r, w = job["read"], job["write"]
    nbytes = r["io_bytes"] + w["io_bytes"]
    n = max(1, r["total_ios"] + w["total_ios"])
    lat = (r["lat_ns"]["mean"] * r["total_ios"] + w["lat_ns"]["mean"] * w["total_ios"]) / n / 1000
    return nbytes, lat, perf_stat(stat_path) if stat_path else {}


def null_roundtrips(target, n, cpus=None):
    """Mean us of `n` 4 KiB preads at the end of `target`: a FUSE daemon
    answers them without any I/O (reads stop at the end), so this is
    the bare round trip, application -> kernel -> daemon -> kernel ->
    application, with nothing else in it. `cpus`: run on those only."""
    old = os.sched_getaffinity(0)
    if cpus:
        os.sched_setaffinity(0, cpus)
    try:
        return timed_preads(target, n)
    finally:
        os.sched_setaffinity(0, old)


def timed_preads(target, n):
    fd = os.open(target, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        os.pread(fd, 4096, size)
        start = time.perf_counter()
        for _ in range(n):
            os.pread(fd, 4096, size)
        return (time.perf_counter() - start) / n * 1e6
    finally:
        os.close(fd)


def parse_perf(path):
    """[(time us, comm, tid, event, fields dict)] from `perf script`.

    Fields: FUSE `unique` and `opcode`; io_uring `ring`, `user_data` and
    `op` (its format has no `=`: "ring %p, req %p, user_data 0x...,
    opcode READ"); block `sector`."""
    out = subprocess.run(["perf", "script", "-i", path, "-F", "comm,tid,time,event,trace"],
                         capture_output=True, text=True).stdout
    events = []
    for line in out.splitlines():
        try:
            head, trace = line.split(": ", 1)
            # "comm tid time:" then "event:" (comm may contain spaces).
            parts = head.rsplit(None, 2)
            comm, tid, t = parts[0], int(parts[1]), float(parts[2]) * 1e6
            event, rest = trace.split(": ", 1) if ": " in trace else (trace.rstrip(":"), "")
            event = event.strip()
        except (ValueError, IndexError):
            continue
        fields = {}
        toks = rest.replace(",", " ").split()
        if event.startswith("fuse:"):
            if "req" in toks:
                fields["unique"] = toks[toks.index("req") + 1]
            if "opcode" in toks:
                fields["opcode"] = toks[toks.index("opcode") + 1]
        elif event.startswith("io_uring:") and "ring" in toks and "user_data" in toks:
            fields["ring"] = toks[toks.index("ring") + 1]
            fields["user_data"] = toks[toks.index("user_data") + 1]
            if "opcode" in toks:
                fields["op"] = toks[toks.index("opcode") + 1]
        elif event.startswith("block:") and "+" in toks:
            # "MAJ,MIN RWBS BYTES (cmd) SECTOR + N ..."
            fields["sector"] = toks[toks.index("+") - 1]
        events.append((t, comm.strip(), tid, event, fields))
    events.sort(key=lambda e: e[0])
    return events


def paired(starts, ends, key):
    """Each start event with the first end event of the same key after
    it: [(start, end or None)]."""
    by_key = {}
    for e in ends:
        by_key.setdefault(key(e), []).append(e[0])
    out = []
    for s in starts:
        times = by_key.get(key(s), [])
        i = bisect.bisect_right(times, s[0])
        out.append((s, times[i] if i < len(times) else None))
    return out


# Submits of image data (as opposed to the FUSE ring's own URING_CMD,
# POLL_ADD and eventfd READ, which live on rings without these opcodes
# apart from READ).
DATA_OPS = {"READ", "WRITE", "READV", "WRITEV", "READ_FIXED", "WRITE_FIXED"}


def breakdown(events, daemon_tids):
    """Per-read segments (us) of a depth-1, one-job fio run.

    Each fio I/O is followed by keys, not by time order alone (on this
    machine's kernel a tracepoint that fires as a CPU leaves idle is
    often lost: block_rq_complete, the disk's irq_handler_entry and the
    sched_switch that wakes a thread from idle are missing for most
    requests, so none of them is used):
    - fio's io_uring submit (t0) and its CQE (t6) share (ring,
      user_data), whatever thread posts the CQE;
    - the FUSE READ sent inside that window (t1) is matched to its end
      (t5) by `unique`;
    - the image I/O is the first data submit by a daemon thread on a
      ring that carries no FUSE commands, inside (t1, t5), matched to its
      CQE (t4) by (ring, user_data); the first block issue after that
      submit is t3. Its CQE is posted when the woken daemon thread runs
      the ring's task work, so t3 -> t4 is the device plus the wake-up.
    fio on the file: t0 -> the block issue -> fio's CQE."""
    seg = {s: [] for s in SEGMENTS}
    total = 0
    submits = [e for e in events if e[3] == "io_uring:io_uring_submit_req"]
    completes = [e for e in events if e[3] == "io_uring:io_uring_complete"]
    ud_key = lambda e: (e[4].get("ring"), e[4].get("user_data"))
    fio_rings = {e[4].get("ring") for e in submits if e[1].startswith("fio")}
    fio_ios = paired([e for e in submits if e[4].get("ring") in fio_rings],
                     [e for e in completes if e[4].get("ring") in fio_rings], ud_key)
    submit_times = [sub[0] for sub, _ in fio_ios]
    # Reads only: qemu-storage-daemon writes through its thread pool
    # (a blocking pwritev, no io_uring submit to follow), so its writes
    # cannot be split the same way; reads are 70 % of the mix.
    fio_ios = [io for io in fio_ios if io[0][4].get("op") == "READ"]
    fuse_rings = {e[4].get("ring") for e in submits if e[4].get("op") == "URING_CMD"}
    data_ios = paired([e for e in submits if e[2] in daemon_tids
                       and e[4].get("op") in DATA_OPS and e[4].get("ring") not in fuse_rings],
                      completes, ud_key)
    data_times = [sub[0] for sub, _ in data_ios]
    issue_times = [e[0] for e in events if e[3] == "block:block_rq_issue"
                   and "jbd2" not in e[1] and not e[1].startswith("kworker")
                   and e[4].get("sector")]
    sends = [e for e in events if e[3] == "fuse:fuse_request_send"
             and e[4].get("opcode") == "15"]
    send_times = [e[0] for e in sends]
    ends = {e[4].get("unique"): e[0] for e in events if e[3] == "fuse:fuse_request_end"}

    def first_in(times, lo, hi):
        """Index of the first time in (lo, hi], or None."""
        i = bisect.bisect_right(times, lo)
        return i if i < len(times) and times[i] <= hi else None

    for sub, t6 in fio_ios:
        t0 = sub[0]
        if t6 is None or t6 - t0 > 100000:
            continue
        if sends:
            j = first_in(send_times, t0, t6)
            if j is None:
                continue
            t1 = send_times[j]
            t5 = ends.get(sends[j][4].get("unique"))
            k = first_in(data_times, t1, t5) if t5 is not None else None
            if k is None or t5 > t6:
                continue
            t_sub, t4 = data_times[k], data_ios[k][1]
            if t4 is None or t4 > t5:
                continue
            i = first_in(issue_times, t_sub, t4)
            t3 = issue_times[i] if i is not None else t_sub
            seg["fio->fuse"].append(t1 - t0)
            seg["fuse->issue"].append(t3 - t1)
            seg["device+wake"].append(t4 - t3)
            seg["cqe->reply"].append(t5 - t4)
            seg["reply->fio"].append(t6 - t5)
        else:
            i = first_in(issue_times, t0, t6)
            if i is None:
                continue
            seg["fio->fuse"].append(issue_times[i] - t0)
            seg["device+wake"].append(t6 - issue_times[i])
        total += 1
        n = bisect.bisect_right(submit_times, t0)
        nxt = submit_times[n] if n < len(submit_times) else None
        if nxt is not None and nxt - t6 < 10000:
            seg["fio turn"].append(nxt - t6)
            seg["cycle"].append(nxt - t0)
    return seg, total


def traced(d, target, size, ios, perf_data, extra=()):
    perf = subprocess.Popen(["perf", "record", "-q", "-a", "-m", "1024", "-o", perf_data]
                            + [a for tp in TRACEPOINTS for a in ("-e", tp)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.5)
    fio_fixed(target, 1, 1, ios, size, extra=extra)
    perf.send_signal(2)
    perf.wait()
    tids = set()
    if d.proc:
        tids = {int(os.path.basename(p)) for p in glob.glob(f"/proc/{d.proc.pid}/task/*")}
    return breakdown(parse_perf(perf_data), tids)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", default="target/release/ch-storage-daemon")
    p.add_argument("--dir", default="/var/tmp/ch-fuse-roundtrip")
    p.add_argument("--ios", type=int, default=20000)
    p.add_argument("--size", type=int, default=256 << 20)
    p.add_argument("--format", default="raw")
    p.add_argument("--backends", default="ours-devfuse,ours-uring,qsd,fio-file")
    p.add_argument("--cells", default="1x1,4x1")
    p.add_argument("--trace", action="store_true")
    p.add_argument("--buffered", action="store_true")
    p.add_argument("--num-queues", type=int, default=2, help="our exports' num_queues")
    p.add_argument("--daemon-cpus", help="run the daemons under taskset -c LIST")
    p.add_argument("--app-cpus", help="--null: the reading thread on these CPUs (a,b)")
    p.add_argument("--null", action="store_true",
                   help="bare round trips (preads at the end of the file) instead of fio")
    p.add_argument("--variant", action="append", default=[])
    args = p.parse_args()
    args.formats = [args.format]
    os.makedirs(args.dir, exist_ok=True)
    cells = [tuple(int(x) for x in c.split("x")) for c in args.cells.split(",")]
    rows, traces, nulls = [], [], []
    with fe.uring_enabled():
        image, table = fe.one_format_setup(args)
        if args.buffered:
            for argv, _ in table.values():
                for i, a in enumerate(argv or []):
                    argv[i] = a.replace("direct=on", "direct=off")
        app_cpus = {int(c) for c in args.app_cpus.split(",")} if args.app_cpus else None
        for name in args.backends.split(","):
            argv, mp = table[name]
            if argv and args.daemon_cpus:
                argv = ["taskset", "-c", args.daemon_cpus] + argv
            target, extra = (mp, []) if mp else fe.file_target(image)
            if args.null:
                with fe.Daemon(name, argv, mp) as d:
                    null_roundtrips(target, 2000, app_cpus)  # warm-up
                    cs0 = ctx_switches(d.proc.pid) if d.proc else (0, 0)
                    dstat = DaemonStat(d.proc.pid, os.path.join(args.dir, "dstat")) if d.proc else None
                    us = null_roundtrips(target, args.ios, app_cpus)
                    dvals = dstat.stop() if dstat else {}
                    cs1 = ctx_switches(d.proc.pid) if d.proc else (0, 0)
                nulls.append((name, us, (cs1[0] - cs0[0]) / args.ios, (cs1[1] - cs0[1]) / args.ios,
                              dvals.get("task-clock", 0) * 1000 / args.ios))
                fe.log(f"{name}: {us:.1f} us per bare round trip")
                continue
            for jobs, depth in cells:
                with fe.Daemon(name, argv, mp) as d:
                    fio_fixed(target, jobs, depth, 2000, args.size, extra=extra)  # warm-up
                    cs0 = ctx_switches(d.proc.pid) if d.proc else (0, 0)
                    dstat = DaemonStat(d.proc.pid, os.path.join(args.dir, "dstat")) if d.proc else None
                    nbytes, lat, fstat = fio_fixed(target, jobs, depth, args.ios, args.size,
                                                   os.path.join(args.dir, "fstat"), extra)
                    dvals = dstat.stop() if dstat else {}
                    cs1 = ctx_switches(d.proc.pid) if d.proc else (0, 0)
                    ios = nbytes / 4096
                    rows.append((name, jobs, depth, lat,
                                 (cs1[0] - cs0[0]) / ios, (cs1[1] - cs0[1]) / ios,
                                 dvals.get("task-clock", 0) * 1000 / ios,
                                 dvals.get("cpu-migrations", 0) / ios,
                                 fstat.get("context-switches", 0) / ios,
                                 fstat.get("task-clock", 0) * 1000 / ios))
                    fe.log(f"{name} ({jobs},{depth}): lat {lat:.0f} us, "
                           f"daemon cs/IO {rows[-1][4]:.2f}+{rows[-1][5]:.2f}")
                    if args.trace and (jobs, depth) == (1, 1):
                        data = os.path.join(args.dir, f"perf-{name}.data")
                        seg, total = traced(d, target, args.size, 3000, data, extra)
                        traces.append((name, seg, total))
    if nulls:
        print(f"bare round trips: {args.ios} preads of 4 KiB at the end of the file, one "
              "thread, mean us (the daemon answers without I/O), per round trip\n")
        print("| backend | us | daemon cs vol | daemon cs invol | daemon CPU us |")
        print("| --- | --- | --- | --- | --- |")
        for name, us, vol, invol, cpu in nulls:
            print(f"| {name} | {us:.1f} | {vol:.2f} | {invol:.2f} | {cpu:.1f} |")
        return
    print(f"per fio I/O, 4k randrw 70/30 O_DIRECT, {args.ios} I/Os, {args.format}"
          f"{', buffered backends' if args.buffered else ''}, dir {args.dir}\n")
    print("| backend | jobs,depth | fio mean lat us | daemon cs vol | daemon cs invol "
          "| daemon CPU us | daemon migrations | fio cs | fio CPU us |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r[0]} | {r[1]},{r[2]} | {r[3]:.0f} | {r[4]:.2f} | {r[5]:.2f} | {r[6]:.1f} "
              f"| {r[7]:.2f} | {r[8]:.2f} | {r[9]:.1f} |")
    if traces:
        print("\nper-request breakdown at (1,1), perf tracepoints, medians in us "
              "(reads only; requests: fio reads matched; fio on the file: submit -> issue, "
              "issue -> its CQE)\n")
        print("| backend | requests | " + " | ".join(SEGMENTS) + " |")
        print("| --- | --- | " + " | ".join("---" for _ in SEGMENTS) + " |")
        for name, seg, total in traces:
            cells_ = " | ".join(f"{statistics.median(seg[s]):.1f}" if seg[s] else "-"
                                for s in SEGMENTS)
            print(f"| {name} | {total} | {cells_} |")


if __name__ == "__main__":
    main()
