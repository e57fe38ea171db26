//! Fuzzes the virtio-blk request parser with a guest memory image the
//! fuzzer controls entirely: the descriptor table, the available ring,
//! indirect tables, headers and discard segments. Every available chain
//! is popped through virtio-queue and parsed; nothing may panic, and every
//! disk request must stay inside the disk and inside guest memory.

#![no_main]

use libfuzzer_sys::fuzz_target;
use virtio_devices::block::request_parser::{parse_chain, ParsedChain, ParserLimits, RequestWork};
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

const MEM_SIZE: usize = 0x10000;
const QUEUE_SIZE: u16 = 16;

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let (knobs, image) = data.split_at(8);
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM_SIZE)]).unwrap();
    let n = image.len().min(MEM_SIZE);
    mem.write_slice(&image[..n], GuestAddress(0)).unwrap();
    let limits = ParserLimits {
        capacity_sectors: u64::from(u16::from_le_bytes([knobs[0], knobs[1]])),
        seg_max: u32::from(knobs[2] % 8) + 1,
        readonly: knobs[3] & 1 != 0,
        max_discard_sectors: u32::from(u16::from_le_bytes([knobs[4], knobs[5]])),
        max_discard_seg: 1,
    };
    let mut q = Queue::new(QUEUE_SIZE).unwrap();
    q.set_size(QUEUE_SIZE);
    q.set_desc_table_address(Some(0), Some(0));
    q.set_avail_ring_address(Some(0x1000), Some(0));
    q.set_used_ring_address(Some(0x2000), Some(0));
    q.set_event_idx(knobs[6] & 1 != 0);
    q.set_ready(true);
    for _ in 0..QUEUE_SIZE {
        let Some(chain) = q.pop_descriptor_chain(&mem) else {
            break;
        };
        let head = chain.head_index();
        let parsed = parse_chain(&mem, chain, &limits);
        let used_len = match parsed {
            ParsedChain::Unanswerable(_) => 0,
            ParsedChain::Request { status, work } => {
                assert!(mem.address_in_range(status));
                if let RequestWork::Disk {
                    offset,
                    segments,
                    op,
                } = &work
                {
                    let len: u64 = segments.iter().map(|s| u64::from(s.len)).sum();
                    let covered = match op {
                        block::RequestOp::Discard { len }
                        | block::RequestOp::WriteZeroes { len, .. } => *len,
                        _ => len,
                    };
                    assert!(offset + covered <= limits.capacity_sectors * 512);
                    for s in segments {
                        assert!(mem.get_slice(s.addr, s.len as usize).is_ok());
                    }
                }
                1
            }
        };
        let _ = q.add_used(&mem, head, used_len);
    }
    let _ = q.iter(&mem);
});
