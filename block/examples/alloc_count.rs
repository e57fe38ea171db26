//! Heap allocations per 4 KiB read on the hot path: a counting global
//! allocator around a steady QD 32 random-read loop (io_uring engine,
//! O_DIRECT) on the image_bench files. Prints allocations per request.
//!
//! Usage: cargo run --release -p block --example alloc_count -- [CASE] [N]
//! CASE: raw, qcow2, zlib or zstd (files made by the image_bench example
//! in /var/tmp/image_bench). N: requests to count (default 100000).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use block::request::GuestSegment;
use block::{BlockRequest, Disk, DiskOptions, EngineKind, ImageType, IoMemory, RequestOp};
use vm_memory::{GuestAddress, GuestMemoryMmap};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only
// counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const BS: u64 = 4096;
const QD: usize = 32;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let case = args.get(1).map(String::as_str).unwrap_or("raw");
    let n: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let path = match case {
        "raw" => "/var/tmp/image_bench/data.raw".to_string(),
        "qcow2" => "/var/tmp/image_bench/alloc.qcow2".to_string(),
        c => format!("/var/tmp/image_bench/{c}.qcow2"),
    };
    let mut o = DiskOptions::new(&path);
    o.direct = true;
    o.engine = EngineKind::IoUring;
    o.image_type = if case == "raw" {
        ImageType::RAW
    } else {
        ImageType::Format("qcow2")
    };
    o.lock = false;
    o.readonly = true;
    let disk = Disk::open(&o).expect("open (run the image_bench example first)");
    let mut q = disk.queue().expect("queue");
    let mem = Arc::new(
        GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), QD * BS as usize)]).expect("memory"),
    );
    let blocks = disk.size() / BS;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut req = |slot: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        BlockRequest {
            user_data: slot as u64,
            op: RequestOp::Read,
            offset: (x % blocks) * BS,
            memory: IoMemory::guest(
                mem.clone(),
                vec![GuestSegment {
                    addr: GuestAddress(slot as u64 * BS),
                    len: BS as u32,
                }],
            )
            .expect("segment"),
        }
    };
    let mut out = Vec::with_capacity(QD);
    let mut next = Vec::with_capacity(QD);
    // Warm up (tables, caches, slab growth), then count.
    let mut run = |count: u64| {
        let mut done = 0u64;
        q.submit_batch_requests((0..QD).map(&mut req).collect::<Vec<_>>());
        while done < count {
            q.wait_completions(&mut out).expect("wait");
            for c in out.drain(..) {
                c.result.expect("read");
                done += 1;
                next.push(req(c.user_data as usize));
            }
            q.submit_batch_requests(next.drain(..));
        }
        while q.in_flight() > 0 {
            q.wait_completions(&mut out).expect("wait");
            out.clear();
        }
        done
    };
    run(10_000);
    // What the driver itself allocates per request (the GuestSegment Vec
    // and the memory Arc clone are the caller's, not ours).
    let a0 = ALLOCS.load(Ordering::Relaxed);
    let b0 = BYTES.load(Ordering::Relaxed);
    let done = run(n);
    let allocs = ALLOCS.load(Ordering::Relaxed) - a0;
    let bytes = BYTES.load(Ordering::Relaxed) - b0;
    println!(
        "{case}: {done} reads, {:.2} allocations and {:.0} bytes per request \
         (1 of them is the driver's segment Vec)",
        allocs as f64 / done as f64,
        bytes as f64 / done as f64
    );
}
