//! Malformed descriptor chains sent to the real device: each gets the
//! right status, or comes back with used length 0 when it has no status
//! byte, and the device keeps serving well-formed requests afterwards.

mod common;

use std::time::Duration;

use block::ImageType;
use common::*;
use virtio_bindings::virtio_blk::*;
use virtio_bindings::virtio_ring::{VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_host_driver::{BlockHarness, DescSpec, DriverOptions, QueueDriver, UsedRequest};
use vm_memory::{Bytes, GuestAddress};

const OK: u8 = VIRTIO_BLK_S_OK as u8;
const IOERR: u8 = VIRTIO_BLK_S_IOERR as u8;
const NEXT: u16 = VRING_DESC_F_NEXT as u16;
const WRITE: u16 = VRING_DESC_F_WRITE as u16;
const INDIRECT: u16 = VRING_DESC_F_INDIRECT as u16;

struct Setup {
    _dir: TempDir,
    h: BlockHarness,
}

fn setup() -> Setup {
    let dir = TempDir::new("bad");
    let raw = raw_image(&dir, 1 << 20);
    let h = harness(
        open(&raw, ImageType::RAW, false).unwrap(),
        1,
        DriverOptions::default(),
    );
    Setup { _dir: dir, h }
}

/// Writes `descs` (addr, len, flags, index of next within the list) to
/// freshly allocated ring descriptors and makes the first available.
fn post_raw(q: &mut QueueDriver, descs: &[(u64, u32, u16, usize)]) -> u16 {
    let idx = q.vq.alloc(descs.len()).unwrap();
    let table = q.vq.layout().desc_table;
    for (i, &(addr, len, flags, next)) in descs.iter().enumerate() {
        q.vq.write_raw_descriptor(
            table,
            idx[i],
            addr,
            len,
            flags,
            idx[next.min(idx.len() - 1)],
        );
    }
    let head = q.vq.track_chain(idx);
    q.vq.push_avail(head);
    q.force_kick().unwrap();
    head
}

fn wait_head(q: &mut QueueDriver, head: u16) -> UsedRequest {
    let mut out = Vec::new();
    for _ in 0..50 {
        q.wait(Duration::from_millis(100), &mut out).unwrap();
        if let Some(u) = out.iter().find(|u| u.head == head) {
            return *u;
        }
    }
    panic!("chain {head} never came back");
}

fn header(h: &BlockHarness, at: u64, t: u32, sector: u64) {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&t.to_le_bytes());
    b[8..16].copy_from_slice(&sector.to_le_bytes());
    h.mem.write_slice(&b, GuestAddress(at)).unwrap();
    h.mem.write_obj(0xffu8, GuestAddress(at + 16)).unwrap();
}

fn status(h: &BlockHarness, at: u64) -> u8 {
    h.mem.read_obj(GuestAddress(at + 16)).unwrap()
}

/// The device still serves a well-formed read.
fn still_works(q: &mut QueueDriver) {
    let u = q.run(VIRTIO_BLK_T_IN, 3, 512).unwrap();
    assert_eq!((u.status, u.used_len), (OK, 513));
    assert!(q
        .read_data(u.slot, 512)
        .iter()
        .all(|&b| b == sector_byte(3)));
}

#[test]
fn descriptor_loop_returns_used_length_zero() {
    let mut s = setup();
    let hdr = s.h.scratch().0;
    header(&s.h, hdr, VIRTIO_BLK_T_IN, 0);
    let q = s.h.queue(0).unwrap();
    // 0 -> 1 -> 0 -> ...
    let head = post_raw(
        q,
        &[(hdr, 16, NEXT, 1), (hdr + 0x1000, 512, NEXT | WRITE, 0)],
    );
    let u = wait_head(q, head);
    assert_eq!(u.used_len, 0);
    still_works(q);
}

#[test]
fn nested_indirect_table_returns_used_length_zero() {
    let mut s = setup();
    let base = s.h.scratch().0;
    let (hdr, outer, inner) = (base, base + 0x1000, base + 0x2000);
    header(&s.h, hdr, VIRTIO_BLK_T_IN, 0);
    let q = s.h.queue(0).unwrap();
    q.vq.write_raw_descriptor(GuestAddress(inner), 0, hdr + 16, 1, WRITE, 0);
    q.vq.write_raw_descriptor(GuestAddress(outer), 0, hdr, 16, NEXT, 1);
    q.vq.write_raw_descriptor(GuestAddress(outer), 1, inner, 16, INDIRECT, 0);
    let head = post_raw(q, &[(outer, 32, INDIRECT, 0)]);
    assert_eq!(wait_head(q, head).used_len, 0);
    assert_eq!(status(&s.h, hdr), 0xff, "status byte must not be written");
    let q = s.h.queue(0).unwrap();
    still_works(q);
}

#[test]
fn bad_indirect_tables_return_used_length_zero() {
    let mut s = setup();
    let base = s.h.scratch().0;
    let size = vm_memory::GuestMemoryBackend::last_addr(&*s.h.mem).0 + 1;
    let q = s.h.queue(0).unwrap();
    // Length not a multiple of 16; table outside guest memory; empty table.
    for (addr, len) in [
        (base, 20),
        (size + 0x1000, 32),
        (u64::MAX - 15, 16),
        (base, 0),
    ] {
        let head = post_raw(q, &[(addr, len, INDIRECT, 0)]);
        assert_eq!(wait_head(q, head).used_len, 0, "table {addr:#x}+{len}");
    }
    still_works(q);
}

#[test]
fn status_missing_or_read_only() {
    let mut s = setup();
    let hdr = s.h.scratch().0;
    header(&s.h, hdr, VIRTIO_BLK_T_IN, 0);
    let q = s.h.queue(0).unwrap();
    let head = post_raw(q, &[(hdr, 16, NEXT, 1), (hdr + 16, 1, 0, 0)]);
    assert_eq!(wait_head(q, head).used_len, 0);
    let head = post_raw(q, &[(hdr, 16, 0, 0)]);
    assert_eq!(wait_head(q, head).used_len, 0);
    assert_eq!(status(&s.h, hdr), 0xff);
    let q = s.h.queue(0).unwrap();
    still_works(q);
}

#[test]
fn descriptors_outside_guest_memory_get_ioerr() {
    let mut s = setup();
    let hdr = s.h.scratch().0;
    header(&s.h, hdr, VIRTIO_BLK_T_IN, 0);
    let q = s.h.queue(0).unwrap();
    let head = post_raw(
        q,
        &[
            (hdr, 16, NEXT, 1),
            (1 << 40, 512, NEXT | WRITE, 2),
            (hdr + 16, 1, WRITE, 2),
        ],
    );
    assert_eq!(wait_head(q, head).used_len, 1);
    assert_eq!(status(&s.h, hdr), IOERR);
    // Header unreadable.
    let q = s.h.queue(0).unwrap();
    let head = post_raw(q, &[(1 << 40, 16, NEXT, 1), (hdr + 16, 1, WRITE, 1)]);
    assert_eq!(wait_head(q, head).used_len, 1);
    assert_eq!(status(&s.h, hdr), IOERR);
    let q = s.h.queue(0).unwrap();
    still_works(q);
}

#[test]
fn wrong_direction_and_short_header_get_ioerr() {
    let mut s = setup();
    let hdr = s.h.scratch().0;
    let data = hdr + 0x1000;
    // OUT whose data is device-writable.
    header(&s.h, hdr, VIRTIO_BLK_T_OUT, 0);
    let q = s.h.queue(0).unwrap();
    let head = post_raw(
        q,
        &[
            (hdr, 16, NEXT, 1),
            (data, 512, NEXT | WRITE, 2),
            (hdr + 16, 1, WRITE, 2),
        ],
    );
    assert_eq!(wait_head(q, head).used_len, 1);
    assert_eq!(status(&s.h, hdr), IOERR);
    // IN whose data is device-readable.
    header(&s.h, hdr, VIRTIO_BLK_T_IN, 0);
    let q = s.h.queue(0).unwrap();
    let head = post_raw(
        q,
        &[
            (hdr, 16, NEXT, 1),
            (data, 512, NEXT, 2),
            (hdr + 16, 1, WRITE, 2),
        ],
    );
    wait_head(q, head);
    assert_eq!(status(&s.h, hdr), IOERR);
    // Header of 4 bytes.
    header(&s.h, hdr, VIRTIO_BLK_T_IN, 0);
    let q = s.h.queue(0).unwrap();
    let head = post_raw(q, &[(hdr, 4, NEXT, 1), (hdr + 16, 1, WRITE, 1)]);
    wait_head(q, head);
    assert_eq!(status(&s.h, hdr), IOERR);
    let q = s.h.queue(0).unwrap();
    still_works(q);
}

#[test]
fn more_segments_than_seg_max_gets_ioerr() {
    let mut s = setup();
    let base = s.h.scratch().0;
    let (hdr, table, data) = (base, base + 0x1000, base + 0x4000);
    header(&s.h, hdr, VIRTIO_BLK_T_IN, 0);
    // queue_size 64 -> seg_max 62; send 63 data segments indirectly.
    let mut descs = vec![DescSpec::readable(hdr, 16)];
    for i in 0..63 {
        descs.push(DescSpec::writable(data + i * 512, 512));
    }
    descs.push(DescSpec::writable(hdr + 16, 1));
    let q = s.h.queue(0).unwrap();
    let head =
        q.vq.add_indirect_chain(GuestAddress(table), &descs)
            .unwrap();
    q.vq.push_avail(head);
    q.force_kick().unwrap();
    assert_eq!(wait_head(q, head).used_len, 1);
    assert_eq!(status(&s.h, hdr), IOERR);
    // 62 segments are fine.
    descs.remove(63);
    header(&s.h, hdr, VIRTIO_BLK_T_IN, 0);
    let q = s.h.queue(0).unwrap();
    let head =
        q.vq.add_indirect_chain(GuestAddress(table), &descs)
            .unwrap();
    q.vq.push_avail(head);
    q.force_kick().unwrap();
    assert_eq!(wait_head(q, head).used_len, 62 * 512 + 1);
    assert_eq!(status(&s.h, hdr), OK);
}

#[test]
fn head_index_beyond_queue_size_is_ignored() {
    let mut s = setup();
    let q = s.h.queue(0).unwrap();
    q.vq.push_avail(1000);
    q.force_kick().unwrap();
    still_works(q);
}

#[test]
fn avail_index_far_ahead_does_not_crash_and_reset_recovers() {
    let mut s = setup();
    {
        let q = s.h.queue(0).unwrap();
        for _ in 0..200 {
            q.vq.push_avail(0);
        }
        q.force_kick().unwrap();
    }
    // The device refuses the ring (more entries than its size) and stays
    // alive; a reset brings the queue back.
    assert_eq!(s.h.reset_and_reactivate().unwrap(), 1);
    let q = s.h.queue(0).unwrap();
    still_works(q);
}
