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
tracepoints fuse:fuse_request_send/end, block:block_rq_issue/complete,
io_uring:io_uring_submit_req/complete and sched:sched_switch during a
shorter run; each READ/WRITE is followed from fio's submit to fio's
completion: fio -> FUSE queued, queued -> daemon thread running (and how
often it had to be woken), daemon -> block issue, device, device ->
FUSE reply ended (from the wake-up when there is no block I/O, an image
in memory), reply -> fio's completion, fio's own turn-around. Medians in
microseconds.

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

TRACEPOINTS = ["fuse:fuse_request_send", "fuse:fuse_request_end",
               "block:block_rq_issue", "block:block_rq_complete",
               "io_uring:io_uring_submit_req", "io_uring:io_uring_complete",
               "sched:sched_switch"]
SEGMENTS = ["fio->fuse", "fuse->daemon", "daemon->issue", "device",
            "device->reply", "reply->fio", "fio turn", "cycle"]


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


def fio_fixed(target, jobs, depth, ios, size, stat_path=None):
    """fio for `ios` I/Os in all: (bytes, mean latency us, fio's perf stat)."""
    stat = ["perf", "stat", "-x,", "-o", stat_path, "-e", STAT_EVENTS, "--"] if stat_path else []
    out = fe.run(stat + ["fio", "--name=rt", f"--filename={target}", "--rw=randrw",
                  "--rwmixread=70", "--bs=4k", "--direct=1", "--ioengine=io_uring",
                  f"--iodepth={depth}", f"--numjobs={jobs}", "--group_reporting",
                  f"--number_ios={max(1, ios // jobs)}", f"--size={size}",
                  "--output-format=json"])
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
    """[(time us, comm, tid, event, fields dict)] from `perf script`."""
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
        for tok in rest.replace("==>", " ").split():
            if "=" in tok:
                k, v = tok.split("=", 1)
                fields[k] = v
        if event.startswith("fuse:"):
            toks = rest.split()
            if "req" in toks:
                fields["unique"] = toks[toks.index("req") + 1]
            if "opcode" in toks:
                fields["opcode"] = toks[toks.index("opcode") + 1]
        events.append((t, comm.strip(), tid, event, fields))
    events.sort(key=lambda e: e[0])
    return events


def breakdown(events, daemon_tids):
    """Per-request segments (us) of a depth-1, one-job fio run."""
    seg = {s: [] for s in SEGMENTS}
    slept = total = 0
    is_fio = lambda e: e[1].startswith("fio")
    fio_submits = [e[0] for e in events if e[3] == "io_uring:io_uring_submit_req" and is_fio(e)]
    fio_cqes = [e[0] for e in events if e[3] == "io_uring:io_uring_complete" and is_fio(e)]
    issues = [e[0] for e in events if e[3] == "block:block_rq_issue"]
    completes = [e[0] for e in events if e[3] == "block:block_rq_complete"]
    daemon_in = [e[0] for e in events if e[3] == "sched:sched_switch"
                 and int(e[4].get("next_pid", -1)) in daemon_tids]
    sends = [e for e in events if e[3] == "fuse:fuse_request_send"
             and e[4].get("opcode") in ("15", "16")]
    ends = {e[4].get("unique"): e[0] for e in events if e[3] == "fuse:fuse_request_end"}

    def after(times, t, limit):

        i = bisect.bisect_right(times, t)
        return times[i] if i < len(times) and times[i] <= limit else None

    def before(times, t):

        i = bisect.bisect_left(times, t)
        return times[i - 1] if i > 0 else None

    if sends:
        for s in sends:
            t1, unique = s[0], s[4].get("unique")
            t5 = ends.get(unique)
            t0 = before(fio_submits, t1)
            if t5 is None or t0 is None or t1 - t0 > 1000:
                continue
            # No block events (an image in memory): the daemon's share
            # runs from its wake-up to the reply.
            t3 = after(issues, t1, t5)
            t4 = after(completes, t3, t5) if t3 else None
            t6 = after(fio_cqes, t5, t5 + 1000)
            if t6 is None or (t3 is None) != (t4 is None):
                continue
            total += 1
            t2 = after(daemon_in, t1, t3 or t5)
            if t2 is not None:
                slept += 1
            run_at = t2 if t2 is not None else t1
            nxt = after(fio_submits, t6, t6 + 10000)
            seg["fio->fuse"].append(t1 - t0)
            seg["fuse->daemon"].append(run_at - t1)
            if t3 is not None:
                seg["daemon->issue"].append(t3 - run_at)
                seg["device"].append(t4 - t3)
            seg["device->reply"].append(t5 - (t4 if t4 is not None else run_at))
            seg["reply->fio"].append(t6 - t5)
            if nxt:
                seg["fio turn"].append(nxt - t6)
                seg["cycle"].append(nxt - t0)
    else:
        # fio on the file: submit -> issue -> complete -> fio's CQE.
        for t0 in fio_submits:
            t3 = after(issues, t0, t0 + 1000)
            t4 = after(completes, t3, t3 + 100000) if t3 else None
            t6 = after(fio_cqes, t4, t4 + 1000) if t4 else None
            if None in (t3, t4, t6):
                continue
            total += 1
            nxt = after(fio_submits, t6, t6 + 10000)
            seg["fio->fuse"].append(t3 - t0)
            seg["device"].append(t4 - t3)
            seg["reply->fio"].append(t6 - t4)
            if nxt:
                seg["fio turn"].append(nxt - t6)
                seg["cycle"].append(nxt - t0)
    return seg, slept, total


def traced(d, target, size, ios, perf_data):
    perf = subprocess.Popen(["perf", "record", "-q", "-a", "-m", "1024", "-o", perf_data]
                            + [a for tp in TRACEPOINTS for a in ("-e", tp)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.5)
    fio_fixed(target, 1, 1, ios, size)
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
            target = mp or image
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
                    fio_fixed(target, jobs, depth, 2000, args.size)  # warm-up
                    cs0 = ctx_switches(d.proc.pid) if d.proc else (0, 0)
                    dstat = DaemonStat(d.proc.pid, os.path.join(args.dir, "dstat")) if d.proc else None
                    nbytes, lat, fstat = fio_fixed(target, jobs, depth, args.ios, args.size,
                                                   os.path.join(args.dir, "fstat"))
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
                        seg, slept, total = traced(d, target, args.size, 3000, data)
                        traces.append((name, seg, slept, total))
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
              "(woken: requests that found the daemon thread asleep)\n")
        print("| backend | requests | woken | " + " | ".join(SEGMENTS) + " |")
        print("| --- | --- | --- | " + " | ".join("---" for _ in SEGMENTS) + " |")
        for name, seg, slept, total in traces:
            cells_ = " | ".join(f"{statistics.median(seg[s]):.1f}" if seg[s] else "-"
                                for s in SEGMENTS)
            print(f"| {name} | {total} | {slept / max(1, total):.2f} | {cells_} |")


if __name__ == "__main__":
    main()
