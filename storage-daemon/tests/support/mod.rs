//! Shared by the FUSE export tests: starting and stopping the daemon,
//! the external tools they check against (fio, qemu-img, e2fsprogs),
//! skips that fail under `CH_REQUIRE_ALL=1`, and the
//! `/sys/module/fuse/parameters/enable_uring` switch.

#![allow(dead_code)]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";
const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// Returns true (the caller returns) when the test cannot run here; with
/// `CH_REQUIRE_ALL=1` it fails instead (testkit's rule).
pub fn skip(reason: &str) -> bool {
    !testkit::available("what this FUSE test needs", Err(reason.to_string()))
}

/// Root, /dev/fuse and the named tools; else a skip.
pub fn cannot_run(tools: &[&str]) -> bool {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return skip("mounting a FUSE export needs root");
    }
    if !Path::new("/dev/fuse").exists() {
        return skip("no /dev/fuse");
    }
    !tools.iter().all(|tool| testkit::has_command(tool))
}

/// A scratch folder for one test, removed when the test ends.
pub fn scratch(name: &str) -> testkit::TempDir {
    testkit::TempDir::new(&format!("ch-fuse-{name}"))
}

pub fn run(cmd: &mut Command) -> String {
    let out = testkit::output_within(cmd, testkit::COMMAND_LIMIT);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{text}",
        out.status
    );
    text
}

pub fn sh(script: &str) -> String {
    run(Command::new("sh").args(["-ec", script]))
}

fn is_fuse_mount(path: &Path) -> bool {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: zeroed statfs is valid storage; c is NUL-terminated.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    #[allow(clippy::unnecessary_cast)]
    let t = st.f_type as i64;
    rc == 0 && t == FUSE_SUPER_MAGIC
}

/// A running `ch-storage-daemon` (killed if the test fails before
/// [`Daemon::stop`]).
pub struct Daemon {
    child: Child,
    pub mountpoint: PathBuf,
    log: PathBuf,
}

impl Daemon {
    /// Starts the daemon; Err(log) when it exits before the mount is up.
    pub fn start(dir: &Path, image: &str, export: &str) -> Result<Daemon, String> {
        let mountpoint = dir.join("export");
        if !mountpoint.exists() {
            File::create(&mountpoint).unwrap();
        }
        let log = dir.join(format!(
            "daemon-{}.log",
            Instant::now().elapsed().as_nanos()
        ));
        let child = Command::new(env!("CARGO_BIN_EXE_ch-storage-daemon"))
            .arg("--image")
            .arg(image)
            .arg("--export")
            .arg(format!(
                "type=fuse,mountpoint={}{}{export}",
                mountpoint.display(),
                if export.is_empty() { "" } else { "," }
            ))
            .arg("-v")
            .stderr(File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut d = Daemon {
            child,
            mountpoint,
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = d.child.try_wait().unwrap() {
                return Err(format!("exited {status}: {}", d.log_text()));
            }
            if is_fuse_mount(&d.mountpoint) && d.log_text().contains("exporting") {
                return Ok(d);
            }
            assert!(
                Instant::now() < deadline,
                "daemon did not mount: {}",
                d.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then a clean exit within 30 s, unmounted; returns the log.
    pub fn stop(mut self) -> String {
        let limit = Duration::from_secs(30);
        testkit::stop_cleanly(&mut self.child, "ch-storage-daemon", limit, &self.log);
        assert!(!is_fuse_mount(&self.mountpoint), "still mounted after stop");
        self.log_text()
    }

    /// SIGKILL and reap.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let _ = testkit::try_output_within(
                Command::new("umount").arg("-l").arg(&self.mountpoint),
                Duration::from_secs(60),
            );
        }
    }
}

static URING_SWITCH: Mutex<()> = Mutex::new(());

/// Holds enable_uring at a value and restores the old one on drop; tests
/// that need a given value hold it (one at a time).
pub struct UringSwitch {
    old: String,
    _lock: MutexGuard<'static, ()>,
}

impl UringSwitch {
    /// None (after a skip) when the switch does not exist here.
    pub fn set(on: bool) -> Option<UringSwitch> {
        let lock = URING_SWITCH.lock().unwrap_or_else(|p| p.into_inner());
        let Ok(old) = std::fs::read_to_string(ENABLE_URING) else {
            skip("the kernel has no FUSE-over-io_uring (no enable_uring parameter)");
            return None;
        };
        if let Err(e) = std::fs::write(ENABLE_URING, if on { "1" } else { "0" }) {
            skip(&format!("cannot write {ENABLE_URING}: {e}"));
            return None;
        }
        Some(UringSwitch {
            old: old.trim().to_string(),
            _lock: lock,
        })
    }
}

impl Drop for UringSwitch {
    fn drop(&mut self) {
        let _ = std::fs::write(ENABLE_URING, if self.old == "Y" { "1" } else { "0" });
    }
}

/// The export options of a transport.
#[derive(Clone, Copy, Debug)]
pub enum Transport {
    DevFuse,
    IoUring,
}

impl Transport {
    pub fn options(self) -> &'static str {
        match self {
            Transport::DevFuse => "",
            Transport::IoUring => "io_uring=on,",
        }
    }

    /// Holds the enable_uring switch for this transport (None: skipped).
    pub fn prepare(self) -> Option<Option<UringSwitch>> {
        match self {
            Transport::DevFuse => Some(None),
            Transport::IoUring => UringSwitch::set(true).map(Some),
        }
    }
}

/// Asserts the log says the ring threads served requests (io_uring mode).
pub fn assert_ring_served(log: &str) {
    let served: u64 = log
        .lines()
        .filter(|l| l.contains("fuse ring thread"))
        .filter_map(|l| {
            l.rsplit("served ")
                .next()?
                .split(' ')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    assert!(served > 0, "no request came through the rings:\n{log}");
}
