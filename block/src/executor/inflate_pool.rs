//! A small process-wide pool of threads that inflate compressed clusters,
//! so compressed reads use every core instead of only the queue's thread.
//!
//! A queue whose compressed read has completed hands the pool an
//! [`InflateJob`]: the compressed bytes (an owned buffer the kernel no
//! longer uses), where they sit in it, and the queue's [`InflateReplies`].
//! A worker inflates them (`executor::inflate::inflate`), appends an
//! [`InflateDone`] to the replies and signals the queue's completion
//! eventfd, so the result flows through the queue's one completion path:
//! the queue's next drain copies the piece into the request's memory.
//! Nothing here touches guest memory or holds any format lock.
//!
//! The pool has one thread per core (at most [`MAX_THREADS`]), started on
//! first use. If no thread can be started the job runs in the caller.
//!
//! Only deflate clusters come here: a zstd cluster inflates in a few
//! microseconds, less than the hand-off to a pool thread and back costs,
//! so the queue inflates those itself ([`inflates_in_queue`]).

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use vmm_sys_util::eventfd::EventFd;

use crate::aligned::AlignedBuf;
use crate::executor::inflate::inflate;
use crate::formats::CompressedExtent;

/// Upper bound on pool threads, whatever the core count.
pub const MAX_THREADS: usize = 8;

/// Compressed bytes to inflate for one op of one queue.
pub struct InflateJob {
    /// Returned with the result (the op's token).
    pub tag: u64,
    pub ext: CompressedExtent,
    /// Holds the compressed bytes at `skip..skip + ext.compressed_len`.
    pub input: AlignedBuf,
    pub skip: usize,
    pub replies: Arc<InflateReplies>,
}

/// An inflated cluster (or why it could not be inflated).
pub struct InflateDone {
    pub tag: u64,
    pub ext: CompressedExtent,
    pub result: Result<Vec<u8>, String>,
}

/// Where a queue's finished inflations wait for its next drain.
pub struct InflateReplies {
    done: Mutex<Vec<InflateDone>>,
    eventfd: Arc<EventFd>,
}

impl InflateReplies {
    /// Replies for a queue whose completion eventfd is `eventfd`.
    pub fn new(eventfd: Arc<EventFd>) -> Self {
        InflateReplies {
            done: Mutex::new(Vec::new()),
            eventfd,
        }
    }

    /// Moves every finished inflation to `out`.
    pub fn take(&self, out: &mut Vec<InflateDone>) {
        let mut done = self.done.lock().unwrap_or_else(|p| p.into_inner());
        out.append(&mut done);
    }

    fn post(&self, d: InflateDone) {
        self.done.lock().unwrap_or_else(|p| p.into_inner()).push(d);
        // Only fails on counter overflow, when a wake-up is pending anyway.
        let _ = self.eventfd.write(1);
    }
}

/// Whether clusters compressed with `algorithm` are inflated by the queue
/// that read them rather than by the pool. Measured on the 2-core
/// development machine (docs/io-engines.md, "What still runs inline"): a 64 KiB
/// zstd cluster inflates in 6-8 us, while handing it to the pool and back
/// kept it 165-290 us away from the queue (a pool thread's wake-up, then
/// the queue's), so 4 KiB random reads of a zstd image went 12-15 %
/// faster inline. A deflate cluster takes 60-80 us: there the second core
/// wins (inline was 22-30 % slower).
pub fn inflates_in_queue(algorithm: crate::formats::Compression) -> bool {
    algorithm == crate::formats::Compression::Zstd
}

impl InflateJob {
    /// Inflates the job's bytes here, in the caller's thread.
    pub fn inflate(&self) -> InflateDone {
        let len = usize::try_from(self.ext.compressed_len).unwrap_or(usize::MAX);
        let result = match self
            .input
            .as_slice()
            .get(self.skip..self.skip.saturating_add(len))
        {
            Some(input) => inflate(self.ext.algorithm, input, self.ext.cluster_size),
            None => Err("compressed bytes past the read buffer".into()),
        };
        InflateDone {
            tag: self.tag,
            ext: self.ext,
            result,
        }
    }

    /// Inflates and posts the result to the job's queue.
    fn run(self) {
        self.replies.post(self.inflate());
    }
}

struct Pool {
    jobs: Mutex<VecDeque<InflateJob>>,
    ready: Condvar,
    threads: usize,
}

fn pool() -> &'static Arc<Pool> {
    static POOL: OnceLock<Arc<Pool>> = OnceLock::new();
    POOL.get_or_init(|| {
        let want = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .clamp(1, MAX_THREADS);
        let mut pool = Pool {
            jobs: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
            threads: 0,
        };
        // Count the threads before any of them can see the pool.
        let started: Vec<_> = (0..want)
            .map(|i| {
                let (tx, rx) = std::sync::mpsc::channel::<Arc<Pool>>();
                std::thread::Builder::new()
                    .name(format!("block-inflate-{i}"))
                    .spawn(move || {
                        if let Ok(p) = rx.recv() {
                            worker(&p);
                        }
                    })
                    .ok()
                    .map(|_| tx)
            })
            .collect();
        pool.threads = started.iter().flatten().count();
        let pool = Arc::new(pool);
        for tx in started.into_iter().flatten() {
            let _ = tx.send(pool.clone());
        }
        pool
    })
}

fn worker(pool: &Pool) {
    loop {
        let job = {
            let mut jobs = pool.jobs.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if let Some(j) = jobs.pop_front() {
                    break j;
                }
                jobs = pool.ready.wait(jobs).unwrap_or_else(|p| p.into_inner());
            }
        };
        job.run();
    }
}

/// Inflates `job` on the pool (or inline when the pool has no thread);
/// its result reaches `job.replies` either way.
pub fn submit(job: InflateJob) {
    let pool = pool();
    if pool.threads == 0 {
        return job.run();
    }
    pool.jobs
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push_back(job);
    pool.ready.notify_one();
}

/// Threads in the pool (0 means inflation runs in the queue's thread).
pub fn threads() -> usize {
    pool().threads
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::{Compression, FileId};
    use std::io::Write;
    use vmm_sys_util::eventfd::EFD_NONBLOCK;

    #[test]
    fn jobs_come_back_through_the_replies_and_eventfd() {
        let data: Vec<u8> = (0..65536u32).map(|i| (i % 97) as u8).collect();
        let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(&data).unwrap();
        let comp = e.finish().unwrap();
        let efd = Arc::new(EventFd::new(EFD_NONBLOCK).unwrap());
        let replies = Arc::new(InflateReplies::new(efd.clone()));
        for tag in 0..8u64 {
            let mut input = AlignedBuf::new(comp.len() + 100, 64).unwrap();
            input.as_mut_slice()[100..].copy_from_slice(&comp);
            let ext = CompressedExtent {
                file: FileId(0),
                host_offset: 0,
                compressed_len: if tag == 7 { 10 } else { comp.len() as u64 },
                algorithm: Compression::Deflate,
                cluster_size: 65536,
                offset_in_cluster: 0,
            };
            submit(InflateJob {
                tag,
                ext,
                input,
                skip: 100,
                replies: replies.clone(),
            });
        }
        let mut out = Vec::new();
        while out.len() < 8 {
            let mut pfd = libc::pollfd {
                fd: std::os::fd::AsRawFd::as_raw_fd(efd.as_ref()),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the duration of the call.
            let r = unsafe { libc::poll(&mut pfd, 1, 10_000) };
            assert!(r > 0, "no reply within 10 s");
            let _ = efd.read();
            replies.take(&mut out);
        }
        out.sort_by_key(|d| d.tag);
        for d in &out[..7] {
            assert_eq!(d.result.as_deref(), Ok(&data[..]), "job {}", d.tag);
        }
        assert!(out[7].result.is_err(), "a truncated stream fails");
        assert!(threads() >= 1);
    }
}
