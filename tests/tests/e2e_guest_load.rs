//! End-to-end: the test guest's load mode (`load=SECONDS depth=N bs=B
//! rw=...`, tests/guest/README.md) under our `cloud-hypervisor`: every
//! queue of every disk completes requests in each of the four patterns,
//! the LOAD lines add up, the COUNT lines (the load included) match
//! vm.counters, sequential writes reach the image; options that cannot
//! work end the run with a clear RESULT: FAIL.

mod e2e_api_support;
mod e2e_support;

use std::path::Path;

use e2e_api_support::{guest_counts, have_curl, ApiVm};
use e2e_support::{boot, test_guest};
use integration_tests::{json, qemu_img, TempDir};

/// The numbers of one `LOAD diskD qQ ...` line: (disk, queue, requests,
/// kicks).
fn queue_lines(serial: &str) -> Vec<(u32, u32, u64, u64)> {
    serial
        .lines()
        .filter_map(|l| l.strip_prefix("LOAD disk"))
        .map(|rest| {
            let f: Vec<&str> = rest.split_whitespace().collect();
            let num = |s: &str, key: &str| -> u64 {
                s.strip_prefix(key)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("{key} in {rest:?}"))
            };
            (
                f[0].parse().expect("disk number"),
                num(f[1], "q") as u32,
                num(f[2], "requests="),
                num(f[3], "kicks="),
            )
        })
        .collect()
}

fn done_requests(serial: &str) -> u64 {
    let line = serial
        .lines()
        .find(|l| l.starts_with("LOAD done "))
        .unwrap_or_else(|| panic!("no LOAD done line:\n{serial}"));
    let v = line
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("requests="))
        .expect("requests=");
    v.parse().expect("a number")
}

#[test]
fn every_queue_completes_requests_and_the_counts_match_the_vmm() {
    if !have_curl() {
        return;
    }
    for rw in ["randread", "randwrite", "read", "write"] {
        let dir = TempDir::new(&format!("load-{rw}"));
        let raw = dir.file("a.raw");
        let qcow2 = dir.file("b.qcow2");
        qemu_img(&["create", "-q", "-f", "raw", &raw, "16M"]);
        qemu_img(&["create", "-q", "-f", "qcow2", &qcow2, "64M"]);
        let cmdline = format!("disks=2 counts park load=1 depth=4 bs=8k rw={rw}");
        let disk_a = format!("path={raw},num_queues=1");
        let disk_b = format!("path={qcow2},num_queues=2");
        let mut vm = ApiVm::start(
            &dir,
            &cmdline,
            &["--cpus", "boot=2", "--disk", &disk_a, "--disk", &disk_b],
        );
        let serial = vm.wait_for("info parked");
        let queues = queue_lines(&serial);
        let want: Vec<(u32, u32)> = vec![(0, 0), (1, 0), (1, 1)];
        let got: Vec<(u32, u32)> = queues.iter().map(|q| (q.0, q.1)).collect();
        assert_eq!(got, want, "{rw}: one LOAD line per queue:\n{serial}");
        for q in &queues {
            assert!(q.2 > 0, "{rw}: a queue completed nothing: {q:?}\n{serial}");
            assert!(q.3 <= q.2, "{rw}: more kicks than requests: {q:?}");
        }
        assert_eq!(
            queues.iter().map(|q| q.2).sum::<u64>(),
            done_requests(&serial),
            "{rw}: LOAD done is the sum of the queues:\n{serial}"
        );
        let counters = json(&vm.curl_ok("GET", "vm.counters", None, 200));
        for (n, id) in ["_disk0", "_disk1"].iter().enumerate() {
            for (key, want) in guest_counts(&serial, n) {
                if counters[id].get(&key).is_some() {
                    assert_eq!(counters[id][&key], want, "{rw} {id}.{key}: {counters}");
                }
            }
        }
        let (status, err) = vm.shutdown();
        assert!(status.success(), "{rw}: {err}");
        if rw == "write" {
            // Queue 0 of disk0 wrote sequentially from block 0, over what
            // the block checks left there.
            let data = std::fs::read(&raw).unwrap();
            assert!(
                data[..8192] == b"LOADLOAD".repeat(1024),
                "block 0 of {raw} starts {:?}",
                String::from_utf8_lossy(&data[..32])
            );
        }
    }
}

#[test]
fn load_options_that_cannot_work_fail_clearly() {
    let cases: [(&str, &str, &str); 5] = [
        (
            "load=1 depth=50",
            "",
            "depth=50 needs 150 descriptors, the ring has 128 (depth <= 42)",
        ),
        ("load=1 rw=write", ",readonly=on", "disk0 is read-only"),
        (
            "load=1 bs=1000",
            "",
            "bad guest option on cmdline (want bs=BYTES",
        ),
        (
            "load=0",
            "",
            "bad guest option on cmdline (want load=SECONDS",
        ),
        (
            "load=1 depth=40 bs=64k",
            "",
            "depth=40 x bs=65536 is more than the guest's 2097152-byte buffer",
        ),
    ];
    for (options, disk_extra, want) in cases {
        let dir = TempDir::new("load-bad");
        let raw = dir.file("a.raw");
        qemu_img(&["create", "-q", "-f", "raw", &raw, "16M"]);
        let disk = format!("path={raw},queue_size=128{disk_extra}");
        let b = boot(
            &dir,
            Path::new(test_guest()),
            &[
                "--cmdline",
                options,
                "--memory",
                "size=128M",
                "--disk",
                &disk,
            ],
        );
        let line = b
            .serial
            .lines()
            .find(|l| l.starts_with("RESULT:"))
            .unwrap_or_else(|| panic!("{options}: no RESULT line:\n{}", b.serial));
        assert!(
            line.starts_with("RESULT: FAIL") && line.contains(want),
            "{options}: {line:?}, want a failure naming {want:?}"
        );
        assert!(!b.serial.contains("LOAD start"), "{options}: {}", b.serial);
    }
}
