//! Shared by the e2e_api*.rs files (each also declares `mod
//! e2e_support;`): the test guest under the real `cloud-hypervisor` with
//! `--api-socket`, driven with `curl --unix-socket` (a client we did not
//! write) and with our `ch-remote`.
//!
//! An [`ApiVm`] owns the VMM process: every wait has a deadline, and a VM
//! still running when the test ends (a failed assertion) is killed. It
//! starts the command line's VM ([`ApiVm::start`]) or a VMM without one
//! that waits for `vm.create` ([`ApiVm::start_vmm`]); [`vm_config`] is
//! the test guest's `VmConfig` for the latter.
#![allow(dead_code)]

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use integration_tests::{project_bin, TempDir};

use crate::e2e_support::{test_guest, vmm_binary};

/// The longest any single wait for the guest takes (it runs emulated).
pub const GUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// Whether curl is here (a missing curl fails under CH_REQUIRE_ALL=1).
pub fn have_curl() -> bool {
    testkit::available("curl", testkit::command("curl"))
}

pub struct ApiVm {
    child: Option<Child>,
    pub socket: String,
    pub serial: String,
    stderr: Option<JoinHandle<String>>,
}

impl ApiVm {
    /// Boots the test guest with `cmdline` and the VMM arguments `args`,
    /// the API on `dir/api.sock`, the serial port in `dir/serial.log`.
    pub fn start(dir: &TempDir, cmdline: &str, args: &[&str]) -> ApiVm {
        Self::start_at(dir, &dir.file("api.sock"), cmdline, args)
    }

    /// As [`ApiVm::start`], with the API socket at `socket`.
    pub fn start_at(dir: &TempDir, socket: &str, cmdline: &str, args: &[&str]) -> ApiVm {
        let serial = dir.file("serial.log");
        let guest = test_guest().display().to_string();
        let vm_args = [
            "--kernel",
            &guest,
            "--cmdline",
            cmdline,
            "--serial",
            &format!("file={serial}"),
        ];
        let all: Vec<&str> = vm_args
            .iter()
            .copied()
            .chain(args.iter().copied())
            .collect();
        Self::spawn(socket, &serial, &all)
    }

    /// A VMM without a VM (`--api-socket` alone, and `args`), waiting for
    /// `vm.create`; a VM made with [`vm_config`] writes its serial port
    /// to `dir/serial.log`.
    pub fn start_vmm(dir: &TempDir, args: &[&str]) -> ApiVm {
        Self::start_vmm_with(vmm_binary(), dir, args)
    }

    /// As [`ApiVm::start_vmm`], with another VMM binary (upstream's).
    pub fn start_vmm_with(binary: &Path, dir: &TempDir, args: &[&str]) -> ApiVm {
        Self::spawn_binary(binary, &dir.file("api.sock"), &dir.file("serial.log"), args)
    }

    fn spawn(socket: &str, serial: &str, args: &[&str]) -> ApiVm {
        Self::spawn_binary(vmm_binary(), socket, serial, args)
    }

    fn spawn_binary(binary: &Path, socket: &str, serial: &str, args: &[&str]) -> ApiVm {
        let socket = socket.to_string();
        let serial = serial.to_string();
        let mut child = Command::new(binary)
            .arg("-v")
            .args(["--api-socket", &format!("path={socket}")])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn cloud-hypervisor");
        let mut pipe = child.stderr.take().expect("stderr pipe");
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = pipe.read_to_string(&mut s);
            s
        });
        let vm = ApiVm {
            child: Some(child),
            socket,
            serial,
            stderr: Some(stderr),
        };
        vm.wait_socket();
        vm
    }

    fn wait_socket(&self) {
        let end = Instant::now() + Duration::from_secs(30);
        while !Path::new(&self.socket).exists() {
            assert!(Instant::now() < end, "the API socket never appeared");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn serial_text(&self) -> String {
        std::fs::read_to_string(&self.serial).unwrap_or_default()
    }

    /// Waits until the serial log contains `needle`; fails on a guest
    /// failure, a VMM that exited, or the deadline.
    pub fn wait_for(&mut self, needle: &str) -> String {
        self.wait_for_count(needle, 1)
    }

    /// Waits until the serial log contains `needle` `n` times (a guest
    /// that rebooted prints its lines again).
    pub fn wait_for_count(&mut self, needle: &str, n: usize) -> String {
        let end = Instant::now() + GUEST_TIMEOUT;
        loop {
            let s = self.serial_text();
            if s.matches(needle).count() >= n {
                return s;
            }
            if s.contains("RESULT: FAIL") {
                panic!("guest failed while waiting for {needle:?}:\n{s}");
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                let err = self.stderr.take().map(|t| t.join().unwrap_or_default());
                panic!("VMM exited ({status}) while waiting for {needle:?}:\n{s}\n{err:?}");
            }
            assert!(
                Instant::now() < end,
                "no {needle:?} on the serial port within {GUEST_TIMEOUT:?}:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// One request with curl: (HTTP status, body).
    pub fn curl(&self, method: &str, endpoint: &str, body: Option<&str>) -> (u16, String) {
        let url = format!("http://localhost/api/v1/{endpoint}");
        curl_raw(&self.socket, method, &url, body)
    }

    /// As [`ApiVm::curl`], asserting the status.
    pub fn curl_ok(&self, method: &str, endpoint: &str, body: Option<&str>, want: u16) -> String {
        let (status, text) = self.curl(method, endpoint, body);
        assert_eq!(status, want, "{method} {endpoint} {body:?}: {text}");
        text
    }

    /// `ch-remote --api-socket SOCKET args...`.
    pub fn ch_remote(&self, args: &[&str]) -> Output {
        testkit::output_within(
            Command::new(project_bin("vmm", "ch-remote"))
                .args(["--api-socket", &self.socket])
                .args(args),
            testkit::COMMAND_LIMIT,
        )
    }

    /// Whether the VMM process is still running.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// Asks the VMM to exit (`vmm.shutdown`, answered 200 with no body,
    /// as upstream answers it) and waits for it: (exit status, its
    /// stderr).
    pub fn shutdown(mut self) -> (ExitStatus, String) {
        let (status, body) = self.curl("PUT", "vmm.shutdown", None);
        assert_eq!((status, body.as_str()), (200, ""), "vmm.shutdown");
        self.wait_exit()
    }

    /// Waits (bounded) for the VMM to exit on its own.
    pub fn wait_exit(&mut self) -> (ExitStatus, String) {
        let mut child = self.child.take().expect("still running");
        let end = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(s) = child.try_wait().expect("try_wait") {
                break s;
            }
            if Instant::now() > end {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the VMM did not exit within 60 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let err = self
            .stderr
            .take()
            .map(|t| t.join().unwrap_or_default())
            .unwrap_or_default();
        (status, err)
    }
}

impl Drop for ApiVm {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// curl against `socket`: (status, body). The body of a request goes in
/// as given; `--max-time` bounds the exchange.
pub fn curl_raw(socket: &str, method: &str, url: &str, body: Option<&str>) -> (u16, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "--max-time", "60", "--unix-socket", socket])
        .args(["-X", method, "-w", "\n%{http_code}"]);
    if let Some(b) = body {
        cmd.args(["-H", "Content-Type: application/json", "--data-binary", b]);
    }
    // curl's --max-time is the deadline; this one only backs it up.
    let out = testkit::output_within(cmd.arg(url), testkit::COMMAND_LIMIT);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// The numbers of the guest's `COUNT diskN ...` line (the first, when
/// it rebooted).
pub fn guest_counts(serial: &str, disk: usize) -> Vec<(String, u64)> {
    let all = guest_counts_every_boot(serial, disk);
    all.into_iter()
        .next()
        .unwrap_or_else(|| panic!("no COUNT disk{disk} line:\n{serial}"))
}

/// The numbers of every `COUNT diskN ...` line, one list per boot.
pub fn guest_counts_every_boot(serial: &str, disk: usize) -> Vec<Vec<(String, u64)>> {
    let prefix = format!("COUNT disk{disk} ");
    serial
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .map(|rest| {
            rest.split_whitespace()
                .map(|kv| {
                    let (k, v) = kv.split_once('=').expect("key=value");
                    (k.to_string(), v.parse().expect("a number"))
                })
                .collect()
        })
        .collect()
}

/// The test guest's `VmConfig` (upstream's JSON): `cmdline`, 2 vCPUs,
/// 128 MiB, the serial port in `dir/serial.log`, and `disks` (each a
/// `DiskConfig` object).
pub fn vm_config(dir: &TempDir, cmdline: &str, disks: &[serde_json::Value]) -> serde_json::Value {
    serde_json::json!({
        "payload": {"kernel": test_guest().display().to_string(), "cmdline": cmdline},
        "cpus": {"boot_vcpus": 2, "max_vcpus": 2},
        "memory": {"size": 128u64 << 20},
        "disks": disks,
        "serial": {"mode": "File", "file": dir.file("serial.log")},
        "console": {"mode": "Off"},
    })
}

/// Whether another process holds `image`'s lock (qemu-img, which takes
/// it, cannot open it).
pub fn locked(image: &str) -> bool {
    let out = integration_tests::qemu_img_status(&["info", image]);
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && !err.contains("lock") {
        panic!("qemu-img info {image} failed for another reason: {err}");
    }
    !out.status.success()
}

/// The events of an event-monitor file as (source, event, properties).
pub fn events(path: &str) -> Vec<(String, String, serde_json::Value)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.split("\n\n")
        .filter(|t| !t.trim().is_empty())
        .map(|t| {
            let v: serde_json::Value =
                serde_json::from_str(t).unwrap_or_else(|e| panic!("{e}: {t:?}"));
            (
                v["source"].as_str().unwrap_or_default().to_string(),
                v["event"].as_str().unwrap_or_default().to_string(),
                v["properties"].clone(),
            )
        })
        .collect()
}

/// The job's entry in `vm.disk-jobs`.
pub fn job(vm: &ApiVm, id: &str) -> serde_json::Value {
    let list = integration_tests::json(&vm.curl_ok("GET", "vm.disk-jobs", None, 200));
    list.as_array()
        .unwrap()
        .iter()
        .find(|j| j["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("job {id} not in {list}"))
}

/// Waits (up to 60 s) until job `id` is in `state`; a job that fails on
/// the way ends the wait.
pub fn wait_job(vm: &ApiVm, id: &str, state: &str) -> serde_json::Value {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let j = job(vm, id);
        if j["state"] == state {
            return j;
        }
        assert!(
            Instant::now() < end && j["state"] != "failed",
            "job {id} is not {state}: {j}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Where the test guest's stamped rounds land on disk 0 (`io_rounds=N`,
/// tests/guest api_checks.c): round r writes 4 KiB of [`stamp`]`(r)` at
/// 8 MiB + r * 4 KiB and reads it back; at the end every round is read
/// back again.
pub const ROUND_BASE: u64 = 8 << 20;
pub const ROUND_LEN: u64 = 4096;

/// The guest's stamp of round `r`.
pub fn stamp(r: u64) -> u8 {
    (0x20 + r % 0xC0) as u8
}

/// How many rounds `data` holds, round `r` stamped `stamp_of(r)`: a
/// prefix of whole rounds, the rest zeroes (never a round half there,
/// never a gap).
pub fn rounds_held_with(data: &[u8], rounds: u64, what: &str, stamp_of: impl Fn(u64) -> u8) -> u64 {
    let mut held = 0;
    for r in 0..rounds {
        let off = (ROUND_BASE + r * ROUND_LEN) as usize;
        let block = &data[off..off + ROUND_LEN as usize];
        if block.iter().all(|&b| b == stamp_of(r)) {
            assert_eq!(
                held, r,
                "{what}: round {r} is there but an earlier one is not"
            );
            held += 1;
        } else {
            assert!(
                block.iter().all(|&b| b == 0),
                "{what}: round {r} is neither whole nor absent"
            );
        }
    }
    held
}

/// [`rounds_held_with`] disk 0's stamps ([`stamp`]).
pub fn rounds_held(data: &[u8], rounds: u64, what: &str) -> u64 {
    rounds_held_with(data, rounds, what, stamp)
}

/// The image's guest view as bytes (qemu-img convert to raw).
pub fn guest_view(dir: &TempDir, image: &str, name: &str) -> Vec<u8> {
    let out = dir.file(&format!("{name}.view"));
    integration_tests::qemu_img(&["convert", "-U", "-O", "raw", image, &out]);
    let data = std::fs::read(&out).unwrap();
    std::fs::remove_file(&out).unwrap();
    data
}

/// A mirror's proof after the VM shut down: `target` (any format, or an
/// NBD export's file) is byte for byte what the disk held when it left
/// `source` (closed at the switch) with every one of `rounds` rounds
/// written, as `qemu-img compare` of the two finds.
pub fn assert_source_plus_rounds(dir: &TempDir, source: &str, target: &str, rounds: u64) {
    let mut expected = guest_view(dir, source, "expected");
    for r in 0..rounds {
        let off = (ROUND_BASE + r * ROUND_LEN) as usize;
        expected[off..off + ROUND_LEN as usize].fill(stamp(r));
    }
    let path = dir.file("expected.raw");
    std::fs::write(&path, &expected).unwrap();
    let out = integration_tests::qemu_img_status(&["compare", "-f", "raw", &path, target]);
    assert!(
        out.status.success(),
        "qemu-img compare {path} {target}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_file(&path).unwrap();
}
