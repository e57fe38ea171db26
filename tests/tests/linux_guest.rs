//! A real Linux guest (Debian's cloud kernel and its virtio-blk driver)
//! drives a vhost-user-blk disk: QEMU (TCG here, see
//! linux_guest_support) is the front end, the backend chosen by
//! `CH_LINUX_BACKEND` serves the image, and /init
//! (scripts/linux-guest-init.sh) runs fio with crc32c verify, ext4,
//! discard and write-zeroes, read-only and pattern checks inside the
//! guest. After power-off every image must pass `qemu-img check` and equal,
//! by `qemu-img compare`, a reference image that qemu-io builds from the
//! same zero and pattern ranges the guest wrote last.
//!
//! Five boots, each its own test: qcow2 with 2 queues (the whole fio
//! matrix, ext4, discard, a read-only second disk), qcow2 with 4 queues
//! and 4 vCPUs, raw, a qcow2 overlay over a backing file, and raw read
//! by our daemon from an NBD server. See docs/linux-guests.md for how
//! long each takes.

mod linux_guest_support;

use integration_tests::{
    qemu_create_overlay, qemu_create_qcow2, qemu_img, qemu_img_status, qemu_io, TempDir,
};
use linux_guest_support::{boot, ready, Backend, Boot, BootSpec, DiskSpec};

const MIB: u64 = 1 << 20;
/// Virtual size of the test disk.
const DISK_SIZE: u64 = 256 * MIB;
/// What the guest zeroes (blkdiscard -z) after its other steps: everything
/// ext4, fio and the discard step touched, which is not deterministic.
const ZEROED: (u64, u64) = (0, 128 * MIB);
/// Ranges the guest then fills with a byte (offset, length, byte): cluster
/// aligned or not, inside and beyond the zeroed range.
const PATTERNS: [(u64, u64, u8); 5] = [
    (MIB, 192 << 10, 0x5a),
    (70 * MIB + 4096, 60 << 10, 0xc3),
    (127 * MIB + 512, 512 << 10, 0x3c),
    (130 * MIB + 4096, 64 << 10, 0x99),
    (200 * MIB - 512, 1024, 0x01),
];
/// A range of the overlay's backing file the guest never writes.
const BACKING_KEPT: (u64, u64, u8) = (144 * MIB, 16 * MIB, 0x11);

/// The fio groups of the full matrix (engine x iodepth x numjobs) and the
/// verify-only pass after them.
const FIO_MATRIX: [&str; 9] = [
    "fio-libaio-qd1-j1",
    "fio-libaio-qd1-j2",
    "fio-libaio-qd32-j1",
    "fio-libaio-qd32-j2",
    "fio-io_uring-qd1-j1",
    "fio-io_uring-qd1-j2",
    "fio-io_uring-qd32-j1",
    "fio-io_uring-qd32-j2",
    "fio-reverify",
];

/// `OFF:LEN:BYTE/...` for /init.
fn ranges<'a>(list: impl Iterator<Item = &'a (u64, u64, u8)>) -> String {
    let words: Vec<String> = list.map(|(o, l, b)| format!("{o}:{l}:{b:#x}")).collect();
    words.join("/")
}

/// The ranges the `expect` step checks: every pattern, two zeroed ranges
/// (the start of the disk and the discard step's range) and `extra`.
fn expected(extra: &[(u64, u64, u8)]) -> impl Iterator<Item = &(u64, u64, u8)> {
    const ZEROES: [(u64, u64, u8); 2] = [(0, MIB, 0), (96 * MIB, 8 * MIB, 0)];
    PATTERNS.iter().chain(&ZEROES).chain(extra)
}

/// The `chtest=` words: the steps, then the zero, pattern and expect
/// ranges every boot shares, then `extra`.
fn chtest(steps: &str, expect_extra: &[(u64, u64, u8)], extra: &str) -> String {
    let patterns = ranges(PATTERNS.iter());
    let expect = ranges(expected(expect_extra));
    format!(
        "chtest={steps} chtest.zero={}:{} chtest.pattern={patterns} chtest.expect={expect} {extra}",
        ZEROED.0, ZEROED.1
    )
}

/// Names of the checks the zero/pattern/expect steps print.
fn final_checks(expect_extra: &[(u64, u64, u8)]) -> Vec<String> {
    let mut names = vec![format!("zero-{}", ZEROED.0)];
    names.extend(PATTERNS.iter().map(|(o, _, _)| format!("pattern-{o}")));
    names.extend(expected(expect_extra).map(|(o, _, _)| format!("expect-{o}")));
    names
}

/// A qcow2 copy of `base` (or an empty image) with what the guest wrote
/// last applied by qemu-io.
fn reference(dir: &TempDir, base: Option<(&str, &str)>) -> String {
    let path = dir.file("reference.qcow2");
    match base {
        Some((image, fmt)) => {
            qemu_img(&["convert", "-f", fmt, "-O", "qcow2", image, &path]);
        }
        None => qemu_create_qcow2(&path, "cluster_size=65536", &DISK_SIZE.to_string()),
    }
    let mut cmds = vec![format!("write -z {} {}", ZEROED.0, ZEROED.1)];
    cmds.extend(
        PATTERNS
            .iter()
            .map(|(o, l, b)| format!("write -P {b:#x} {o} {l}")),
    );
    let cmds: Vec<&str> = cmds.iter().map(String::as_str).collect();
    qemu_io("qcow2", &path, &cmds);
    path
}

/// `qemu-img check` (qcow2 only) clean, and `qemu-img compare` equal.
fn assert_image(image: &str, fmt: &str, reference: &str) {
    if fmt == "qcow2" {
        let out = qemu_img_status(&["check", "-f", "qcow2", image]);
        assert!(
            out.status.success(),
            "qemu-img check {image}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = qemu_img_status(&["compare", "-f", fmt, "-F", "qcow2", image, reference]);
    assert!(
        out.status.success(),
        "qemu-img compare {image} {reference}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn assert_queues(boot: &Boot, queues: usize) {
    let info = boot.check("info");
    assert_eq!(
        info.field("queues"),
        Some(queues.to_string().as_str()),
        "{}",
        info.line
    );
    let irqs = boot.check("irqs");
    let per_queue: Vec<&str> = irqs
        .field("per_queue")
        .unwrap_or("")
        .split(',')
        .filter(|s| !s.is_empty())
        .collect();
    assert_eq!(per_queue.len(), queues, "{}", irqs.line);
}

fn print_fio(boot: &Boot) {
    for c in boot.checks.iter().filter(|c| c.name.starts_with("fio-")) {
        eprintln!(
            "{}: write {} IOPS, read {} IOPS",
            c.name,
            c.field("write_iops").unwrap_or("?"),
            c.field("read_iops").unwrap_or("?")
        );
    }
    eprintln!("boot + workload: {:.1?}", boot.elapsed);
}

fn names<'a>(fixed: &[&'a str], more: &'a [String]) -> Vec<&'a str> {
    fixed
        .iter()
        .copied()
        .chain(more.iter().map(String::as_str))
        .collect()
}

#[test]
fn linux_guest_qcow2_two_queues() {
    let backend = Backend::from_env();
    if !ready(backend) || !testkit::has_command("mkfs.ext4") {
        return;
    }
    let dir = TempDir::new("linux-qcow2-2q");
    let image = dir.file("disk.qcow2");
    qemu_create_qcow2(&image, "cluster_size=65536", &DISK_SIZE.to_string());
    // vdb: a read-only export of a raw image holding an ext4 filesystem
    // with one file.
    let ro_image = dir.file("ro.raw");
    let ro_files = dir.path().join("ro-files");
    std::fs::create_dir(&ro_files).unwrap();
    std::fs::write(ro_files.join("chtest.txt"), "chtest ro\n").unwrap();
    integration_tests::run_ok(
        "mkfs.ext4",
        &[
            "-q",
            "-F",
            "-d",
            &ro_files.to_string_lossy(),
            &ro_image,
            "16M",
        ],
    );
    let ro_copy = dir.file("ro-copy.raw");
    std::fs::copy(&ro_image, &ro_copy).unwrap();

    let spec = BootSpec {
        dir: &dir,
        backend,
        cpus: 2,
        disks: vec![
            DiskSpec {
                image: image.clone(),
                format: "qcow2",
                queues: 2,
                writable: true,
            },
            DiskSpec {
                image: ro_image.clone(),
                format: "raw",
                queues: 1,
                writable: false,
            },
        ],
        chtest: chtest("info,ext4,fio,irqs,discard,ro,zero,pattern,expect", &[], ""),
    };
    let boot = boot(&spec);
    print_fio(&boot);
    let finals = final_checks(&[]);
    let mut fixed = vec![
        "info",
        "ext4-fsck",
        "ext4-readback",
        "irqs",
        "discard",
        "write-zeroes",
    ];
    fixed.extend(["ro-flag", "ro-read", "ro-write", "ro-fs"]);
    fixed.extend(FIO_MATRIX);
    boot.assert_ok(&names(&fixed, &finals));
    assert_queues(&boot, 2);

    assert_image(&image, "qcow2", &reference(&dir, None));
    integration_tests::assert_same_bytes(&ro_image, &ro_copy);
}

#[test]
fn linux_guest_qcow2_four_queues() {
    let backend = Backend::from_env();
    if !ready(backend) {
        return;
    }
    let dir = TempDir::new("linux-qcow2-4q");
    let image = dir.file("disk.qcow2");
    qemu_create_qcow2(&image, "cluster_size=65536", &DISK_SIZE.to_string());
    let spec = BootSpec {
        dir: &dir,
        backend,
        cpus: 4,
        disks: vec![DiskSpec {
            image: image.clone(),
            format: "qcow2",
            queues: 4,
            writable: true,
        }],
        chtest: chtest(
            "info,fio,irqs,zero,pattern,expect",
            &[],
            "chtest.fio_qds=32 chtest.fio_jobs=4",
        ),
    };
    let boot = boot(&spec);
    print_fio(&boot);
    let finals = final_checks(&[]);
    let fixed = [
        "info",
        "irqs",
        "fio-libaio-qd32-j4",
        "fio-io_uring-qd32-j4",
        "fio-reverify",
    ];
    boot.assert_ok(&names(&fixed, &finals));
    assert_queues(&boot, 4);
    assert_image(&image, "qcow2", &reference(&dir, None));
}

#[test]
fn linux_guest_raw() {
    let backend = Backend::from_env();
    if !ready(backend) {
        return;
    }
    let dir = TempDir::new("linux-raw");
    let image = dir.file("disk.raw");
    qemu_img(&["create", "-q", "-f", "raw", &image, &DISK_SIZE.to_string()]);
    let spec = BootSpec {
        dir: &dir,
        backend,
        cpus: 2,
        disks: vec![DiskSpec {
            image: image.clone(),
            format: "raw",
            queues: 2,
            writable: true,
        }],
        chtest: chtest(
            "info,ext4,fio,irqs,discard,zero,pattern,expect",
            &[],
            "chtest.fio_engines=io_uring chtest.fio_jobs=2",
        ),
    };
    let boot = boot(&spec);
    print_fio(&boot);
    let finals = final_checks(&[]);
    let fixed = [
        "info",
        "ext4-fsck",
        "ext4-readback",
        "irqs",
        "discard",
        "write-zeroes",
        "fio-io_uring-qd1-j2",
        "fio-io_uring-qd32-j2",
        "fio-reverify",
    ];
    boot.assert_ok(&names(&fixed, &finals));
    assert_queues(&boot, 2);
    assert_image(&image, "raw", &reference(&dir, None));
}

#[test]
fn linux_guest_qcow2_overlay() {
    let backend = Backend::from_env();
    if !ready(backend) {
        return;
    }
    let dir = TempDir::new("linux-overlay");
    let base = dir.file("base.qcow2");
    qemu_create_qcow2(&base, "cluster_size=65536", &DISK_SIZE.to_string());
    let (kept_off, kept_len, kept_byte) = BACKING_KEPT;
    // Backing data the guest zeroes (it must read zeroes there after) and
    // backing data it never writes (it must read it through the overlay).
    qemu_io(
        "qcow2",
        &base,
        &[
            "write -P 0x22 0 32M",
            &format!("write -P {kept_byte:#x} {kept_off} {kept_len}"),
        ],
    );
    let image = dir.file("overlay.qcow2");
    qemu_create_overlay(&image, &base, "qcow2");
    let spec = BootSpec {
        dir: &dir,
        backend,
        cpus: 2,
        disks: vec![DiskSpec {
            image: image.clone(),
            format: "qcow2",
            queues: 2,
            writable: true,
        }],
        chtest: chtest(
            "info,fio,irqs,discard,zero,pattern,expect",
            &[BACKING_KEPT],
            "chtest.fio_qds=32 chtest.fio_jobs=2",
        ),
    };
    let boot = boot(&spec);
    print_fio(&boot);
    let finals = final_checks(&[BACKING_KEPT]);
    let fixed = [
        "info",
        "irqs",
        "discard",
        "write-zeroes",
        "fio-libaio-qd32-j2",
        "fio-io_uring-qd32-j2",
        "fio-reverify",
    ];
    boot.assert_ok(&names(&fixed, &finals));
    assert_image(&image, "qcow2", &reference(&dir, Some((&base, "qcow2"))));
    // The backing file is untouched.
    let out = qemu_img_status(&["check", "-f", "qcow2", &base]);
    assert!(out.status.success(), "qemu-img check {base}");
}

/// Our daemon reads and writes its image from an NBD server
/// (qemu-storage-daemon's NBD export, multi-conn: one connection per
/// queue): the raw boot's checks, whatever `CH_LINUX_BACKEND` says.
#[test]
fn linux_guest_raw_over_nbd() {
    use testkit::nbd_server::{Kind, NbdServer};
    let backend = Backend::Ours;
    if !ready(backend) || !testkit::has_command(NbdServer::tool(Kind::QemuStorageDaemon)) {
        return;
    }
    let dir = TempDir::new("linux-nbd");
    let file = dir.file("disk.raw");
    qemu_img(&["create", "-q", "-f", "raw", &file, &DISK_SIZE.to_string()]);
    let server = NbdServer::start(
        Kind::QemuStorageDaemon,
        std::path::Path::new(&file),
        "raw",
        &dir.path().join("nbd.sock"),
        true,
    );
    let spec = BootSpec {
        dir: &dir,
        backend,
        cpus: 2,
        disks: vec![DiskSpec {
            image: server.uri.clone(),
            format: "raw",
            queues: 2,
            writable: true,
        }],
        chtest: chtest(
            "info,ext4,fio,irqs,discard,zero,pattern,expect",
            &[],
            "chtest.fio_engines=io_uring chtest.fio_qds=32 chtest.fio_jobs=2",
        ),
    };
    let boot = boot(&spec);
    print_fio(&boot);
    let finals = final_checks(&[]);
    let fixed = [
        "info",
        "ext4-fsck",
        "ext4-readback",
        "irqs",
        "discard",
        "write-zeroes",
        "fio-io_uring-qd32-j2",
        "fio-reverify",
    ];
    boot.assert_ok(&names(&fixed, &finals));
    assert_queues(&boot, 2);
    drop(server);
    assert_image(&file, "raw", &reference(&dir, None));
}
