//! Boots the Linux test guest (scripts/build-linux-guest.sh: a Debian cloud
//! kernel and an initramfs whose /init is scripts/linux-guest-init.sh)
//! under `qemu-system-x86_64` with its disks served over vhost-user-blk by
//! a separate backend process, and parses what /init prints on the serial
//! console.
//!
//! In: a [`BootSpec`] (disks, vCPUs, the `chtest=` steps and parameters).
//! Out: a [`Boot`] with the serial log and one [`Check`] per
//! `CHTEST result` line. Every process gets a deadline and is killed when
//! the test ends, passes or not.
//!
//! The backend is `ours` (`ch-storage-daemon --export type=vhost-user-blk`)
//! or `qemu` (qemu-storage-daemon 7.2), chosen by `CH_LINUX_BACKEND` (see
//! [`Backend::from_env`]). The accelerator is TCG unless
//! `CH_LINUX_ACCEL=kvm`: /dev/kvm on the development machines emulates
//! guest code and is far slower than TCG, so its presence proves nothing.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use integration_tests::TempDir;

/// The backend a test uses when `CH_LINUX_BACKEND` is not set: our own
/// ch-storage-daemon, so Linux's virtio-blk driver reaches our device
/// code (`CH_LINUX_BACKEND=qemu` runs the same checks against
/// qemu-storage-daemon, the reference).
pub const DEFAULT_BACKEND: Backend = Backend::Ours;

/// How long one guest may run (boot, workload, power-off).
const GUEST_TIMEOUT: Duration = Duration::from_secs(420);
/// How long a backend may take to create its socket, and to exit on SIGTERM.
const DAEMON_TIMEOUT: Duration = Duration::from_secs(20);
/// The longest a backend may live (it is stopped when its guest is done).
const DAEMON_LIFETIME: Duration = Duration::from_secs(480);
/// Guest RAM; it lives in a shared memfd so the backend can map it.
const GUEST_RAM: &str = "1G";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Our `ch-storage-daemon`.
    Ours,
    /// `qemu-storage-daemon`.
    Qemu,
}

impl Backend {
    /// `CH_LINUX_BACKEND=ours|qemu`, else [`DEFAULT_BACKEND`].
    pub fn from_env() -> Backend {
        match std::env::var("CH_LINUX_BACKEND").as_deref() {
            Ok("ours") => Backend::Ours,
            Ok("qemu") => Backend::Qemu,
            Ok(other) => panic!("CH_LINUX_BACKEND must be 'ours' or 'qemu', not '{other}'"),
            Err(_) => DEFAULT_BACKEND,
        }
    }
}

/// The kernel and initramfs, from `CH_LINUX_KERNEL`/`CH_LINUX_INITRAMFS`
/// (scripts/run-tests.sh exports them) or else built once per test process
/// by scripts/build-linux-guest.sh. `None` (a skip) only when that build
/// fails and `CH_REQUIRE_ALL` is not 1.
pub fn guest_files() -> Option<&'static (PathBuf, PathBuf)> {
    static FILES: OnceLock<Result<(PathBuf, PathBuf), String>> = OnceLock::new();
    let found = FILES.get_or_init(|| {
        if let (Some(k), Some(i)) = (
            std::env::var_os("CH_LINUX_KERNEL"),
            std::env::var_os("CH_LINUX_INITRAMFS"),
        ) {
            return Ok((PathBuf::from(k), PathBuf::from(i)));
        }
        let script = repo().join("scripts/build-linux-guest.sh");
        let out = testkit::try_output_within(
            Command::new("bash").arg(&script),
            integration_tests::BUILD_LIMIT,
        )?;
        if !out.status.success() {
            return Err(format!(
                "{} failed ({}): {}",
                script.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let value = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(key))
                .map(PathBuf::from)
                .ok_or_else(|| format!("{} printed no {key}", script.display()))
        };
        Ok((value("CH_LINUX_KERNEL=")?, value("CH_LINUX_INITRAMFS=")?))
    });
    let check = found.as_ref().map(|_| ()).map_err(Clone::clone);
    if !testkit::available("the Linux test guest", check) {
        return None;
    }
    found.as_ref().ok()
}

/// True when everything a Linux guest test needs from outside the project
/// is here (QEMU, the backend, qemu-img/qemu-io and the guest files);
/// false (a skip) or a panic under `CH_REQUIRE_ALL=1` otherwise.
pub fn ready(backend: Backend) -> bool {
    let mut tools = vec!["qemu-system-x86_64", "qemu-img", "qemu-io"];
    if backend == Backend::Qemu {
        tools.push("qemu-storage-daemon");
    }
    tools.iter().all(|t| testkit::has_command(t)) && guest_files().is_some()
}

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// One vhost-user-blk disk of a guest.
pub struct DiskSpec {
    pub image: String,
    /// `raw` or `qcow2` (a qcow2 overlay opens its backing file itself).
    pub format: &'static str,
    pub queues: u32,
    pub writable: bool,
}

pub struct BootSpec<'a> {
    pub dir: &'a TempDir,
    pub backend: Backend,
    pub cpus: u32,
    /// In order: vda, vdb, ...
    pub disks: Vec<DiskSpec>,
    /// `chtest=...` and `chtest.KEY=VALUE` words for /init.
    pub chtest: String,
}

/// One `CHTEST result name=... status=... KEY=VALUE...` line.
#[derive(Debug)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    pub line: String,
}

impl Check {
    /// The value of `KEY=` on the line.
    pub fn field(&self, key: &str) -> Option<&str> {
        let prefix = format!("{key}=");
        self.line
            .split_whitespace()
            .find_map(|w| w.strip_prefix(prefix.as_str()))
    }
}

pub struct Boot {
    pub serial: String,
    pub checks: Vec<Check>,
    pub elapsed: Duration,
}

impl Boot {
    pub fn check(&self, name: &str) -> &Check {
        self.checks
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no result '{name}' in the guest's log:\n{}", self.serial))
    }

    /// Every named check is present and ok, no check failed, and /init
    /// finished with `failures=0`.
    pub fn assert_ok(&self, names: &[&str]) {
        for name in names {
            let c = self.check(name);
            assert!(
                c.ok,
                "guest check {name} failed: {}\n{}",
                c.line, self.serial
            );
        }
        let failed: Vec<&str> = self
            .checks
            .iter()
            .filter(|c| !c.ok)
            .map(|c| c.line.as_str())
            .collect();
        assert!(
            failed.is_empty(),
            "guest checks failed:\n{}\n{}",
            failed.join("\n"),
            self.serial
        );
        assert!(
            self.serial.contains("CHTEST done failures=0"),
            "the guest did not finish cleanly:\n{}",
            self.serial
        );
    }
}

/// A child process killed (and reaped) when dropped, whatever happened.
struct Guarded {
    child: Child,
    what: String,
}

impl Drop for Guarded {
    /// SIGTERM first (the `timeout` wrapper passes it on to the program it
    /// runs), SIGKILL two seconds later.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            signal_term(&self.child);
            if self.wait_for(Duration::from_secs(2)).is_none() {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
    }
}

fn signal_term(child: &Child) {
    let _ = testkit::signal(child.id(), "TERM");
}

/// `program` under coreutils' `timeout`, so it cannot outlive `limit` even
/// when the test process itself dies.
fn with_timeout(program: impl AsRef<std::ffi::OsStr>, limit: Duration) -> Command {
    let mut cmd = Command::new("timeout");
    cmd.args(["--kill-after=5", &limit.as_secs().to_string()])
        .arg(program);
    cmd
}

impl Guarded {
    fn spawn(mut cmd: Command, what: &str, log: &Path) -> Guarded {
        let out = std::fs::File::create(log).expect("create log file");
        let err = out.try_clone().expect("clone log file");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what} ({cmd:?}): {e}"));
        Guarded {
            child,
            what: what.to_string(),
        }
    }

    /// Waits up to `timeout`; `None` when it is still running.
    fn wait_for(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + timeout;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() >= end => return None,
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                Err(e) => panic!("waiting for {}: {e}", self.what),
            }
        }
    }

    /// SIGTERM, then the exit status within [`DAEMON_TIMEOUT`].
    fn terminate(&mut self) -> ExitStatus {
        if let Ok(Some(status)) = self.child.try_wait() {
            return status;
        }
        signal_term(&self.child);
        self.wait_for(DAEMON_TIMEOUT).unwrap_or_else(|| {
            panic!(
                "{} did not exit within {DAEMON_TIMEOUT:?} of SIGTERM",
                self.what
            )
        })
    }
}

/// The command line that serves `disk` on `socket`.
pub fn backend_command(backend: Backend, disk: &DiskSpec, socket: &str) -> Command {
    match backend {
        Backend::Ours => {
            let mut cmd = with_timeout(our_daemon(), DAEMON_LIFETIME);
            let ro = if disk.writable { "off" } else { "on" };
            let rw = if disk.writable { "on" } else { "off" };
            cmd.arg("--image")
                .arg(format!(
                    "path={},image_type={},readonly={ro}",
                    disk.image, disk.format
                ))
                .arg("--export")
                .arg(format!(
                    "type=vhost-user-blk,socket={socket},num_queues={},writable={rw}",
                    disk.queues
                ));
            cmd
        }
        Backend::Qemu => {
            let ro = if disk.writable { "off" } else { "on" };
            let rw = if disk.writable { "on" } else { "off" };
            let mut cmd = with_timeout("qemu-storage-daemon", DAEMON_LIFETIME);
            cmd.arg("--blockdev")
                .arg(format!(
                    "driver=file,node-name=file,filename={},read-only={ro},discard=unmap",
                    disk.image
                ))
                .arg("--blockdev")
                .arg(format!(
                    "driver={},node-name=disk,file=file,read-only={ro},discard=unmap",
                    disk.format
                ))
                .arg("--export")
                .arg(format!(
                    "type=vhost-user-blk,id=export,node-name=disk,addr.type=unix,\
                     addr.path={socket},writable={rw},num-queues={}",
                    disk.queues
                ));
            cmd
        }
    }
}

/// `$CH_BIN_DIR/ch-storage-daemon`, else built by the cargo running the tests.
fn our_daemon() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| integration_tests::project_bin("storage-daemon", "ch-storage-daemon"))
}

/// Starts one backend per disk, boots the guest, waits for it to power
/// off, then stops the backends (each must exit 0 on SIGTERM, leaving its
/// image closed and clean).
pub fn boot(spec: &BootSpec) -> Boot {
    let (kernel, initramfs) = guest_files().expect("guest files (checked by ready())");
    let mut daemons = Vec::new();
    let mut qemu = with_timeout(
        "qemu-system-x86_64",
        GUEST_TIMEOUT + Duration::from_secs(10),
    );
    let accel = std::env::var("CH_LINUX_ACCEL").unwrap_or_else(|_| "tcg".into());
    qemu.args(["-M", "q35", "-accel", &accel]);
    if accel == "kvm" {
        qemu.args(["-cpu", "host"]);
    }
    let serial_path = spec.dir.file("serial.log");
    qemu.args(["-m", GUEST_RAM, "-smp", &spec.cpus.to_string()])
        .args(["-nodefaults", "-display", "none", "-no-reboot"])
        .args(["-serial", &format!("file:{serial_path}")])
        .args([
            "-object",
            &format!("memory-backend-memfd,id=mem,size={GUEST_RAM},share=on"),
        ])
        .args(["-numa", "node,memdev=mem"]);
    for (i, disk) in spec.disks.iter().enumerate() {
        let socket = spec.dir.file(&format!("disk{i}.sock"));
        let log = spec.dir.path().join(format!("backend{i}.log"));
        let what = format!("{:?} backend of disk {i}", spec.backend);
        let cmd = backend_command(spec.backend, disk, &socket);
        let mut daemon = Guarded::spawn(cmd, &what, &log);
        wait_for_socket(&mut daemon, &socket, &log);
        daemons.push((daemon, log));
        qemu.args(["-chardev", &format!("socket,id=disk{i},path={socket}")])
            .args([
                "-device",
                &format!(
                    "vhost-user-blk-pci,chardev=disk{i},num-queues={}",
                    disk.queues
                ),
            ]);
    }
    let cmdline = format!("console=ttyS0 quiet loglevel=1 panic=-1 {}", spec.chtest);
    qemu.arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(initramfs)
        .args(["-append", &cmdline]);

    let start = Instant::now();
    let qemu_log = spec.dir.path().join("qemu.log");
    let mut vm = Guarded::spawn(qemu, "qemu-system-x86_64", &qemu_log);
    let status = vm.wait_for(GUEST_TIMEOUT);
    let elapsed = start.elapsed();
    let serial = std::fs::read_to_string(&serial_path).unwrap_or_default();
    let qemu_out = std::fs::read_to_string(&qemu_log).unwrap_or_default();
    let Some(status) = status else {
        panic!("the guest did not power off within {GUEST_TIMEOUT:?}:\n{serial}\n{qemu_out}");
    };
    assert!(
        status.success(),
        "qemu-system-x86_64 exited with {status}:\n{qemu_out}\n{serial}"
    );
    for (daemon, log) in &mut daemons {
        let status = daemon.terminate();
        let text = std::fs::read_to_string(log.as_path()).unwrap_or_default();
        assert!(
            status.success(),
            "{} exited with {status}:\n{text}",
            daemon.what
        );
    }
    let checks = parse_checks(&serial);
    eprintln!("{} boot took {elapsed:.1?}", spec.chtest);
    for c in &checks {
        eprintln!("  {}", c.line);
    }
    Boot {
        serial,
        checks,
        elapsed,
    }
}

fn wait_for_socket(daemon: &mut Guarded, socket: &str, log: &Path) {
    let end = Instant::now() + DAEMON_TIMEOUT;
    while !Path::new(socket).exists() {
        let text = || std::fs::read_to_string(log).unwrap_or_default();
        if let Some(status) = daemon.wait_for(Duration::from_millis(50)) {
            panic!(
                "{} exited with {status} before listening:\n{}",
                daemon.what,
                text()
            );
        }
        assert!(
            Instant::now() < end,
            "{} did not create {socket} within {DAEMON_TIMEOUT:?}:\n{}",
            daemon.what,
            text()
        );
    }
}

/// The `CHTEST result` lines of a serial log (kernel messages may share a
/// line, so each is found by its marker, not its start).
pub fn parse_checks(serial: &str) -> Vec<Check> {
    serial
        .lines()
        .filter_map(|l| l.find("CHTEST result ").map(|i| l[i..].trim_end()))
        .map(|line| {
            let word = |key: &str| {
                line.split_whitespace()
                    .find_map(|w| w.strip_prefix(key))
                    .unwrap_or("")
                    .to_string()
            };
            Check {
                name: word("name="),
                ok: word("status=") == "ok",
                line: line.to_string(),
            }
        })
        .collect()
}

#[cfg(test)]
mod parse_tests {
    use super::*;

    const LOG: &str = "\
[    5.0] virtio_blk virtio0: [vda] 524288 512-byte logical blocks
CHTEST result name=info status=ok queues=2 cpus=2
[   9.1] EXT4-fs (vda): mounted CHTEST result name=ext4-fsck status=fail rc=4
CHTEST result name=irqs status=ok per_queue=10,12,
CHTEST done failures=1
";

    #[test]
    fn finds_results_even_after_kernel_text() {
        let checks = parse_checks(LOG);
        let names: Vec<&str> = checks.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["info", "ext4-fsck", "irqs"]);
        assert!(checks[0].ok && !checks[1].ok && checks[2].ok);
        assert_eq!(checks[0].field("queues"), Some("2"));
        assert_eq!(checks[2].field("per_queue"), Some("10,12,"));
        assert_eq!(checks[1].field("missing"), None);
    }

    fn boot_of(serial: &str) -> Boot {
        Boot {
            serial: serial.to_string(),
            checks: parse_checks(serial),
            elapsed: Duration::ZERO,
        }
    }

    #[test]
    #[should_panic(expected = "guest check ext4-fsck failed")]
    fn a_failed_check_fails() {
        boot_of(LOG).assert_ok(&["info", "ext4-fsck"]);
    }

    #[test]
    #[should_panic(expected = "no result 'fio-reverify'")]
    fn a_missing_check_fails() {
        boot_of("CHTEST result name=info status=ok\nCHTEST done failures=0\n")
            .assert_ok(&["fio-reverify"]);
    }

    #[test]
    #[should_panic(expected = "did not finish cleanly")]
    fn an_unfinished_guest_fails() {
        boot_of("CHTEST result name=info status=ok\n").assert_ok(&["info"]);
    }

    #[test]
    fn a_clean_log_passes() {
        boot_of("CHTEST result name=info status=ok\nCHTEST done failures=0\n").assert_ok(&["info"]);
    }
}
