//! Issue 27, deliverable 2: ch-img takes an image's locks as qemu-img 7.2
//! does, against an image another process holds open for writing:
//! qemu-storage-daemon (an NBD export), ch-storage-daemon (a
//! vhost-user-blk export) and cloud-hypervisor (a running guest whose
//! disk it is; the guest is a tiny PVH kernel that prints and spins, so
//! the VM keeps running for the whole test).
//!
//! Every verb that reads refuses the image unless `-U`, every verb that
//! writes refuses it (`check -r` too; `-U` with `-r` is refused as
//! qemu-img refuses it), each with qemu-img's message and exit status
//! (both tools run the same command line), and the image's bytes do not
//! change.

mod e2e_support;
mod img_safety_support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use img_safety_support::*;
use integration_tests::{project_bin, qemu_img, qemu_io, TempDir};

/// A process holding an image open for writing, killed on drop.
struct Holder {
    child: Child,
    what: &'static str,
    /// Where its stderr goes, for the failure message.
    log: std::path::PathBuf,
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Holder {
    /// Waits until the image is locked for writing: first until the
    /// holder's byte locks show in /proc/locks and stay the same for
    /// 200 ms (a probe that takes a lock itself, while the holder is still
    /// opening, could make the holder's open fail), then until qemu-img
    /// info, which takes a reader's lock, is refused.
    fn wait_locked(mut self, image: &str) -> Holder {
        let start = Instant::now();
        let mut settled: Option<(usize, Instant)> = None;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                panic!("{} exited early: {status}\n{log}", self.what);
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "{} never locked {image}",
                self.what
            );
            let locks = locks_on(image);
            match settled {
                Some((n, since)) if n == locks && locks > 0 => {
                    if since.elapsed() >= Duration::from_millis(200) {
                        break;
                    }
                }
                _ => settled = Some((locks, Instant::now())),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        loop {
            let out = qemu(&["info", image]);
            if !out.status.success() && stderr(&out).contains("lock") {
                return self;
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "{} never locked {image}",
                self.what
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// How many locks /proc/locks lists on `image`'s inode.
fn locks_on(image: &str) -> usize {
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(image).unwrap().ino();
    let suffix = format!(":{ino}");
    std::fs::read_to_string("/proc/locks")
        .unwrap_or_default()
        .lines()
        .filter(|line| {
            line.split_whitespace()
                .any(|field| field.ends_with(&suffix))
        })
        .count()
}

fn spawn(dir: &TempDir, cmd: &mut Command, what: &'static str) -> Holder {
    let log = dir.path().join(format!("{what}.log"));
    let stderr = std::fs::File::create(&log).unwrap();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    Holder { child, what, log }
}

fn qemu_storage_daemon(dir: &TempDir, image: &str) -> Holder {
    let mut cmd = Command::new("qemu-storage-daemon");
    cmd.args([
        "--blockdev",
        &format!("driver=file,filename={image},node-name=f"),
        "--blockdev",
        "driver=qcow2,file=f,node-name=q",
        "--nbd-server",
        &format!("addr.type=unix,addr.path={}", dir.file("qsd.sock")),
        "--export",
        "type=nbd,id=e,node-name=q,writable=on",
    ]);
    spawn(dir, &mut cmd, "qemu-storage-daemon").wait_locked(image)
}

fn ch_storage_daemon(dir: &TempDir, image: &str) -> Holder {
    let mut cmd = Command::new(project_bin("storage-daemon", "ch-storage-daemon"));
    cmd.args(["--image", &format!("path={image}")]).args([
        "--export",
        &format!(
            "type=vhost-user-blk,socket={},writable=on",
            dir.file("vhost.sock")
        ),
    ]);
    spawn(dir, &mut cmd, "ch-storage-daemon").wait_locked(image)
}

fn cloud_hypervisor(dir: &TempDir, image: &str) -> Holder {
    use e2e_support::{hello_then, pvh_elf, vmm_binary, SPIN};
    let kernel = dir.file("spin.elf");
    std::fs::write(&kernel, pvh_elf(&hello_then(SPIN))).unwrap();
    let mut cmd = Command::new(vmm_binary());
    cmd.args(["--kernel", &kernel, "--serial", "off"])
        .args(["--disk", &format!("path={image}")]);
    spawn(dir, &mut cmd, "cloud-hypervisor").wait_locked(image)
}

/// A qcow2 image with data and a snapshot, and a second image.
fn images(dir: &TempDir) -> (String, String) {
    let image = dir.file("held.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &image, "64M"]);
    qemu_io("qcow2", &image, &["write -P 0x33 0 1M"]);
    qemu_img(&["snapshot", "-c", "s1", &image]);
    let other = dir.file("other.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &other, "64M"]);
    (image, other)
}

/// Every verb against `image` while `holder` has it open for writing.
fn verbs_honour_the_lock(holder: &str, start: fn(&TempDir, &str) -> Holder) {
    let dir = TempDir::new(&format!("locks-{holder}"));
    let (image, _other) = images(&dir);
    let held = start(&dir, &image);
    let before = bytes(&image);
    let refused_readers: &[&[&str]] = &[
        &["info", "held.qcow2"],
        &["check", "held.qcow2"],
        &["map", "held.qcow2"],
        &["compare", "held.qcow2", "other.qcow2"],
        &["compare", "other.qcow2", "held.qcow2"],
        &["measure", "-O", "qcow2", "held.qcow2"],
        &["snapshot", "-l", "held.qcow2"],
        &["convert", "-O", "qcow2", "held.qcow2", "copy.qcow2"],
        &["bench", "-c", "1", "held.qcow2"],
    ];
    let refused_writers: &[&[&str]] = &[
        &["check", "-r", "leaks", "held.qcow2"],
        &["check", "-r", "all", "held.qcow2"],
        &["check", "-U", "-r", "all", "held.qcow2"],
        &["resize", "held.qcow2", "+1M"],
        &["snapshot", "-c", "s2", "held.qcow2"],
        &["snapshot", "-U", "-c", "s2", "held.qcow2"],
        &["snapshot", "-d", "s1", "held.qcow2"],
        &["rebase", "-u", "-b", "", "held.qcow2"],
        &["commit", "held.qcow2"],
        &["create", "-f", "qcow2", "held.qcow2", "1M"],
        &["convert", "-n", "-O", "qcow2", "other.qcow2", "held.qcow2"],
        &["convert", "-O", "qcow2", "other.qcow2", "held.qcow2"],
    ];
    for args in refused_readers.iter().chain(refused_writers) {
        let out = ch_in(dir.path(), args);
        assert!(!out.status.success(), "{holder}: ch-img {args:?} succeeded");
        let text = stderr(&out);
        assert!(
            text.contains("lock") || text.contains("force-share"),
            "{holder}: ch-img {args:?}: {text}"
        );
        same_as_qemu_img(dir.path(), args);
        unchanged(&image, &before, &format!("{holder}: ch-img {args:?}"));
    }
    // With -U the readers read the image another process writes.
    let shared_readers: &[&[&str]] = &[
        &["info", "-U", "held.qcow2"],
        &["check", "-U", "held.qcow2"],
        &["map", "-U", "held.qcow2"],
        &["compare", "-U", "held.qcow2", "held.qcow2"],
        &["measure", "-U", "-O", "qcow2", "held.qcow2"],
        &["snapshot", "-U", "-l", "held.qcow2"],
    ];
    for args in shared_readers {
        let out = ch_in(dir.path(), args);
        assert!(
            out.status.success(),
            "{holder}: ch-img {args:?}: {}",
            stderr(&out)
        );
        same_as_qemu_img(dir.path(), args);
    }
    let out = ch_in(
        dir.path(),
        &["convert", "-U", "-O", "qcow2", "held.qcow2", "copy.qcow2"],
    );
    assert!(
        out.status.success(),
        "{holder}: convert -U: {}",
        stderr(&out)
    );
    let compare = qemu(&["compare", "-U", &image, &dir.file("copy.qcow2")]);
    assert!(compare.status.success(), "{holder}: {}", stdout(&compare));
    unchanged(&image, &before, &format!("{holder}: the readers"));
    drop(held);
    assert!(Path::new(&image).exists());
}

#[test]
fn qemu_storage_daemon_holds_the_image() {
    if !testkit::has_command("qemu-storage-daemon") {
        return;
    }
    verbs_honour_the_lock("qemu-storage-daemon", qemu_storage_daemon);
}

#[test]
fn ch_storage_daemon_holds_the_image() {
    verbs_honour_the_lock("ch-storage-daemon", ch_storage_daemon);
}

#[test]
fn cloud_hypervisor_holds_the_image() {
    if !testkit::available("/dev/kvm", testkit::exists(Path::new("/dev/kvm"))) {
        return;
    }
    verbs_honour_the_lock("cloud-hypervisor", cloud_hypervisor);
}
