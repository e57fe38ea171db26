//! Untrusted front ends and guests against the vhost-user-blk export:
//! malformed vhost-user messages get an error reply or a closed
//! connection, the daemon logs them and serves the next front end;
//! malformed descriptor chains get the same answers as from the in-VMM
//! device; a socket path that exists or cannot be created fails the start
//! with an error naming it.

mod vhost_user_support;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use block::{Disk, DiskOptions, EngineKind, ImageType};
use vhost::vhost_user::message::{VhostUserHeaderFlag, VhostUserProtocolFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vhost_user_support::*;
use virtio_bindings::virtio_blk::*;
use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_devices::block::BlockDeviceConfig;
use virtio_host_driver::{BlockHarness, DriverOptions, QueueDriver, UsedRequest};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

const OK: u8 = VIRTIO_BLK_S_OK as u8;
const NEXT: u16 = VRING_DESC_F_NEXT as u16;
const WRITE: u16 = VRING_DESC_F_WRITE as u16;

fn raw_disk(dir: &TempDir) -> std::path::PathBuf {
    zeroed_raw(dir, "disk.raw", 1 << 20)
}

/// The daemon is alive and a well-behaved front end gets its data.
fn still_serves(daemon: &mut Daemon) {
    daemon.assert_running();
    let mut fe = FrontEnd::connect(&daemon.socket, FrontEndOptions::default());
    let u = fe.queues[0].run(VIRTIO_BLK_T_IN, 0, 512).expect("read");
    assert_eq!(u.status, OK);
    drop(fe);
    daemon.assert_running();
}

/// A front end up to SET_FEATURES, asking for a reply to every message.
fn negotiated(daemon: &Daemon, max_queues: u64) -> Frontend {
    let mut f = connect_socket(&daemon.socket, max_queues);
    f.set_owner().unwrap();
    let features = f.get_features().unwrap();
    let protocol = f.get_protocol_features().unwrap();
    assert!(protocol.contains(VhostUserProtocolFeatures::REPLY_ACK));
    f.set_protocol_features(protocol).unwrap();
    f.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
    f.set_features(features).unwrap();
    f
}

/// Asserts the daemon hung up on `f` (the next request fails).
fn assert_closed(f: &mut Frontend) {
    std::thread::sleep(Duration::from_millis(50));
    assert!(f.get_features().is_err(), "connection still open");
}

/// Sends a raw message and asserts the daemon closes the connection.
fn raw_message_closes(daemon: &Daemon, request: u32, size: u32, body: &[u8]) {
    let mut s = UnixStream::connect(&daemon.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut msg = Vec::new();
    msg.extend_from_slice(&request.to_le_bytes());
    msg.extend_from_slice(&1u32.to_le_bytes()); // version 1
    msg.extend_from_slice(&size.to_le_bytes());
    msg.extend_from_slice(body);
    s.write_all(&msg).unwrap();
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => {}
        Ok(n) => panic!("request {request}: {n} bytes answered instead of a hang-up"),
        Err(e) => assert_ne!(
            e.kind(),
            std::io::ErrorKind::WouldBlock,
            "request {request}: connection left open"
        ),
    }
}

#[test]
fn malformed_messages_close_the_connection_and_the_daemon_serves_on() {
    let dir = TempDir::new("badmsg");
    let image = raw_disk(&dir);
    let mut daemon = Daemon::start(&dir, &image, "", "writable=on");
    // SET_OWNER (no body) announcing a body bigger than any message.
    raw_message_closes(&daemon, 3, 0x10000, &[]);
    // SET_VRING_NUM with a 4-byte body (it takes 8).
    raw_message_closes(&daemon, 8, 4, &[0; 4]);
    // SET_MEM_TABLE with 40 regions (at most 32) and no file descriptors.
    let mut body = Vec::new();
    body.extend_from_slice(&40u32.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes());
    body.extend(std::iter::repeat_n(0u8, 40 * 32));
    raw_message_closes(&daemon, 5, body.len() as u32, &body);
    // An unknown request code.
    raw_message_closes(&daemon, 999, 0, &[]);
    still_serves(&mut daemon);
    let log = daemon.stop();
    assert!(log.contains("connection closed"), "{log}");
}

#[test]
fn overlapping_memory_regions_are_refused() {
    let dir = TempDir::new("overlap");
    let image = raw_disk(&dir);
    let mut daemon = Daemon::start(&dir, &image, "", "writable=on");
    let mut f = negotiated(&daemon, 1);
    let memory = SharedMemory::new(4 << 20);
    let whole = memory.region();
    let half = VhostUserMemoryRegionInfo {
        guest_phys_addr: 2 << 20,
        memory_size: 2 << 20,
        userspace_addr: memory.host_addr(2 << 20),
        mmap_offset: 2 << 20,
        mmap_handle: whole.mmap_handle,
    };
    assert!(f.set_mem_table(&[whole, half]).is_err());
    assert_closed(&mut f);
    still_serves(&mut daemon);
    daemon.stop();
}

#[test]
fn queue_index_out_of_range_is_refused() {
    let dir = TempDir::new("qidx");
    let image = raw_disk(&dir);
    let mut daemon = Daemon::start(&dir, &image, "", "writable=on,num_queues=2");
    let mut f = negotiated(&daemon, 100);
    assert!(f.set_vring_num(2, 64).is_err(), "queue 2 of 2");
    assert_closed(&mut f);
    let mut f = negotiated(&daemon, 100);
    let kick = EventFd::new(EFD_NONBLOCK).unwrap();
    assert!(f.set_vring_kick(50, &kick).is_err(), "kick of queue 50");
    assert_closed(&mut f);
    still_serves(&mut daemon);
    daemon.stop();
}

#[test]
fn vring_outside_guest_memory_is_refused() {
    let dir = TempDir::new("vringaddr");
    let image = raw_disk(&dir);
    let mut daemon = Daemon::start(&dir, &image, "", "writable=on");
    let memory = SharedMemory::new(1 << 20);
    // Addresses the memory table does not map: an error reply.
    let mut f = negotiated(&daemon, 1);
    f.set_mem_table(&[memory.region()]).unwrap();
    f.set_vring_num(0, 128).unwrap();
    let outside = memory.host_addr(0) + (64 << 20);
    let config = VringConfigData {
        queue_max_size: 128,
        queue_size: 128,
        flags: 0,
        desc_table_addr: outside,
        used_ring_addr: outside + 0x1000,
        avail_ring_addr: outside + 0x2000,
        log_addr: None,
    };
    assert!(f.set_vring_addr(0, &config).is_err());
    assert_closed(&mut f);
    // A descriptor table that starts inside guest memory and runs past
    // its end: accepted by the protocol, refused when the queue starts.
    let mut f = negotiated(&daemon, 1);
    f.set_mem_table(&[memory.region()]).unwrap();
    f.set_vring_num(0, 128).unwrap();
    let end = memory.host_addr(0) + memory.size;
    let config = VringConfigData {
        desc_table_addr: end - 1024,
        used_ring_addr: memory.host_addr(0x1000),
        avail_ring_addr: memory.host_addr(0),
        ..config
    };
    f.set_vring_addr(0, &config).unwrap();
    f.set_vring_base(0, 0).unwrap();
    let call = EventFd::new(EFD_NONBLOCK).unwrap();
    let kick = EventFd::new(EFD_NONBLOCK).unwrap();
    f.set_vring_call(0, &call).unwrap();
    f.set_vring_kick(0, &kick).unwrap();
    f.set_vring_enable(0, true).unwrap();
    kick.write(1).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    drop(f);
    still_serves(&mut daemon);
    let log = daemon.stop();
    assert!(
        log.contains("queue 0: cannot start") && log.contains("outside guest memory"),
        "{log}"
    );
}

#[test]
fn socket_path_that_exists_or_cannot_be_created_fails_the_start() {
    let dir = TempDir::new("sockpath");
    let image = raw_disk(&dir);
    let taken = dir.join("taken.sock");
    std::fs::write(&taken, b"not a socket").unwrap();
    let missing = dir.join("no-such-dir/vhost.sock");
    for socket in [&taken, &missing] {
        let out = testkit::output_within(
            Command::new(env!("CARGO_BIN_EXE_ch-storage-daemon")).args([
                "--image",
                &format!("path={}", image.display()),
                "--export",
                &format!("type=vhost-user-blk,socket={}", socket.display()),
            ]),
            testkit::COMMAND_LIMIT,
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{socket:?}: started");
        assert!(err.contains(&socket.display().to_string()), "{err}");
    }
    assert_eq!(std::fs::read(&taken).unwrap(), b"not a socket");
}

/// One malformed chain: descriptors (guest address offset from the
/// scratch area or absolute, length, flags, next) and the header written
/// at the start of the scratch area.
struct BadChain {
    name: &'static str,
    request_type: u32,
    sector: u64,
    descs: Vec<(u64, u32, u16, usize)>,
}

const HDR: u64 = 0;
const STATUS: u64 = 16;
const DATA: u64 = 0x1000;
const FAR: u64 = 1 << 40;

fn bad_chains() -> Vec<BadChain> {
    let c = |name, request_type, sector, descs| BadChain {
        name,
        request_type,
        sector,
        descs,
    };
    vec![
        c(
            "loop",
            VIRTIO_BLK_T_IN,
            0,
            vec![(HDR, 16, NEXT, 1), (DATA, 512, NEXT | WRITE, 0)],
        ),
        c("no status", VIRTIO_BLK_T_IN, 0, vec![(HDR, 16, 0, 0)]),
        c(
            "read-only status",
            VIRTIO_BLK_T_IN,
            0,
            vec![(HDR, 16, NEXT, 1), (STATUS, 1, 0, 1)],
        ),
        c(
            "data outside memory",
            VIRTIO_BLK_T_IN,
            0,
            vec![
                (HDR, 16, NEXT, 1),
                (FAR, 512, NEXT | WRITE, 2),
                (STATUS, 1, WRITE, 2),
            ],
        ),
        c(
            "short header",
            VIRTIO_BLK_T_IN,
            0,
            vec![(HDR, 4, NEXT, 1), (STATUS, 1, WRITE, 1)],
        ),
        c(
            "write with writable data",
            VIRTIO_BLK_T_OUT,
            0,
            vec![
                (HDR, 16, NEXT, 1),
                (DATA, 512, NEXT | WRITE, 2),
                (STATUS, 1, WRITE, 2),
            ],
        ),
        c(
            "read past the end",
            VIRTIO_BLK_T_IN,
            2048,
            vec![
                (HDR, 16, NEXT, 1),
                (DATA, 512, NEXT | WRITE, 2),
                (STATUS, 1, WRITE, 2),
            ],
        ),
        c(
            "unaligned write",
            VIRTIO_BLK_T_OUT,
            0,
            vec![
                (HDR, 16, NEXT, 1),
                (DATA, 100, NEXT, 2),
                (STATUS, 1, WRITE, 2),
            ],
        ),
        c(
            "unknown type",
            0xff,
            0,
            vec![(HDR, 16, NEXT, 1), (STATUS, 1, WRITE, 1)],
        ),
    ]
}

/// Posts `chain` on `q` (guest memory `mem`, scratch area at `scratch`)
/// and returns the used length and the status byte.
fn answer(q: &mut QueueDriver, mem: &GuestMemoryMmap, scratch: u64, chain: &BadChain) -> (u32, u8) {
    let mut header = [0u8; 16];
    header[0..4].copy_from_slice(&chain.request_type.to_le_bytes());
    header[8..16].copy_from_slice(&chain.sector.to_le_bytes());
    mem.write_slice(&header, GuestAddress(scratch + HDR))
        .unwrap();
    mem.write_obj(0xffu8, GuestAddress(scratch + STATUS))
        .unwrap();
    let idx = q.vq.alloc(chain.descs.len()).unwrap();
    let table = q.vq.layout().desc_table;
    for (i, &(addr, len, flags, next)) in chain.descs.iter().enumerate() {
        let addr = if addr >= FAR { addr } else { scratch + addr };
        q.vq.write_raw_descriptor(table, idx[i], addr, len, flags, idx[next]);
    }
    let head = q.vq.track_chain(idx);
    q.vq.push_avail(head);
    q.force_kick().unwrap();
    let mut out: Vec<UsedRequest> = Vec::new();
    for _ in 0..50 {
        q.wait(Duration::from_millis(100), &mut out).unwrap();
        if let Some(u) = out.iter().find(|u| u.head == head) {
            let status: u8 = mem.read_obj(GuestAddress(scratch + STATUS)).unwrap();
            return (u.used_len, status);
        }
    }
    panic!("{}: chain {head} never came back", chain.name);
}

#[test]
fn malformed_chains_get_the_answers_of_the_in_vmm_device() {
    let dir = TempDir::new("chains");
    let image = raw_disk(&dir);
    // The in-VMM device over a copy of the same image.
    let copy = dir.join("copy.raw");
    std::fs::copy(&image, &copy).unwrap();
    let mut options = DiskOptions::new(&copy);
    options.image_type = ImageType::RAW;
    options.engine = EngineKind::Sync;
    let disk = Disk::open(&options).unwrap();
    let config = BlockDeviceConfig {
        queue_size: 128,
        ..Default::default()
    };
    let mut harness = BlockHarness::new(disk, config, DriverOptions::default()).unwrap();
    let mut daemon = Daemon::start(&dir, &image, "", "writable=on");
    let mut fe = FrontEnd::connect(&daemon.socket, FrontEndOptions::default());
    let (vm_mem, vm_scratch) = (Arc::clone(&harness.mem), harness.scratch().0);
    for chain in bad_chains() {
        let in_vmm = answer(harness.queue(0).unwrap(), &vm_mem, vm_scratch, &chain);
        let mem = Arc::clone(&fe.memory.mem);
        let exported = answer(&mut fe.queues[0], &mem, fe.scratch, &chain);
        assert_eq!(exported, in_vmm, "{}", chain.name);
    }
    // Still serving well-formed requests on the same queue.
    assert_eq!(
        fe.queues[0].run(VIRTIO_BLK_T_IN, 1, 512).unwrap().status,
        OK
    );
    drop(fe);
    daemon.assert_running();
    daemon.stop();
}
