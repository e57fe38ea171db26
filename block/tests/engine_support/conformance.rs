//! The conformance body every engine x format x cache-mode case runs:
//! batches of disjoint random reads, writes (owned and scattered guest
//! memory, aligned and not), write-zeroes, discards and flushes on one
//! queue, checked against an in-memory model after every batch.

use block::{BlockRequest, Disk, DiskQueue, IoMemory, RequestOp};

use super::{first_data, guest_memory, guest_read, guest_write, run_batch, scattered};
use crate::support::Rng;

const SLOT: u64 = 64 << 10;

/// Runs the body on `disk` whose current contents are `model`; returns the
/// model of what the disk holds afterwards.
pub fn exercise(disk: &Disk, model: Vec<u8>, seed: u64) -> Vec<u8> {
    run(disk, disk.queue().unwrap(), model, seed, true)
}

/// The body on a given queue of `disk` (say, one on a fault engine).
pub fn exercise_on(disk: &Disk, q: DiskQueue, model: Vec<u8>, seed: u64) -> Vec<u8> {
    run(disk, q, model, seed, true)
}

/// The body with reads only (formats we only read).
pub fn exercise_reads(disk: &Disk, model: Vec<u8>, seed: u64) {
    run(disk, disk.queue().unwrap(), model, seed, false);
}

fn run(disk: &Disk, mut q: DiskQueue, mut model: Vec<u8>, seed: u64, writes: bool) -> Vec<u8> {
    let size = disk.size();
    assert_eq!(size, model.len() as u64);
    let slots = size / SLOT;
    let mem = guest_memory(16 << 20);
    let mut rng = Rng::new(seed);
    for round in 0..24 {
        // Distinct slots, so requests of one batch never overlap.
        let mut chosen: Vec<u64> = Vec::new();
        while chosen.len() < 8 {
            let s = rng.below(slots);
            if !chosen.contains(&s) {
                chosen.push(s);
            }
        }
        let mut reqs = Vec::new();
        let mut expect: Vec<(u64, u64, Option<Vec<u8>>)> = Vec::new(); // reads: (ud, off, data)
        let mut updates: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut guest_reads = Vec::new();
        for (i, slot) in chosen.iter().enumerate() {
            let ud = i as u64;
            let sector_aligned = rng.below(4) != 0;
            let (off, len) = if sector_aligned {
                let off = slot * SLOT + rng.below(SLOT / 512 / 2) * 512;
                (off, (1 + rng.below(SLOT / 512 / 2)) * 512)
            } else {
                let off = slot * SLOT + rng.below(SLOT / 2);
                (off, 1 + rng.below(SLOT / 2 - 1))
            };
            let gbase = (i as u64) * (1 << 20);
            let kind = if writes {
                (round + i) % 6
            } else {
                2 + (round + i) % 2
            };
            match kind {
                0 => {
                    let mut data = vec![0u8; len as usize];
                    rng.fill(&mut data);
                    updates.push((off, data.clone()));
                    reqs.push(BlockRequest {
                        user_data: ud,
                        op: RequestOp::Write,
                        offset: off,
                        memory: IoMemory::Owned(data),
                    });
                }
                1 => {
                    let mut data = vec![0u8; len as usize];
                    rng.fill(&mut data);
                    // Odd segment sizes/addresses force bounce buffers under O_DIRECT.
                    let (segsz, base) = if sector_aligned {
                        (4096, gbase)
                    } else {
                        (1000, gbase + 3)
                    };
                    let segs = scattered(base, len as u32, segsz, 512);
                    guest_write(&mem, &segs, &data);
                    updates.push((off, data));
                    reqs.push(BlockRequest {
                        user_data: ud,
                        op: RequestOp::Write,
                        offset: off,
                        memory: IoMemory::guest(mem.clone(), segs).unwrap(),
                    });
                }
                2 => {
                    expect.push((ud, off, None));
                    reqs.push(super::read_req(ud, off, len as usize));
                }
                3 => {
                    let (segsz, base) = if sector_aligned {
                        (4096, gbase)
                    } else {
                        (777, gbase + 1)
                    };
                    let segs = scattered(base, len as u32, segsz, 4096);
                    guest_reads.push((ud, off, segs.clone()));
                    reqs.push(BlockRequest {
                        user_data: ud,
                        op: RequestOp::Read,
                        offset: off,
                        memory: IoMemory::guest(mem.clone(), segs).unwrap(),
                    });
                }
                4 => {
                    // Zeroing and discard in sector units (virtio-blk's).
                    let (off, len) = (off / 512 * 512, len.div_ceil(512) * 512);
                    let len = len.min(slot * SLOT + SLOT - off);
                    updates.push((off, vec![0u8; len as usize]));
                    let op = RequestOp::WriteZeroes {
                        len,
                        may_unmap: rng.below(2) == 0,
                    };
                    reqs.push(super::op_req(ud, op, off));
                }
                _ => {
                    if rng.below(2) == 0 {
                        reqs.push(super::op_req(ud, RequestOp::Flush, 0));
                    } else {
                        let (off, len) = (off / 65536 * 65536, 65536);
                        updates.push((off, vec![0u8; len as usize]));
                        reqs.push(super::op_req(ud, RequestOp::Discard { len }, off));
                    }
                }
            }
        }
        let n = reqs.len();
        let done = run_batch(&mut q, reqs);
        assert_eq!(done.len(), n);
        for (i, c) in done.iter().enumerate() {
            assert_eq!(c.user_data, i as u64);
            if let Err(e) = &c.result {
                panic!("round {round} request {i} failed: {e:?}");
            }
        }
        for (ud, off, _) in &expect {
            let c = &done[*ud as usize];
            let IoMemory::Owned(data) = &c.memory else {
                panic!("memory not handed back")
            };
            assert_eq!(c.result.as_ref().unwrap(), &(data.len() as u64));
            assert!(
                data[..] == model[*off as usize..*off as usize + data.len()],
                "round {round}: read at {off} len {} differs",
                data.len()
            );
        }
        for (_, off, segs) in &guest_reads {
            let data = guest_read(&mem, segs);
            assert!(
                data[..] == model[*off as usize..*off as usize + data.len()],
                "round {round}: guest read at {off} differs"
            );
        }
        for (off, data) in updates {
            model[off as usize..off as usize + data.len()].copy_from_slice(&data);
        }
    }
    // One big read of everything (multi-chunk bounce under O_DIRECT).
    let done = run_batch(&mut q, vec![super::read_req(99, 0, size as usize)]);
    let data = first_data(done);
    assert!(data == model, "final full read differs from the model");
    model
}
