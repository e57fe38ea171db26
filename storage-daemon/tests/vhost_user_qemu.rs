//! QEMU's vhost-user-blk front end (TCG, no kernel) against the export:
//! QEMU negotiates at start, SeaBIOS drives the virtio-blk queue and
//! boots a boot sector it reads through the daemon from a qcow2 image
//! (the boot sector prints a marker on the serial port). QEMU is killed
//! (SIGKILL) once and stopped (SIGTERM) once; the daemon serves the next
//! QEMU each time and the image checks clean at the end.

mod vhost_user_support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vhost_user_support::*;

const MARKER: &str = "VHOST-BOOT-OK";

/// 16-bit code at 0x7c00: write MARKER to COM1, then halt.
fn boot_sector() -> Vec<u8> {
    let mut s = vec![
        0x31, 0xc0, // xor ax, ax
        0x8e, 0xd8, // mov ds, ax
        0xba, 0xf8, 0x03, // mov dx, 0x3f8
        0xbe, 0x16, 0x7c, // mov si, 0x7c16 (the message)
        0xac, // lodsb
        0x84, 0xc0, // test al, al
        0x74, 0x03, // jz halt
        0xee, // out dx, al
        0xeb, 0xf8, // jmp lodsb
        0xfa, // halt: cli
        0xf4, // hlt
        0xeb, 0xfd, // jmp hlt
    ];
    s.extend_from_slice(MARKER.as_bytes());
    s.push(0);
    s.resize(510, 0);
    s.extend_from_slice(&[0x55, 0xaa]);
    s
}

fn start_qemu(socket: &Path, serial: &Path) -> Child {
    Command::new("qemu-system-x86_64")
        .args([
            "-M",
            "q35",
            "-accel",
            "tcg",
            "-m",
            "256M",
            "-display",
            "none",
            "-nic",
            "none",
            "-monitor",
            "none",
            "-object",
            "memory-backend-memfd,id=mem,size=256M,share=on",
            "-numa",
            "node,memdev=mem",
            "-chardev",
            &format!("socket,id=c,path={}", socket.display()),
            "-device",
            "vhost-user-blk-pci,chardev=c,num-queues=2",
            "-serial",
            &format!("file:{}", serial.display()),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("qemu starts")
}

fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Boots QEMU until the marker is on its serial port; returns it running.
fn boot(daemon: &mut Daemon, dir: &TempDir, round: u32) -> Child {
    let serial = dir.join(format!("serial{round}.log"));
    let mut qemu = start_qemu(&daemon.socket, &serial);
    let read_serial = || std::fs::read_to_string(&serial).unwrap_or_default();
    wait_for("the boot sector's marker", Duration::from_secs(90), || {
        if let Ok(Some(status)) = qemu.try_wait() {
            panic!("qemu exited with {status}; daemon: {}", daemon.log_text());
        }
        read_serial().contains(MARKER)
    });
    daemon.assert_running();
    qemu
}

#[test]
fn qemu_boots_from_the_export_and_reconnects_after_kill_and_stop() {
    if !have_tool("qemu-system-x86_64") || !have_tool("qemu-img") {
        return;
    }
    let dir = TempDir::new("qemu");
    let raw = dir.join("boot.raw");
    let mut contents = boot_sector();
    contents.resize(8 << 20, 0);
    std::fs::write(&raw, &contents).unwrap();
    let image = dir.join("boot.qcow2");
    run(Command::new("qemu-img").args([
        "convert",
        "-q",
        "-O",
        "qcow2",
        raw.to_str().unwrap(),
        image.to_str().unwrap(),
    ]));
    let mut daemon = Daemon::start(&dir, &image, "", "writable=on,num_queues=2");

    // QEMU killed: the daemon sees the hang-up and waits for the next one.
    let mut qemu = boot(&mut daemon, &dir, 1);
    qemu.kill().unwrap();
    qemu.wait().unwrap();
    wait_for("the disconnect", Duration::from_secs(10), || {
        daemon.log_text().contains("front end disconnected")
    });

    // QEMU stopped cleanly (it stops the vrings first).
    let qemu = boot(&mut daemon, &dir, 2);
    // SAFETY: kill only sends a signal to our child.
    assert_eq!(unsafe { libc::kill(qemu.id() as i32, libc::SIGTERM) }, 0);
    let out = testkit::wait_within(qemu, "qemu after SIGTERM", Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let complaints: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.contains("terminating on signal"))
        .collect();
    assert!(complaints.is_empty(), "qemu complained: {stderr}");

    let log = daemon.stop();
    assert_eq!(log.matches("front end connected").count(), 2, "{log}");
    run(Command::new("qemu-img").args(["check", "-q", image.to_str().unwrap()]));
    run(Command::new("qemu-img").args([
        "compare",
        "-q",
        image.to_str().unwrap(),
        raw.to_str().unwrap(),
    ]));
}
