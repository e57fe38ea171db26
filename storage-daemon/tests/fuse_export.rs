//! The FUSE export end to end: the real `ch-storage-daemon` binary mounts
//! an image on a file and tools nobody here wrote check it: fio's
//! crc32c verification, qemu-img check and compare, a loop device with
//! sfdisk, mkfs.ext4 and fsck.ext4. Each test runs over /dev/fuse and
//! over FUSE-over-io_uring (which flips enable_uring and restores it).
//! Needs root; without it (or a tool) the tests skip, and fail under
//! CH_REQUIRE_ALL=1.

mod support;

use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::process::Command;
use std::time::{Duration, Instant};

use support::{cannot_run, run, scratch, sh, Daemon, Transport, UringSwitch};

fn qemu_img_create(dir: &std::path::Path, name: &str, format: &str, size: &str) -> String {
    let path = dir.join(name);
    run(Command::new("qemu-img")
        .args(["create", "-q", "-f", format])
        .arg(&path)
        .arg(size));
    path.display().to_string()
}

fn fio_verify(mountpoint: &std::path::Path, jobs: u32) {
    // Each job writes (then verifies) its own 8 MiB region.
    run(Command::new("fio")
        .arg("--name=verify")
        .arg(format!("--filename={}", mountpoint.display()))
        .args([
            "--rw=randwrite",
            "--bs=4k",
            "--size=8M",
            "--offset_increment=8M",
            "--direct=1",
            "--ioengine=io_uring",
            "--iodepth=16",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            // No local-verify-N-verify.state files in the working directory.
            "--verify_state_save=0",
        ])
        .arg(format!("--numjobs={jobs}")));
}

/// `polling`: the queue threads spin up to 50 us before sleeping
/// (`poll_max_us`), and the log must show waits that spinning ended.
fn fio_and_qemu_img(transport: Transport, format: &str, polling: bool) {
    if cannot_run(&["fio", "qemu-img"]) {
        return;
    }
    let Some(_switch) = transport.prepare() else {
        return;
    };
    let dir = scratch(&format!("fio-{format}-{transport:?}-{polling}"));
    let image = qemu_img_create(&dir, "disk.img", format, "64M");
    // qcow2 runs with O_DIRECT (aligned buffers), raw buffered.
    let direct = if format == "qcow2" { "on" } else { "off" };
    let d = Daemon::start(
        &dir,
        &format!("path={image},image_type={format},direct={direct}"),
        &format!(
            "{}writable=on,num_queues=2{}",
            transport.options(),
            if polling { ",poll_max_us=50" } else { "" }
        ),
    )
    .unwrap();
    fio_verify(&d.mountpoint, 1);
    fio_verify(&d.mountpoint, 4);
    // A known pattern through the export, the same into a reference file.
    let reference = dir.join("ref.raw");
    sh(&format!(
        "head -c 64M /dev/zero > {r}; \
         dd if=/dev/urandom of={dir}/pattern bs=1M count=40 status=none; \
         dd if={dir}/pattern of={r} bs=1M conv=notrunc status=none; \
         dd if={dir}/pattern of={m} bs=1M oflag=direct conv=notrunc status=none",
        r = reference.display(),
        dir = dir.display(),
        m = d.mountpoint.display()
    ));
    // Punch a hole through the export, and in the reference.
    sh(&format!(
        "fallocate -p -o 1M -l 2M {m}; fallocate -p -o 1M -l 2M {r}",
        m = d.mountpoint.display(),
        r = reference.display()
    ));
    let log = d.stop();
    if let Transport::IoUring = transport {
        support::assert_ring_served(&log);
    }
    if polling {
        assert_waits_ended_by_polling(&log);
    }
    run(Command::new("qemu-img")
        .args(["compare", "-f", format, "-F", "raw", &image])
        .arg(&reference));
    if format == "qcow2" {
        run(Command::new("qemu-img").args(["check", &image]));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fio_verify_and_qemu_img_raw_devfuse() {
    fio_and_qemu_img(Transport::DevFuse, "raw", false);
}

#[test]
fn fio_verify_and_qemu_img_qcow2_devfuse() {
    fio_and_qemu_img(Transport::DevFuse, "qcow2", false);
}

#[test]
fn fio_verify_and_qemu_img_raw_io_uring() {
    fio_and_qemu_img(Transport::IoUring, "raw", false);
}

#[test]
fn fio_verify_and_qemu_img_qcow2_io_uring() {
    fio_and_qemu_img(Transport::IoUring, "qcow2", false);
}

#[test]
fn fio_verify_and_qemu_img_qcow2_devfuse_polling() {
    fio_and_qemu_img(Transport::DevFuse, "qcow2", true);
}

#[test]
fn fio_verify_and_qemu_img_qcow2_io_uring_polling() {
    fio_and_qemu_img(Transport::IoUring, "qcow2", true);
}

/// Some queue thread's exit line counts waits that spinning ended
/// ("N of them ended by polling" / "N waits ended by polling").
fn assert_waits_ended_by_polling(log: &str) {
    let caught: u64 = log
        .lines()
        .filter_map(|l| {
            let head = l.split(" ended by polling").next()?;
            let head = head.strip_suffix(" of them").unwrap_or(head);
            let head = head.strip_suffix(" waits").unwrap_or(head);
            head.rsplit(' ').next()?.parse::<u64>().ok()
        })
        .sum();
    assert!(caught > 0, "no wait ended by polling:\n{log}");
}

/// A partitioned raw image through a loop device: sfdisk, mkfs.ext4,
/// files written and read back, fsck.ext4 -fn clean.
fn ext4_on_loop(transport: Transport) {
    if cannot_run(&["qemu-img", "sfdisk", "mkfs.ext4", "fsck.ext4", "losetup"]) {
        return;
    }
    let Some(_switch) = transport.prepare() else {
        return;
    };
    let dir = scratch(&format!("ext4-{transport:?}"));
    let image = qemu_img_create(&dir, "disk.raw", "raw", "96M");
    let d = Daemon::start(
        &dir,
        &format!("path={image}"),
        &format!("{}writable=on", transport.options()),
    )
    .unwrap();
    let mnt = dir.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    // The partition through a loop device at its offset (partition device
    // nodes need udev, which containers lack).
    let script = format!(
        "echo 'start=2048, type=83' | sfdisk -q {m}
         start=$(sfdisk -J {m} | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"partitiontable\"][\"partitions\"][0][\"start\"])')
         size=$(sfdisk -J {m} | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"partitiontable\"][\"partitions\"][0][\"size\"])')
         loop=$(losetup --show -f -o $((start * 512)) --sizelimit $((size * 512)) {m})
         trap 'umount {mnt} 2>/dev/null; losetup -d $loop' EXIT
         mkfs.ext4 -q $loop
         mount $loop {mnt}
         dd if=/dev/urandom of={mnt}/a bs=1M count=20 status=none
         cp {mnt}/a {mnt}/b
         sync
         umount {mnt}
         mount $loop {mnt}
         cmp {mnt}/a {mnt}/b
         umount {mnt}
         fsck.ext4 -fn $loop
         trap - EXIT
         losetup -d $loop
         for i in $(seq 100); do [ -z \"$(losetup -j {m})\" ] && break; sleep 0.1; done",
        m = d.mountpoint.display(),
        mnt = mnt.display()
    );
    sh(&script);
    let log = d.stop();
    if let Transport::IoUring = transport {
        support::assert_ring_served(&log);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ext4_on_a_loop_device_devfuse() {
    ext4_on_loop(Transport::DevFuse);
}

#[test]
fn ext4_on_a_loop_device_io_uring() {
    ext4_on_loop(Transport::IoUring);
}

/// SIGKILL while fio writes: the mountpoint answers ENOTCONN (no hang)
/// and qemu-img check finds the image consistent (leaks allowed).
fn killed_mid_write(transport: Transport) {
    if cannot_run(&["fio", "qemu-img"]) {
        return;
    }
    let Some(_switch) = transport.prepare() else {
        return;
    };
    let dir = scratch(&format!("kill-{transport:?}"));
    let image = qemu_img_create(&dir, "disk.qcow2", "qcow2", "64M");
    let d = Daemon::start(
        &dir,
        &format!("path={image}"),
        &format!("{}writable=on", transport.options()),
    )
    .unwrap();
    let fio = Command::new("fio")
        .arg("--name=busy")
        .arg(format!("--filename={}", d.mountpoint.display()))
        .args(["--rw=randwrite", "--bs=64k", "--size=64M", "--direct=1"])
        .args([
            "--ioengine=io_uring",
            "--iodepth=8",
            "--time_based",
            "--runtime=30",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let mountpoint = d.mountpoint.clone();
    d.kill();
    // Every access fails at once; requests caught in the ring's teardown
    // end with ECONNABORTED or ECANCELED, then the mountpoint settles on
    // ENOTCONN.
    let started = Instant::now();
    loop {
        let err = std::fs::metadata(&mountpoint).unwrap_err();
        match err.raw_os_error() {
            Some(libc::ENOTCONN) => break,
            Some(libc::ECONNABORTED) | Some(libc::ECANCELED) => {}
            _ => panic!("stat of a dead export: {err}"),
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no ENOTCONN: {err}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    testkit::wait_within(fio, "fio on the dead export", Duration::from_secs(60));
    sh(&format!("umount {}", mountpoint.display()));
    // The dead daemon's rings are torn down asynchronously: its image
    // lock may linger for a moment.
    let started = Instant::now();
    let out = loop {
        let out = testkit::output_within(
            Command::new("qemu-img").args(["check", &image]),
            testkit::COMMAND_LIMIT,
        );
        let locked = String::from_utf8_lossy(&out.stderr).contains("lock");
        if !locked || started.elapsed() > Duration::from_secs(10) {
            break out;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // 0: clean, 3: leaked clusters only.
    let code = out.status.code();
    assert!(
        code == Some(0) || code == Some(3),
        "qemu-img check: {code:?}\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigkill_mid_write_devfuse() {
    killed_mid_write(Transport::DevFuse);
}

#[test]
fn sigkill_mid_write_io_uring() {
    killed_mid_write(Transport::IoUring);
}

/// qemu-storage-daemon's file semantics: size, mode, owner, short writes
/// at the end, growth with growable=on, fallocate, truncate, SEEK_DATA.
#[test]
fn the_exported_file_behaves_as_qemus() {
    if cannot_run(&["qemu-img"]) {
        return;
    }
    let dir = scratch("semantics");
    // Sparse from the start (qemu-img create writes the first block).
    let image = dir.join("disk.raw").display().to_string();
    std::fs::File::create(&image)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let d = Daemon::start(&dir, &format!("path={image}"), "writable=on").unwrap();
    let meta = std::fs::metadata(&d.mountpoint).unwrap();
    assert_eq!(meta.len(), 1 << 20);
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // SAFETY: getuid cannot fail.
    assert_eq!(meta.uid(), unsafe { libc::getuid() });
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&d.mountpoint)
        .unwrap();
    // Past the end without growable: a short write, the size unchanged.
    let n = f.write_at(&[7u8; 8192], (1 << 20) - 4096).unwrap();
    assert_eq!(n, 4096);
    assert_eq!(f.write_at(&[7u8; 10], 1 << 20).unwrap(), 0);
    assert_eq!(std::fs::metadata(&d.mountpoint).unwrap().len(), 1 << 20);
    // Reads stop at the end.
    let mut buf = vec![0u8; 8192];
    assert_eq!(f.read_at(&mut buf, (1 << 20) - 4096).unwrap(), 4096);
    assert_eq!(&buf[..4096], &[7u8; 4096][..]);
    // SEEK_DATA / SEEK_HOLE follow the image's allocation.
    let fd = std::os::unix::io::AsRawFd::as_raw_fd(&f);
    // SAFETY: lseek on an open descriptor.
    let data = unsafe { libc::lseek(fd, 0, libc::SEEK_DATA) };
    assert_eq!(data, (1 << 20) - 4096);
    // SAFETY: as above.
    let hole = unsafe { libc::lseek(fd, 0, libc::SEEK_HOLE) };
    assert_eq!(hole, 0);
    // Punch hole (keep size) reads back zeroes.
    sh(&format!(
        "fallocate -p -o 1044480 -l 4096 {}",
        d.mountpoint.display()
    ));
    f.read_at(&mut buf[..4096], (1 << 20) - 4096).unwrap();
    assert!(buf[..4096].iter().all(|&b| b == 0));
    // Truncate through setattr resizes the image; mode changes stick.
    f.set_len(2 << 20).unwrap();
    assert_eq!(std::fs::metadata(&d.mountpoint).unwrap().len(), 2 << 20);
    std::fs::set_permissions(&d.mountpoint, std::fs::Permissions::from_mode(0o400)).unwrap();
    assert_eq!(
        std::fs::metadata(&d.mountpoint)
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o400
    );
    drop(f);
    d.stop();
    assert_eq!(std::fs::metadata(&image).unwrap().len(), 2 << 20);

    // growable=on: a write past the end grows the image.
    let d = Daemon::start(&dir, &format!("path={image}"), "writable=on,growable=on").unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&d.mountpoint)
        .unwrap();
    assert_eq!(f.write_at(&[1u8; 4096], 3 << 20).unwrap(), 4096);
    drop(f);
    assert_eq!(
        std::fs::metadata(&d.mountpoint).unwrap().len(),
        (3 << 20) + 4096
    );
    d.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A read-only export refuses writes; its file is mode 0400.
#[test]
fn a_read_only_export_refuses_writes() {
    if cannot_run(&["qemu-img"]) {
        return;
    }
    let dir = scratch("readonly");
    let image = qemu_img_create(&dir, "disk.raw", "raw", "1M");
    let d = Daemon::start(&dir, &format!("path={image}"), "writable=off").unwrap();
    assert_eq!(
        std::fs::metadata(&d.mountpoint)
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o400
    );
    assert!(std::fs::OpenOptions::new()
        .write(true)
        .open(&d.mountpoint)
        .is_err());
    let mut buf = [1u8; 512];
    let f = std::fs::File::open(&d.mountpoint).unwrap();
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [0u8; 512]);
    drop(f);
    d.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Image errors reach the application as the same errno: a qcow2 image
/// on a full file system gives ENOSPC, and the daemon logs the failure.
#[test]
fn a_full_host_file_system_gives_enospc() {
    if cannot_run(&["qemu-img"]) {
        return;
    }
    let dir = scratch("enospc");
    let small = dir.join("small");
    std::fs::create_dir(&small).unwrap();
    sh(&format!(
        "mount -t tmpfs -o size=4M tmpfs {}",
        small.display()
    ));
    let image = qemu_img_create(&small, "disk.qcow2", "qcow2", "64M");
    let d = Daemon::start(&dir, &format!("path={image}"), "writable=on").unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&d.mountpoint)
        .unwrap();
    let chunk = vec![5u8; 1 << 20];
    let mut err = None;
    for i in 0..16u64 {
        if let Err(e) = f.write_all_at(&chunk, i << 20) {
            err = Some(e);
            break;
        }
    }
    drop(f);
    let log = d.stop();
    sh(&format!("umount {}", small.display()));
    let err = err.expect("16 MiB fit in a 4 MiB file system");
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    // The host's error is logged, as virtio-blk logs it (block::error_log).
    assert!(
        log.lines()
            .any(|l| l.contains("fuse request") && l.contains("No space left on device")),
        "no log line for the failed write:\n{log}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_mountpoints_and_options_are_refused_by_name() {
    if cannot_run(&["qemu-img"]) {
        return;
    }
    let dir = scratch("bad");
    let image = qemu_img_create(&dir, "disk.raw", "raw", "1M");
    let bin = env!("CARGO_BIN_EXE_ch-storage-daemon");
    let refuse = |image_opts: &str, export: &str, needle: &str| {
        let out = testkit::output_within(
            Command::new(bin).args(["--image", image_opts, "--export", export]),
            testkit::COMMAND_LIMIT,
        );
        let text = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{export}: {text}");
        assert!(text.contains(needle), "{export}: {text}");
    };
    let img = format!("path={image}");
    let missing = dir.join("missing");
    refuse(
        &img,
        &format!("type=fuse,mountpoint={}", missing.display()),
        &missing.display().to_string(),
    );
    refuse(
        &img,
        &format!("type=fuse,mountpoint={}", dir.display()),
        "is not a regular file",
    );
    let file = dir.join("target");
    std::fs::File::create(&file).unwrap();
    refuse(
        &format!("{img},readonly=on"),
        &format!("type=fuse,mountpoint={},writable=on", file.display()),
        "read-only",
    );
    // Already exported: a second daemon on the same file (the image lock
    // would stop it too, so it exports another image).
    let d = Daemon::start(&dir, &img, "").unwrap();
    let other = qemu_img_create(&dir, "other.raw", "raw", "1M");
    refuse(
        &format!("path={other}"),
        &format!("type=fuse,mountpoint={}", d.mountpoint.display()),
        "already exported",
    );
    d.stop();
    // io_uring=on where the kernel does not offer it: refused with the reason.
    if let Some(_off) = UringSwitch::set(false) {
        refuse(
            &img,
            &format!("type=fuse,mountpoint={},io_uring=on", file.display()),
            "FUSE_OVER_IO_URING",
        );
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(
            !mounts.contains(&file.display().to_string()),
            "left mounted"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

extern "C" fn ignore_signal(_: libc::c_int) {}

/// Reads of the exported file hit by signals all along: the kernel sends
/// FUSE_INTERRUPT for requests in flight (over /dev/fuse, in both
/// modes); the daemon ignores them, every read still returns the right
/// bytes (or EINTR when the kernel dropped the request before sending
/// it), and the daemon keeps serving and stops clean.
fn signals_mid_read(transport: Transport) {
    if cannot_run(&[]) {
        return;
    }
    let Some(_switch) = transport.prepare() else {
        return;
    };
    let dir = scratch(&format!("signals-{transport:?}"));
    let image = dir.join("disk.raw");
    let blocks = 256u64;
    let data: Vec<u8> = (0..blocks * 4096)
        .map(|i| (i / 4096) as u8 ^ (i as u8))
        .collect();
    std::fs::write(&image, &data).unwrap();
    let d = Daemon::start(
        &dir,
        &format!("path={},image_type=raw", image.display()),
        &format!("{}num_queues=1", transport.options()),
    )
    .unwrap();
    // A handler that does nothing, installed without SA_RESTART so a
    // signal cuts the read's wait short (the kernel then sends
    // FUSE_INTERRUPT). Process-wide and never restored: tests run in
    // parallel, and a restored default would let a late signal kill the
    // process. Only the reader thread is sent the signal.
    static HANDLER: std::sync::Once = std::sync::Once::new();
    HANDLER.call_once(|| {
        // SAFETY: a zeroed sigaction with a handler that touches nothing.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = ignore_signal as *const () as libc::sighandler_t;
            assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
        }
    });
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let file = std::fs::File::open(&d.mountpoint).unwrap();
    let reader = {
        let done = done.clone();
        let data = data.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 4096];
            let (mut ok, mut eintr) = (0u32, 0u32);
            for i in 0..3000u64 {
                let block = (i * 37) % blocks;
                match file.read_at(&mut buf, block * 4096) {
                    Ok(n) => {
                        assert_eq!(n, 4096);
                        let at = (block * 4096) as usize;
                        assert!(buf == data[at..at + 4096], "block {block} read wrong");
                        ok += 1;
                    }
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => eintr += 1,
                    Err(e) => panic!("read of block {block}: {e}"),
                }
            }
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            (ok, eintr)
        })
    };
    use std::os::unix::thread::JoinHandleExt;
    let target = reader.as_pthread_t();
    while !done.load(std::sync::atomic::Ordering::SeqCst) {
        // SAFETY: the reader thread is alive until `done` is set (it sets
        // it as its last step, and is joined only after this loop).
        unsafe { libc::pthread_kill(target, libc::SIGUSR1) };
        std::thread::sleep(Duration::from_micros(50));
    }
    let (ok, eintr) = reader.join().unwrap();
    assert!(ok > 0, "no read succeeded ({eintr} EINTR)");
    // Still serving after the storm.
    let mut buf = [0u8; 4096];
    std::fs::File::open(&d.mountpoint)
        .unwrap()
        .read_exact_at(&mut buf, 4096)
        .unwrap();
    assert!(buf[..] == data[4096..8192]);
    let log = d.stop();
    let interrupts = log.matches("fuse: INTERRUPT").count();
    assert!(interrupts > 0, "the kernel sent no FUSE_INTERRUPT:\n{log}");
    eprintln!("{ok} reads, {eintr} EINTR, {interrupts} FUSE_INTERRUPTs");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn signals_mid_read_devfuse() {
    signals_mid_read(Transport::DevFuse);
}

#[test]
fn signals_mid_read_io_uring() {
    signals_mid_read(Transport::IoUring);
}
