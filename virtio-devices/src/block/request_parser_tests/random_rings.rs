//! Seeded random rings through virtio-queue and the parser: nothing may
//! panic, and every answer stays inside guest memory and the disk.

use super::*;

/// Deterministic random descriptor tables, rings and headers popped
/// through virtio-queue and parsed: a cheap, always-on cousin of the
/// cargo-fuzz target. Nothing may panic; every answer must stay inside
/// guest memory and the disk.
#[test]
fn random_rings_never_panic() {
    use virtio_queue::{Queue, QueueT};
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let types = [0u32, 1, 4, 8, 11, 13, 2, 14, 0xffff_ffff];
    let (mut disk, mut rejected, mut dropped) = (0, 0, 0);
    // One scratch for every chain, as a queue worker keeps it: reused
    // buffers must never change an outcome.
    let mut scratch = ParseScratch::default();
    for _ in 0..3000 {
        let m = GuestMemoryMmap::<()>::from_ranges(&[
            (GuestAddress(0), 0x8000),
            (GuestAddress(0x8000), 0x8000),
        ])
        .unwrap();
        let size: u16 = 8;
        let desc = |m: &GuestMemoryMmap,
                    table: u64,
                    i: u64,
                    addr: u64,
                    len: u32,
                    flags: u16,
                    next: u16| {
            let mut d = [0u8; 16];
            d[0..8].copy_from_slice(&addr.to_le_bytes());
            d[8..12].copy_from_slice(&len.to_le_bytes());
            d[12..14].copy_from_slice(&flags.to_le_bytes());
            d[14..16].copy_from_slice(&next.to_le_bytes());
            m.write_slice(&d, GuestAddress(table + 16 * i)).unwrap();
        };
        // Ring descriptor h points at an indirect table holding a mostly
        // well-formed request: header, 0-4 data descriptors, status.
        for h in 0..u64::from(size) {
            let table = 0x400 + h * 0x100;
            let hdr = 0x1000 + h * 0x1000;
            let t = types[rng.below(types.len() as u64) as usize];
            let mut b = [0u8; 16];
            b[0..4].copy_from_slice(&t.to_le_bytes());
            b[8..16].copy_from_slice(&rng.below(2100).to_le_bytes());
            m.write_slice(&b, GuestAddress(hdr)).unwrap();
            // A discard segment right after the header.
            let mut seg = [0u8; 16];
            seg[0..8].copy_from_slice(&rng.below(2100).to_le_bytes());
            seg[8..12].copy_from_slice(&(rng.below(80) as u32).to_le_bytes());
            seg[12..16].copy_from_slice(&(rng.below(3) as u32).to_le_bytes());
            m.write_slice(&seg, GuestAddress(hdr + 16)).unwrap();
            let n_data = rng.below(5);
            let writable = u16::from(matches!(t, 0 | 8)) * 2;
            desc(
                &m,
                table,
                0,
                hdr,
                if t == 11 || t == 13 { 32 } else { 16 },
                1,
                1,
            );
            for d in 0..n_data {
                let len = if rng.below(8) == 0 {
                    rng.below(700) as u32
                } else {
                    512 * (1 + rng.below(2) as u32)
                };
                desc(
                    &m,
                    table,
                    1 + d,
                    hdr + 0x100 + d * 0x400,
                    len,
                    1 | writable,
                    (2 + d) as u16,
                );
            }
            desc(&m, table, 1 + n_data, hdr + 0xff0, 1, 2, 0);
            desc(&m, 0, h, table, 16 * (2 + n_data as u32), 4, 0);
            // Now break something, sometimes.
            if rng.below(3) == 0 {
                let (tbl, i) = if rng.below(2) == 0 {
                    (table, rng.below(2 + n_data))
                } else {
                    (0, h)
                };
                let field = rng.below(4);
                let at = GuestAddress(tbl + 16 * i + [0, 8, 12, 14][field as usize]);
                match field {
                    0 => m.write_obj(rng.next(), at).unwrap(),
                    1 => m.write_obj(rng.next() as u32, at).unwrap(),
                    _ => m.write_obj(rng.below(16) as u16, at).unwrap(),
                }
            }
        }
        let avail = 0x200u64;
        let n_avail = rng.below(u64::from(size) + 2) as u16;
        m.write_obj(n_avail, GuestAddress(avail + 2)).unwrap();
        for i in 0..u64::from(size) {
            m.write_obj(rng.below(9) as u16, GuestAddress(avail + 4 + 2 * i))
                .unwrap();
        }
        let mut q = Queue::new(size).unwrap();
        q.set_size(size);
        q.set_desc_table_address(Some(0), Some(0));
        q.set_avail_ring_address(Some(avail as u32), Some(0));
        q.set_used_ring_address(Some(0x300), Some(0));
        q.set_ready(true);
        let l = ParserLimits {
            capacity_sectors: 2048,
            seg_max: 3,
            readonly: rng.below(2) == 0,
            max_discard_sectors: 64,
            max_discard_seg: 1,
        };
        while let Some(chain) = q.pop_descriptor_chain(&m) {
            let reused = parse_chain_with(&m, chain.clone(), &l, &mut scratch);
            let parsed = parse_chain(&m, chain, &l);
            assert_eq!(format!("{reused:?}"), format!("{parsed:?}"));
            if let ParsedChain::Request {
                work: RequestWork::Disk { segments, .. },
                ..
            } = reused
            {
                scratch.recycle(segments);
            }
            match parsed {
                ParsedChain::Unanswerable(_) => dropped += 1,
                ParsedChain::Request { status, work } => {
                    assert!(m.address_in_range(status));
                    if let RequestWork::Reject(_) = work {
                        rejected += 1;
                    }
                    if let RequestWork::Disk {
                        op,
                        offset,
                        segments,
                    } = work
                    {
                        disk += 1;
                        let data: u64 = segments.iter().map(|s| u64::from(s.len)).sum();
                        let len = match op {
                            RequestOp::Discard { len } | RequestOp::WriteZeroes { len, .. } => len,
                            _ => data,
                        };
                        assert!(offset + len <= 2048 * 512);
                        assert!(segments.len() <= 6, "seg_max 3, each split at most once");
                        for s in &segments {
                            assert!(m.get_slice(s.addr, s.len as usize).is_ok());
                        }
                        if l.readonly {
                            assert!(
                                matches!(op, RequestOp::Read | RequestOp::Flush),
                                "{op:?} on a read-only disk"
                            );
                        }
                    }
                }
            }
        }
    }
    // The generator must reach every outcome, or the test proves little.
    assert!(
        disk > 10 && rejected > 10 && dropped > 10,
        "disk {disk} rejected {rejected} dropped {dropped}"
    );
}
