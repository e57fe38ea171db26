//! What the guest may read back after a crash: per sector, the set of
//! acceptable values.
//!
//! A guest write (or discard / write-zeroes, which read as zeroes) that
//! completed before the submission of a FLUSH that completed before the
//! crash must be durable: its sector holds its value unless a request to
//! the same sector was still in flight with it or came after it (then that
//! request's value is acceptable too). A request superseded by a durable
//! one (submitted after it completed) may no longer show. Sectors with
//! no durable request hold their first value or that of any request
//! submitted before the crash: never bytes nobody wrote.
//!
//! The timeline's guest requests and the disk's first contents enter; a
//! verdict on the bytes read back from a crash image leaves.

use super::crash::{GuestRequest, Timeline};
use super::record::GuestOp;

pub const SECTOR: u64 = 512;

/// The guest side of a timeline (see the module docs).
pub struct Oracle<'a> {
    guest: &'a [GuestRequest],
    initial: &'a [u8],
    /// Per sector: indices into `guest` of the requests covering it.
    touching: Vec<Vec<u32>>,
}

impl<'a> Oracle<'a> {
    pub fn new(t: &'a Timeline, initial: &'a [u8]) -> Self {
        let mut touching = vec![Vec::new(); initial.len() / SECTOR as usize];
        for (i, r) in t.guest.iter().enumerate() {
            let (offset, len) = match &r.op {
                GuestOp::Write { offset, data } => (*offset, data.len() as u64),
                GuestOp::Zero { offset, len } => (*offset, *len),
                GuestOp::Flush => continue,
            };
            assert!(
                offset % SECTOR == 0 && len % SECTOR == 0,
                "guest requests are sector-aligned"
            );
            for s in offset / SECTOR..(offset + len) / SECTOR {
                touching[s as usize].push(i as u32);
            }
        }
        Oracle {
            guest: &t.guest,
            initial,
            touching,
        }
    }

    /// The value request `r` gives sector `s`.
    fn value<'r>(&self, r: &'r GuestRequest, s: usize) -> Option<&'r [u8]> {
        let at = s as u64 * SECTOR;
        match &r.op {
            GuestOp::Write { offset, data } => {
                let from = (at - offset) as usize;
                Some(&data[from..from + SECTOR as usize])
            }
            _ => None,
        }
    }

    /// Whether `got` equals what `r` gives sector `s` (zeroes when
    /// `r` writes none).
    fn matches(&self, r: &GuestRequest, s: usize, got: &[u8]) -> bool {
        match self.value(r, s) {
            Some(v) => v == got,
            None => got.iter().all(|&b| b == 0),
        }
    }

    /// Checks the virtual disk `got` read back from a crash image at
    /// log position `c`. Counts the sectors that had to be durable;
    /// the error names the first sector that breaks the rules.
    pub fn check(&self, c: usize, got: &[u8]) -> Result<usize, String> {
        if got.len() != self.initial.len() {
            return Err(format!(
                "read back {} bytes, the disk has {}",
                got.len(),
                self.initial.len()
            ));
        }
        // Requests that completed before this are durable.
        let flush_cut = self
            .guest
            .iter()
            .filter(|r| matches!(r.op, GuestOp::Flush) && r.done.is_some_and(|d| d < c))
            .map(|r| r.submit)
            .max()
            .unwrap_or(0);
        let sec = SECTOR as usize;
        let mut must = 0;
        for (s, list) in self.touching.iter().enumerate() {
            let have = &got[s * sec..(s + 1) * sec];
            let submitted = list
                .iter()
                .map(|&i| &self.guest[i as usize])
                .filter(|r| r.submit < c);
            let durable: Vec<&GuestRequest> = submitted
                .clone()
                .filter(|r| r.done.is_some_and(|d| d < flush_cut))
                .collect();
            if durable.is_empty() {
                if have == &self.initial[s * sec..(s + 1) * sec]
                    || submitted.clone().any(|r| self.matches(r, s, have))
                {
                    continue;
                }
                return Err(format!(
                    "sector {s} (byte {:#x}) holds bytes that neither its first contents nor \
                     any request submitted before the crash wrote",
                    s * sec
                ));
            }
            must += 1;
            let superseded = |r: &GuestRequest| {
                let done = r.done.unwrap_or(usize::MAX);
                durable.iter().any(|d| d.submit > done)
            };
            if submitted
                .clone()
                .any(|r| !superseded(r) && self.matches(r, s, have))
            {
                continue;
            }
            let last = durable
                .iter()
                .max_by_key(|r| r.done)
                .map(|r| describe(r))
                .unwrap_or_default();
            let holds = if have == &self.initial[s * sec..(s + 1) * sec] {
                "its first contents".to_string()
            } else if let Some(r) = submitted.clone().find(|r| self.matches(r, s, have)) {
                format!("the older {}", describe(r))
            } else {
                "bytes no request wrote".to_string()
            };
            return Err(format!(
                "LOST ACKNOWLEDGED WRITE: sector {s} (byte {:#x}) must hold the flushed {last} \
                 (flushed before log position {flush_cut}), but holds {holds}",
                s * sec
            ));
        }
        Ok(must)
    }
}

fn describe(r: &GuestRequest) -> String {
    let what = match &r.op {
        GuestOp::Write { offset, data } => format!("write of {} bytes at {offset:#x}", data.len()),
        GuestOp::Zero { offset, len } => {
            format!("discard/write-zeroes of {len} bytes at {offset:#x}")
        }
        GuestOp::Flush => "flush".into(),
    };
    format!(
        "{what} (submitted at log position {}, completed at {:?})",
        r.submit, r.done
    )
}
