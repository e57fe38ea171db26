//! Shared by the vhost-user-blk export tests: scratch folders, the daemon
//! as a child process, and a vhost-user front end played by the test.
//!
//! The front end is rust-vmm's `vhost` `Frontend` over the daemon's
//! socket, with guest memory in a memfd (as QEMU's
//! `memory-backend-memfd,share=on`), and one virtio-devices
//! [`QueueDriver`] per queue playing the guest driver: it posts chains in
//! the shared memory, writes the kick eventfd the daemon was given, and
//! waits on the call eventfd.

#![allow(dead_code)]

use std::fs::File;
use std::os::fd::FromRawFd;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_host_driver::{DriverOptions, DriverQueue, EventFdInterrupt, QueueDriver, QueueLayout};
use vm_memory::{FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

pub use testkit::TempDir;

/// A raw image of `size` zero bytes named `name` in `dir`.
pub fn zeroed_raw(dir: &TempDir, name: &str, size: u64) -> PathBuf {
    let path = dir.join(name);
    File::create(&path)
        .and_then(|f| f.set_len(size))
        .expect("raw image");
    path
}

/// Whether `tool` is on PATH (see testkit: a skip only without
/// CH_REQUIRE_ALL=1).
pub fn have_tool(tool: &str) -> bool {
    testkit::has_command(tool)
}

/// Runs a command, panicking with its output if it fails.
pub fn run(cmd: &mut Command) -> String {
    let out = testkit::output_within(cmd, testkit::COMMAND_LIMIT);
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ch-storage-daemon` as a child process.
pub struct Daemon {
    pub child: Child,
    pub socket: PathBuf,
    pub log: PathBuf,
}

impl Daemon {
    /// Starts the daemon on `image` with `--export type=vhost-user-blk,
    /// socket=...,<export_keys>` and waits for the socket.
    pub fn start(dir: &TempDir, image: &Path, image_keys: &str, export_keys: &str) -> Self {
        let socket = dir.join("vhost.sock");
        let log = dir.join("daemon.log");
        let mut image_arg = format!("path={}", image.display());
        if !image_keys.is_empty() {
            image_arg.push(',');
            image_arg.push_str(image_keys);
        }
        let mut export = format!("type=vhost-user-blk,socket={}", socket.display());
        if !export_keys.is_empty() {
            export.push(',');
            export.push_str(export_keys);
        }
        let child = Command::new(env!("CARGO_BIN_EXE_ch-storage-daemon"))
            .args(["--image", &image_arg, "--export", &export, "-v"])
            .stdout(Stdio::null())
            .stderr(File::create(&log).expect("log file"))
            .spawn()
            .expect("daemon starts");
        let mut daemon = Daemon { child, socket, log };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !daemon.socket.exists() {
            if let Ok(Some(status)) = daemon.child.try_wait() {
                panic!("daemon exited with {status}: {}", daemon.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "no socket: {}",
                daemon.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        daemon
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Asserts the daemon is still running.
    pub fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("daemon exited with {status}: {}", self.log_text());
        }
    }

    /// How many threads the daemon has.
    pub fn threads(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/task", self.child.id()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// The thread count once it has stopped changing: the socket exists
    /// before the connection thread has made its vring workers, so a
    /// count taken at once may miss them.
    pub fn settled_threads(&self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut last = self.threads();
        let mut same = 0;
        while same < 10 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            let now = self.threads();
            same = if now == last { same + 1 } else { 0 };
            last = now;
        }
        last
    }

    /// SIGTERM, then a clean exit within 60 s with the socket removed;
    /// returns the log.
    pub fn stop(mut self) -> String {
        let limit = Duration::from_secs(60);
        testkit::stop_cleanly(&mut self.child, "ch-storage-daemon", limit, &self.log);
        assert!(!self.socket.exists(), "the socket was not removed");
        self.log_text()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Guest memory in a memfd, mapped shared (what the daemon maps too).
pub struct SharedMemory {
    pub mem: Arc<GuestMemoryMmap>,
    pub file: File,
    pub size: u64,
}

impl SharedMemory {
    pub fn new(size: u64) -> Self {
        // SAFETY: the name is a NUL-terminated string; memfd_create
        // returns a new fd or -1.
        let fd = unsafe { libc::memfd_create(c"vublk-guest".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        // SAFETY: `fd` is a new descriptor nobody else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(size).expect("memfd size");
        let mem = GuestMemoryMmap::from_ranges_with_files([(
            GuestAddress(0),
            size as usize,
            Some(FileOffset::new(file.try_clone().expect("dup"), 0)),
        )])
        .expect("guest memory");
        SharedMemory {
            mem: Arc::new(mem),
            file,
            size,
        }
    }

    /// The host address of guest address `gpa` (the front end's "user
    /// address" in vhost-user messages).
    pub fn host_addr(&self, gpa: u64) -> u64 {
        self.mem
            .get_host_address(GuestAddress(gpa))
            .expect("address in guest memory") as u64
    }

    pub fn region(&self) -> VhostUserMemoryRegionInfo {
        VhostUserMemoryRegionInfo {
            guest_phys_addr: 0,
            memory_size: self.size,
            userspace_addr: self.host_addr(0),
            mmap_offset: 0,
            mmap_handle: self.file.as_raw_fd(),
        }
    }
}

/// A connected front end with every queue running.
pub struct FrontEnd {
    pub frontend: Frontend,
    pub memory: SharedMemory,
    pub queues: Vec<QueueDriver>,
    pub interrupt: Arc<EventFdInterrupt>,
    pub features: u64,
    pub layouts: Vec<QueueLayout>,
    /// Guest memory after the queues, free for tests' own buffers.
    pub scratch: u64,
    /// Each queue's kick eventfd (the driver writes a duplicate).
    pub kicks: Vec<EventFd>,
}

/// How [`FrontEnd::connect`] sets up the device.
#[derive(Clone, Copy, Debug)]
pub struct FrontEndOptions {
    pub num_queues: u16,
    pub queue_size: u16,
    pub driver: DriverOptions,
}

impl Default for FrontEndOptions {
    fn default() -> Self {
        FrontEndOptions {
            num_queues: 1,
            queue_size: 128,
            driver: DriverOptions {
                slots: 16,
                slot_data: 64 << 10,
                ..Default::default()
            },
        }
    }
}

/// Connects to `socket`, retrying while the daemon finishes a previous
/// connection.
pub fn connect_socket(socket: &Path, max_queues: u64) -> Frontend {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match Frontend::connect(socket, max_queues) {
            Ok(f) => return f,
            Err(e) => {
                assert!(Instant::now() < deadline, "connect {socket:?}: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

impl FrontEnd {
    /// The handshake QEMU does: owner, features, protocol features, memory
    /// table, then per queue num/addr/base/call/kick/enable.
    pub fn connect(socket: &Path, opts: FrontEndOptions) -> Self {
        let mut frontend = connect_socket(socket, u64::from(opts.num_queues));
        frontend.set_owner().expect("SET_OWNER");
        let offered = frontend.get_features().expect("GET_FEATURES");
        assert_ne!(
            offered & VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits(),
            0,
            "PROTOCOL_FEATURES offered"
        );
        let protocol = frontend
            .get_protocol_features()
            .expect("GET_PROTOCOL_FEATURES");
        assert!(protocol.contains(VhostUserProtocolFeatures::CONFIG));
        frontend
            .set_protocol_features(protocol)
            .expect("SET_PROTOCOL_FEATURES");
        if protocol.contains(VhostUserProtocolFeatures::MQ) {
            // A front end may use fewer queues than the device has.
            let device_queues = frontend.get_queue_num().expect("GET_QUEUE_NUM");
            assert!(device_queues >= u64::from(opts.num_queues));
        }
        let mut features = offered;
        if !opts.driver.event_idx {
            features &= !(1u64 << virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX);
        }
        frontend.set_features(features).expect("SET_FEATURES");

        let slot = QueueDriver::slot_stride(&opts.driver);
        let rings = QueueLayout::at(GuestAddress(0), opts.queue_size)
            .end()
            .next_multiple_of(4096);
        let per_queue = rings + slot * u64::from(opts.driver.slots);
        let size = (per_queue * u64::from(opts.num_queues) + opts.driver.scratch)
            .next_multiple_of(1 << 20);
        let memory = SharedMemory::new(size);
        frontend
            .set_mem_table(&[memory.region()])
            .expect("SET_MEM_TABLE");

        let interrupt = Arc::new(EventFdInterrupt::new(opts.num_queues).expect("eventfds"));
        let mut queues = Vec::new();
        let mut layouts = Vec::new();
        let mut kicks = Vec::new();
        for q in 0..opts.num_queues {
            let base = per_queue * u64::from(q);
            let layout = QueueLayout::at(GuestAddress(base), opts.queue_size);
            let kick = EventFd::new(EFD_NONBLOCK).expect("kick eventfd");
            let call = interrupt.eventfd(q).expect("call eventfd");
            setup_vring(&mut frontend, &memory, q, layout, 0, call, &kick);
            kicks.push(kick.try_clone().expect("dup kick"));
            let event_idx = opts.driver.event_idx;
            let vq = DriverQueue::new(Arc::clone(&memory.mem), layout, event_idx);
            queues.push(QueueDriver::new(
                q,
                vq,
                kick,
                Arc::clone(&interrupt),
                base + rings,
                &opts.driver,
            ));
            layouts.push(layout);
        }
        FrontEnd {
            frontend,
            memory,
            queues,
            interrupt,
            features,
            layouts,
            scratch: per_queue * u64::from(opts.num_queues),
            kicks,
        }
    }

    /// Sets vring `q` up again from avail position `base` (as QEMU does
    /// after stopping it with GET_VRING_BASE).
    pub fn restart_vring(&mut self, q: u16, base: u16) {
        let call = self.interrupt.eventfd(q).expect("call eventfd");
        let layout = self.layouts[usize::from(q)];
        let kick = &self.kicks[usize::from(q)];
        setup_vring(
            &mut self.frontend,
            &self.memory,
            q,
            layout,
            base,
            call,
            kick,
        );
    }

    /// Reads `len` bytes of the device config space at `offset`.
    pub fn config(&mut self, offset: u32, len: u32) -> Vec<u8> {
        let buf = vec![0u8; len as usize];
        let (_, data) = self
            .frontend
            .get_config(
                offset,
                len,
                vhost::vhost_user::message::VhostUserConfigFlags::WRITABLE,
                &buf,
            )
            .expect("GET_CONFIG");
        data
    }
}

/// SET_VRING_NUM, _ADDR, _BASE, _CALL, _KICK and _ENABLE for queue `q`.
fn setup_vring(
    frontend: &mut Frontend,
    memory: &SharedMemory,
    q: u16,
    layout: QueueLayout,
    base: u16,
    call: &EventFd,
    kick: &EventFd,
) {
    let i = usize::from(q);
    frontend
        .set_vring_num(i, layout.size)
        .expect("SET_VRING_NUM");
    frontend
        .set_vring_addr(
            i,
            &VringConfigData {
                queue_max_size: layout.size,
                queue_size: layout.size,
                flags: 0,
                desc_table_addr: memory.host_addr(layout.desc_table.0),
                used_ring_addr: memory.host_addr(layout.used_ring.0),
                avail_ring_addr: memory.host_addr(layout.avail_ring.0),
                log_addr: None,
            },
        )
        .expect("SET_VRING_ADDR");
    frontend.set_vring_base(i, base).expect("SET_VRING_BASE");
    frontend.set_vring_call(i, call).expect("SET_VRING_CALL");
    frontend.set_vring_kick(i, kick).expect("SET_VRING_KICK");
    frontend
        .set_vring_enable(i, true)
        .expect("SET_VRING_ENABLE");
}
