//! Crash images from a write log: what the image file may hold after a
//! power loss at a chosen point of the log, when only fdatasync orders
//! writes.
//!
//! A [`Timeline`] is the log digested into host writes, barriers and guest
//! requests, each with the log positions of its issue and completion. A
//! crash at position `c` (everything logged before `c` happened, nothing
//! after) keeps:
//! - every write that completed before the issue of a barrier that
//!   completed before `c` (durable: applied in completion order);
//! - any subset of the other writes issued before `c`, each whole, torn
//!   into some of its sectors, or lost, applied in random order.
//!
//! The file ends at the end of its first bytes or of the furthest write
//! kept (zero-range may extend it, punch-hole never does), or, half of the
//! time, at the size the file had at the end of the run (ftruncate
//! headroom that became durable). Starting bytes and the log enter; image
//! bytes leave.

use std::sync::Arc;

use super::record::{Event, GuestOp, HostSource};
use super::Rng;

/// Host sectors a torn write keeps or loses one by one.
const TEAR: u64 = 512;

#[derive(Clone, Debug)]
pub struct HostWrite {
    pub source: HostSource,
    pub issue: usize,
    /// Log position of a successful completion.
    pub done: Option<usize>,
    pub offset: u64,
    /// Bytes that reach the file (the completed prefix of a short write).
    pub len: u64,
    pub data: Option<Arc<Vec<u8>>>,
}

#[derive(Clone, Copy, Debug)]
pub struct Barrier {
    /// Issued by a queue's engine (else at the metadata seam).
    pub engine: bool,
    pub issue: usize,
    /// Log position of a successful completion.
    pub done: Option<usize>,
}

#[derive(Clone, Debug)]
pub struct GuestRequest {
    pub op: GuestOp,
    pub submit: usize,
    /// Log position of a successful completion.
    pub done: Option<usize>,
}

/// The log digested (see the module docs).
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    pub writes: Vec<HostWrite>,
    pub barriers: Vec<Barrier>,
    pub guest: Vec<GuestRequest>,
    /// Events in the log.
    pub len: usize,
}

impl Timeline {
    pub fn new(events: &[Event]) -> Self {
        let mut t = Timeline {
            len: events.len(),
            ..Default::default()
        };
        // Log position of an issue -> index in writes / barriers / guest.
        let mut at = vec![usize::MAX; events.len()];
        for (i, e) in events.iter().enumerate() {
            match e {
                Event::WriteIssue {
                    source,
                    offset,
                    len,
                    data,
                } => {
                    at[i] = t.writes.len();
                    t.writes.push(HostWrite {
                        source: *source,
                        issue: i,
                        done: None,
                        offset: *offset,
                        len: *len,
                        data: data.clone(),
                    });
                }
                Event::WriteDone { issue, done } => {
                    let w = &mut t.writes[at[*issue]];
                    if let Some(n) = done {
                        w.done = Some(i);
                        // fallocate reports 0 bytes for its whole range.
                        if w.data.is_some() {
                            w.len = w.len.min(*n);
                        }
                    }
                }
                Event::SyncIssue { engine } => {
                    at[i] = t.barriers.len();
                    t.barriers.push(Barrier {
                        engine: *engine,
                        issue: i,
                        done: None,
                    });
                }
                Event::SyncDone { issue, ok } => {
                    if *ok {
                        t.barriers[at[*issue]].done = Some(i);
                    }
                }
                Event::GuestSubmit { op } => {
                    at[i] = t.guest.len();
                    t.guest.push(GuestRequest {
                        op: op.clone(),
                        submit: i,
                        done: None,
                    });
                }
                Event::GuestDone { submit, ok } => {
                    if *ok {
                        t.guest[at[*submit]].done = Some(i);
                    }
                }
            }
        }
        t
    }

    /// A crash point: a random completed barrier, then a position from
    /// just after its completion up to the completion of the next one
    /// (or the end of the log). Returns (barrier index, position); no
    /// barrier (a crash before the first) one time in 50.
    pub fn pick_crash(&self, rng: &mut Rng) -> (Option<usize>, usize) {
        let mut done: Vec<(usize, usize)> = self
            .barriers
            .iter()
            .enumerate()
            .filter_map(|(i, b)| b.done.map(|d| (d, i)))
            .collect();
        done.sort_unstable();
        if done.is_empty() || rng.below(50) == 0 {
            let end = done.first().map_or(self.len, |&(d, _)| d);
            return (None, rng.below(end as u64 + 1) as usize);
        }
        let k = rng.below(done.len() as u64) as usize;
        let lo = done[k].0 + 1;
        let hi = done.get(k + 1).map_or(self.len, |&(d, _)| d);
        let c = lo + rng.below((hi.max(lo) - lo + 1) as u64) as usize;
        (Some(done[k].1), c)
    }

    /// Writes that completed before the issue of a barrier that completed
    /// before `c`: the issue position of the latest such barrier.
    pub fn durable_cut(&self, c: usize) -> usize {
        self.barriers
            .iter()
            .filter(|b| b.done.is_some_and(|d| d < c))
            .map(|b| b.issue)
            .max()
            .unwrap_or(0)
    }

    /// The image file after a crash at `c` (see the module docs).
    /// `final_len` is the file's size at the end of the run.
    pub fn crash_image(&self, start: &[u8], final_len: u64, c: usize, rng: &mut Rng) -> CrashImage {
        let cut = self.durable_cut(c);
        let mut durable: Vec<&HostWrite> = self
            .writes
            .iter()
            .filter(|w| w.done.is_some_and(|d| d < cut))
            .collect();
        durable.sort_by_key(|w| w.done);
        let mut maybe: Vec<&HostWrite> = self
            .writes
            .iter()
            .filter(|w| w.issue < c && w.done.is_none_or(|d| d >= cut))
            .collect();
        shuffle(&mut maybe, rng);
        let mut img = CrashImage {
            bytes: start.to_vec(),
            file_len: 0,
            durable: durable.len(),
            maybe: maybe.len(),
            kept: 0,
        };
        for w in durable {
            img.apply(w, 0, w.len);
        }
        for w in maybe {
            match rng.below(3) {
                0 => {}
                1 => {
                    img.apply(w, 0, w.len);
                    img.kept += 1;
                }
                _ => {
                    let mut pos = 0;
                    while pos < w.len {
                        let n = (TEAR - (w.offset + pos) % TEAR).min(w.len - pos);
                        if rng.below(2) == 0 {
                            img.apply(w, pos, n);
                        }
                        pos += n;
                    }
                    img.kept += 1;
                }
            }
        }
        img.file_len = img.bytes.len() as u64;
        if img.file_len < final_len && rng.below(2) == 0 {
            img.file_len = final_len;
        }
        img
    }
}

/// The bytes of a crash image, and how it was made.
pub struct CrashImage {
    pub bytes: Vec<u8>,
    /// The file's size: `bytes`, then a hole up to here.
    pub file_len: u64,
    /// Writes that had to be kept, and writes that might have been.
    pub durable: usize,
    pub maybe: usize,
    /// Of the `maybe` writes, how many were kept whole or in part.
    pub kept: usize,
}

impl CrashImage {
    /// Writes the image to `path` (the tail past `bytes` stays a hole).
    pub fn write_to(&self, path: &std::path::Path) -> std::io::Result<()> {
        std::fs::write(path, &self.bytes)?;
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)?
            .set_len(self.file_len)
    }

    /// Applies bytes `from..from + n` of `w`.
    fn apply(&mut self, w: &HostWrite, from: u64, n: u64) {
        let start = (w.offset + from) as usize;
        let mut end = start + n as usize;
        if w.source == HostSource::PunchHole {
            // KEEP_SIZE: the file does not grow.
            end = end.min(self.bytes.len());
            if start >= end {
                return;
            }
        } else if end > self.bytes.len() {
            self.bytes.resize(end, 0);
        }
        let dst = &mut self.bytes[start..end];
        match &w.data {
            Some(d) => dst.copy_from_slice(&d[from as usize..from as usize + dst.len()]),
            None => dst.fill(0),
        }
    }
}

fn shuffle<T>(v: &mut [T], rng: &mut Rng) {
    for i in (1..v.len()).rev() {
        v.swap(i, rng.below(i as u64 + 1) as usize);
    }
}
