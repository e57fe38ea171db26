//! How a FUSE queue thread learns that image I/O completed: it never
//! reads its disk queue's completion eventfd with a syscall (the /dev/fuse
//! thread watches it edge-triggered, the ring thread has a READ of it in
//! its own ring), so `strace` attached to the daemon sees no 8-byte
//! `read` while O_DIRECT reads go through the export (in io_uring mode no
//! `read` at all). The same trace must show the /dev/fuse reads or the
//! ring enters of the requests, which proves it was attached.
//! And which /dev/fuse queue threads wait for requests: with two queues,
//! the second waits on /dev/fuse only while the export is loaded. At
//! depth 1 it is not even woken (a sleeping sibling used to be woken for
//! most requests only to find them taken); a deep queue is served by both.
//! Needs root, strace and fio; skips without them unless CH_REQUIRE_ALL=1.

mod support;

use std::collections::HashMap;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::process::{Command, Stdio};
use std::time::Duration;

use support::{assert_ring_served, cannot_run, run, scratch, Daemon, Transport};

/// The `read`s strace logged, as (returned bytes) per call.
fn read_results(trace: &str) -> Vec<i64> {
    trace
        .lines()
        .filter(|l| l.contains("read(") && !l.contains("unfinished"))
        .filter_map(|l| l.rsplit("= ").next()?.split(' ').next()?.parse().ok())
        .collect()
}

fn no_eventfd_reads(transport: Transport) {
    if cannot_run(&["strace"]) {
        return;
    }
    let Some(_switch) = transport.prepare() else {
        return;
    };
    let dir = scratch(&format!("wakeups-{transport:?}"));
    let image = dir.join("disk.raw");
    std::fs::write(&image, vec![0x5au8; 1 << 20]).unwrap();
    let d = Daemon::start(
        &dir,
        &format!("path={},image_type=raw,direct=on", image.display()),
        &format!("{}num_queues=1", transport.options()),
    )
    .unwrap();
    let trace = dir.join("strace.txt");
    let strace = Command::new("strace")
        .args(["-f", "-e", "trace=read,io_uring_enter", "-o"])
        .arg(&trace)
        .args(["-p", &d.pid().to_string()])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // strace writes nothing until it has attached to every thread.
    std::thread::sleep(Duration::from_millis(500));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&d.mountpoint)
        .unwrap();
    let mut buf = block::aligned::AlignedBuf::new(4096, 4096).unwrap();
    for i in 0..300u64 {
        let n = file
            .read_at(buf.as_mut_slice(), (i * 7 % 256) * 4096)
            .unwrap();
        assert_eq!(n, 4096);
        assert!(buf.as_slice().iter().all(|&b| b == 0x5a), "read {i} wrong");
    }
    // SAFETY: signalling a child we started and have not waited for.
    unsafe { libc::kill(strace.id() as i32, libc::SIGINT) };
    testkit::wait_within(strace, "strace after SIGINT", Duration::from_secs(30));
    let log = d.stop();
    let text = std::fs::read_to_string(&trace).unwrap();
    let reads = read_results(&text);
    let eventfd_reads = reads.iter().filter(|&&n| n == 8).count();
    assert_eq!(eventfd_reads, 0, "8-byte reads (the eventfd):\n{text}");
    match transport {
        // Each request is one read of /dev/fuse (80 bytes of headers).
        Transport::DevFuse => assert!(
            reads.iter().filter(|&&n| n > 8).count() >= 300,
            "strace saw too few /dev/fuse reads: {reads:?}"
        ),
        Transport::IoUring => {
            // Nothing reads at all: requests come through the ring, and
            // a read of the eventfd, even one finding it empty, is a
            // syscall the ring's READ saves.
            let any_read = text.lines().filter(|l| l.contains("read(")).count();
            assert_eq!(any_read, 0, "reads in io_uring mode:\n{text}");
            assert_ring_served(&log);
            let enters = text
                .lines()
                .filter(|l| l.contains("io_uring_enter("))
                .count();
            assert!(enters >= 300, "strace saw {enters} io_uring_enters");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn completions_need_no_eventfd_read_devfuse() {
    no_eventfd_reads(Transport::DevFuse);
}

#[test]
fn completions_need_no_eventfd_read_io_uring() {
    no_eventfd_reads(Transport::IoUring);
}

/// `ios` random 4 KiB O_DIRECT reads of `file` by fio (io_uring):
/// `jobs` jobs at `depth`, as the benchmark's cells.
fn fio_reads(file: &std::path::Path, jobs: u32, depth: u32, ios: u32) {
    run(Command::new("fio")
        .arg("--name=reads")
        .arg(format!("--filename={}", file.display()))
        .args([
            "--rw=randread",
            "--bs=4k",
            "--size=16M",
            "--direct=1",
            "--ioengine=io_uring",
            "--output-format=terse",
        ])
        .arg(format!("--iodepth={depth}"))
        .arg(format!("--numjobs={jobs}"))
        .arg(format!("--number_ios={ios}")));
}

/// Voluntary context switches (sleeps) so far of the thread of `pid`
/// named `name`. The daemon answers once its mount is up, which can be
/// before its last queue thread has started and named itself on a busy
/// machine: the thread is waited for, up to 10 s.
fn thread_sleeps(pid: i32, name: &str) -> u64 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
            let task = task.unwrap().path();
            let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
            if comm.trim() != name {
                continue;
            }
            let status = std::fs::read_to_string(task.join("status")).unwrap();
            return status
                .lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no thread {name} in process {pid} after 10 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The CPUs thread `name` of `pid` may run on (`Cpus_allowed_list`;
/// the main thread's when `name` is None).
fn cpus_allowed(pid: i32, name: Option<&str>) -> String {
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap().path();
        let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
        let main = task.file_name().unwrap().to_string_lossy() == pid.to_string();
        if name.map_or(!main, |n| comm.trim() != n) {
            continue;
        }
        let status = std::fs::read_to_string(task.join("status")).unwrap();
        return status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap()
            .trim()
            .to_string();
    }
    panic!("no thread {name:?} in process {pid}");
}

/// Requests each /dev/fuse queue thread served, by thread name, from the
/// daemon's exit log ("queue fuse-qN: served M requests").
fn served_per_queue(log: &str) -> HashMap<String, u64> {
    log.lines()
        .filter_map(|l| {
            let rest = l.split("/dev/fuse queue ").nth(1)?;
            let (name, rest) = rest.split_once(": served ")?;
            Some((name.to_string(), rest.split(' ').next()?.parse().ok()?))
        })
        .collect()
}

/// Sleeps of the second queue thread while fio reads 1000 blocks through
/// `d` at depth 1.
fn helper_sleeps_in_depth1_reads(d: &Daemon) -> u64 {
    let before = thread_sleeps(d.pid(), "fuse-q1");
    fio_reads(&d.mountpoint, 1, 1, 1000);
    thread_sleeps(d.pid(), "fuse-q1") - before
}

#[test]
fn a_second_queue_thread_reads_only_under_load() {
    if cannot_run(&["fio"]) {
        return;
    }
    let dir = scratch("reader-gate");
    let image = dir.join("disk.raw");
    std::fs::write(&image, vec![0x5au8; 16 << 20]).unwrap();
    let image_keys = format!("path={},image_type=raw,direct=on", image.display());

    // One reader at depth 1: the first thread takes every request, and
    // the second sleeps through them.
    let d = Daemon::start(&dir, &image_keys, "num_queues=2").unwrap();
    let woken = helper_sleeps_in_depth1_reads(&d);
    let served = served_per_queue(&d.stop());
    assert!(
        woken < 100,
        "the idle second queue thread was woken {woken} times in 1000 reads"
    );
    assert_eq!(served.len(), 2, "{served:?}");
    assert!(served["fuse-q0"] >= 1000, "{served:?}");
    assert_eq!(
        served["fuse-q1"], 0,
        "the second queue read at depth 1: {served:?}"
    );

    // Four jobs at depth 16: both threads take requests, the second off
    // the first's CPU (where the machine has another). Back at depth 1
    // the second stops waiting on /dev/fuse once the export has been
    // quiet for a while (the first depth-1 run), gets every CPU back and
    // sleeps again.
    let d = Daemon::start(&dir, &image_keys, "num_queues=2").unwrap();
    let all_cpus = cpus_allowed(d.pid(), None);
    thread_sleeps(d.pid(), "fuse-q1"); // waits until the thread has started
    assert_eq!(cpus_allowed(d.pid(), Some("fuse-q1")), all_cpus);
    fio_reads(&d.mountpoint, 4, 16, 5000);
    let loaded = cpus_allowed(d.pid(), Some("fuse-q1"));
    let one_cpu = !all_cpus.contains([',', '-']);
    assert_eq!(
        loaded == all_cpus,
        one_cpu,
        "the reading helper may run on {loaded}, the daemon on {all_cpus}"
    );
    // The helper stops reading at a wake-up that finds the export quiet
    // for 20 ms; at depth 1 it is still woken now and then, sooner on an
    // idle machine than on a busy one.
    fio_reads(&d.mountpoint, 1, 1, 1000);
    let mut rounds = 0;
    while rounds < 20 && cpus_allowed(d.pid(), Some("fuse-q1")) != all_cpus {
        fio_reads(&d.mountpoint, 1, 1, 500);
        rounds += 1;
    }
    assert_eq!(
        cpus_allowed(d.pid(), Some("fuse-q1")),
        all_cpus,
        "the helper kept its narrowed CPUs through 1000 + {rounds} x 500 reads at depth 1"
    );
    let woken = helper_sleeps_in_depth1_reads(&d);
    let served = served_per_queue(&d.stop());
    assert!(
        served["fuse-q1"] > 0,
        "the second queue never read under load: {served:?}"
    );
    assert!(
        woken < 100,
        "after the load, the second queue thread was woken {woken} times in 1000 reads"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
