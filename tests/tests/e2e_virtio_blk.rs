//! End-to-end: the real `cloud-hypervisor` binary boots the bare-metal
//! test guest (tests/guest, built by scripts/build-test-guest.sh) with
//! virtio-blk disks in many set-ups. Each boot has a timeout, must print
//! `RESULT: PASS` on the serial port and exit 0; afterwards `qemu-img
//! check` must be clean and the guest's write pattern (tests/guest/README.md)
//! must be in the image (`qemu-io read -P`).

mod e2e_support;

use e2e_support::{
    boot, check_clean, check_pattern, create_lazy_qcow2, dirty_flag, test_guest, Boot,
};
use integration_tests::{json, qemu_create_overlay, qemu_img, qemu_io, TempDir};

/// Boots the test guest and asserts PASS and a clean exit.
fn boot_guest(dir: &TempDir, disks: &[String], cmdline: &str) -> Boot {
    boot_guest_with(dir, disks, cmdline, &[])
}

/// As [`boot_guest`], with extra VMM arguments.
fn boot_guest_with(dir: &TempDir, disks: &[String], cmdline: &str, extra: &[&str]) -> Boot {
    let mut args: Vec<String> = vec!["--cmdline".into(), cmdline.into()];
    args.extend(extra.iter().map(|a| a.to_string()));
    for d in disks {
        args.push("--disk".into());
        args.push(d.clone());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let b = boot(dir, test_guest(), &args);
    assert!(
        b.serial.lines().any(|l| l == "RESULT: PASS"),
        "guest did not pass.\nserial:\n{}\nstderr:\n{}",
        b.serial,
        b.stderr
    );
    assert!(b.status.success(), "VMM exit {}: {}", b.status, b.stderr);
    b
}

fn make_image(dir: &TempDir, name: &str, fmt: &str, size: &str) -> String {
    let p = dir.file(name);
    qemu_img(&["create", "-q", "-f", fmt, &p, size]);
    p
}

fn run_one(fmt: &str, opts: &str, queues: u64) {
    let dir = TempDir::new("e2e");
    let img = make_image(&dir, &format!("disk.{fmt}"), fmt, "64M");
    let b = boot_guest(&dir, &[format!("path={img},{opts}")], "disks=1");
    assert!(
        b.stderr.contains("engine"),
        "no engine log line: {}",
        b.stderr
    );
    if fmt == "qcow2" {
        check_clean(&img);
    }
    check_pattern(fmt, &img, queues);
}

#[test]
fn raw_one_queue_sync() {
    run_one("raw", "num_queues=1,engine=sync", 1);
}

#[test]
fn raw_four_queues_io_uring() {
    run_one("raw", "num_queues=4,engine=io_uring", 4);
}

#[test]
fn raw_direct_io_uring() {
    run_one("raw", "num_queues=2,direct=on,engine=io_uring", 2);
}

#[test]
fn raw_direct_sync() {
    run_one("raw", "direct=on,engine=sync,image_type=raw", 1);
}

#[test]
fn qcow2_two_queues_threads_writethrough() {
    run_one("qcow2", "num_queues=2,engine=threads,cache=writethrough", 2);
}

#[test]
fn raw_two_queues_aio_cache_none() {
    run_one("raw", "num_queues=2,engine=aio,cache=none", 2);
}

#[test]
fn qcow2_aio_directsync() {
    run_one("qcow2", "engine=aio,cache=directsync", 1);
}

#[test]
fn qcow2_one_queue_sync() {
    run_one("qcow2", "engine=sync", 1);
}

#[test]
fn qcow2_four_queues_io_uring() {
    run_one("qcow2", "num_queues=4,engine=io_uring,queue_size=256", 4);
}

/// Throttled queues (Cloud Hypervisor's bw_*/ops_* keys): the guest's
/// requests outrun two ops per 20 ms and 64 KiB per 10 ms, so the workers
/// wait on their timers, under the default seccomp filters, and the
/// guest still finishes with the right data.
#[test]
fn qcow2_throttled_queues() {
    run_one(
        "qcow2",
        "num_queues=2,engine=io_uring,ops_size=2,ops_refill_time=20,\
         bw_size=65536,bw_one_time_burst=4096,bw_refill_time=10",
        2,
    );
}

/// Busy-polling queue workers (`poll_us`): they spin on the rings and the
/// disk's completions under the default seccomp filters, and the guest
/// finishes with the right data.
#[test]
fn qcow2_busy_poll_queues() {
    run_one("qcow2", "num_queues=2,engine=io_uring,poll_us=50", 2);
}

/// Queues pinned with Cloud Hypervisor's `queue_affinity` key: the workers
/// set their CPU affinity under the default seccomp filters and the guest
/// finishes with the right data.
#[test]
fn raw_pinned_queues() {
    let allowed = std::fs::read_to_string("/proc/self/status").unwrap();
    let list = allowed
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim();
    // The first CPU this process may use.
    let cpu = list.split([',', '-']).next().unwrap();
    run_one(
        "raw",
        &format!("num_queues=2,engine=io_uring,queue_affinity=[0@[{cpu}]]"),
        2,
    );
}

#[test]
fn qcow2_direct_auto_engine() {
    run_one(
        "qcow2",
        "num_queues=2,direct=on,engine=auto,image_type=qcow2",
        2,
    );
}

#[test]
fn qcow2_lazy_refcounts_dirty_bit_cleared_on_exit() {
    let dir = TempDir::new("e2e-lazy");
    let img = dir.file("lazy.qcow2");
    create_lazy_qcow2(&img, "64M");
    boot_guest(&dir, &[format!("path={img},num_queues=2")], "disks=1");
    assert!(!dirty_flag(&img), "dirty bit left set after a clean exit");
    check_clean(&img);
    check_pattern("qcow2", &img, 2);
}

#[test]
fn qcow2_overlay_on_backing_file() {
    let dir = TempDir::new("e2e-overlay");
    let base = make_image(&dir, "base.qcow2", "qcow2", "64M");
    // Data the guest never touches (it writes only the first 8 MiB) and
    // data it overwrites.
    qemu_io(
        "qcow2",
        &base,
        &["write -P 0x5a 8M 1M", "write -P 0x33 0 64k"],
    );
    let overlay = dir.file("overlay.qcow2");
    qemu_create_overlay(&overlay, &base, "qcow2");
    boot_guest(&dir, &[format!("path={overlay},num_queues=2")], "disks=1");
    check_clean(&overlay);
    check_clean(&base);
    check_pattern("qcow2", &overlay, 2);
    qemu_io("qcow2", &overlay, &["read -P 0x5a 8M 1M"]);
    // The backing file is unchanged.
    qemu_io(
        "qcow2",
        &base,
        &["read -P 0x33 0 64k", "read -P 0x5a 8M 1M"],
    );
}

#[test]
fn two_disks_raw_and_qcow2() {
    let dir = TempDir::new("e2e-two");
    let raw = make_image(&dir, "a.raw", "raw", "32M");
    let qcow = make_image(&dir, "b.qcow2", "qcow2", "32M");
    let b = boot_guest(
        &dir,
        &[
            format!("path={raw},num_queues=2,id=a,serial=RAW0"),
            format!("path={qcow},num_queues=1,id=b,engine=sync"),
        ],
        "disks=2",
    );
    assert_eq!(
        b.stderr.matches("virtio-blk at PCI").count(),
        2,
        "{}",
        b.stderr
    );
    check_pattern("raw", &raw, 2);
    check_clean(&qcow);
    check_pattern("qcow2", &qcow, 1);
}

#[test]
fn read_only_disk_is_left_unchanged() {
    let dir = TempDir::new("e2e-ro");
    let img = make_image(&dir, "ro.raw", "raw", "16M");
    qemu_io("raw", &img, &["write -P 0x5a 0 16M"]);
    boot_guest(
        &dir,
        &[format!("path={img},readonly=on,num_queues=2")],
        "disks=1",
    );
    qemu_io("raw", &img, &["read -P 0x5a 0 16M"]);
}

#[test]
fn guest_failure_is_visible() {
    // `disks=2` with one disk: the guest must report FAIL (and the VMM
    // still exits cleanly, because the guest powers off).
    let dir = TempDir::new("e2e-fail");
    let img = make_image(&dir, "d.raw", "raw", "8M");
    let b = boot(
        &dir,
        test_guest(),
        &["--cmdline", "disks=2", "--disk", &format!("path={img}")],
    );
    assert!(b.serial.contains("RESULT: FAIL"), "{}", b.serial);
    assert!(b.status.success(), "{}", b.stderr);
}

#[test]
fn several_vcpus_and_ram_above_4g() {
    let dir = TempDir::new("e2e-smp");
    let img = make_image(&dir, "d.raw", "raw", "16M");
    let b = boot_guest_with(
        &dir,
        &[format!("path={img},num_queues=4")],
        "disks=1",
        &["--cpus", "boot=4", "--memory", "size=4G"],
    );
    // The guest prints the PVH memmap: RAM resumes at 4 GiB.
    assert!(
        b.serial.contains("0x100000000-0x140000000 type 1"),
        "{}",
        b.serial
    );
    check_pattern("raw", &img, 4);
}

/// An image with a persistent dirty bitmap: the VMM records the guest's
/// writes in it (docs/backup.md) and, when the guest powers off and the
/// VMM exits, stores it back, consistent: qemu-img lists it with only
/// the `auto` flag (not `in-use`), and nothing warns that it became
/// invalid.
#[test]
fn qcow2_with_a_persistent_bitmap_keeps_it_across_a_run() {
    let dir = TempDir::new("e2e");
    let img = make_image(&dir, "disk.qcow2", "qcow2", "64M");
    qemu_img(&["bitmap", "--add", &img, "backup-0"]);
    let b = boot_guest(&dir, &[format!("path={img}")], "disks=1");
    assert!(
        !b.stderr.contains("become invalid"),
        "a warning: {}",
        b.stderr
    );
    let info = json(&qemu_img(&["info", "--output=json", &img]));
    let bitmaps = &info["format-specific"]["data"]["bitmaps"];
    assert_eq!(bitmaps[0]["name"], "backup-0", "{info}");
    assert_eq!(bitmaps[0]["flags"], serde_json::json!(["auto"]), "{info}");
    check_pattern("qcow2", &img, 1);
}
