//! Walks a descriptor chain (following an indirect table) into a bounded
//! list of [`ChainDescriptor`]s, noting whether the walk ended properly.
//!
//! Data enters as a [`virtio_queue::DescriptorChain`]; it leaves as a
//! [`WalkedChain`] the request parser reads. The walk is bounded by the
//! queue or indirect table size, so a loop ends, and it keeps at most a
//! given number of descriptors, so a long chain cannot make it allocate.

use std::ops::Deref;

use virtio_queue::DescriptorChain;
use vm_memory::GuestMemory;

/// One descriptor of a chain, after indirect tables have been followed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainDescriptor {
    pub addr: u64,
    pub len: u32,
    /// Device-writable (VIRTQ_DESC_F_WRITE).
    pub writable: bool,
}

/// The descriptors of one chain, as far as they could be walked.
#[derive(Clone, Debug, Default)]
pub struct WalkedChain {
    /// The first descriptors (at most the keep limit given to the walk).
    pub descriptors: Vec<ChainDescriptor>,
    /// How many descriptors the chain has in total.
    pub total: usize,
    /// The final descriptor (the one holding the status byte).
    pub last: Option<ChainDescriptor>,
    /// False when the walk stopped early: a loop, an indirect table inside
    /// an indirect table, a malformed table, or a descriptor outside
    /// guest memory.
    pub complete: bool,
}

impl WalkedChain {
    /// Builds a complete chain from a list (tests and fuzzing).
    pub fn from_descriptors(descriptors: Vec<ChainDescriptor>) -> Self {
        WalkedChain {
            total: descriptors.len(),
            last: descriptors.last().copied(),
            complete: !descriptors.is_empty(),
            descriptors,
        }
    }
}

/// Walks a chain, keeping at most `keep` descriptors but counting all. The
/// walk is bounded by the queue (or indirect table) size, so a loop ends.
pub fn walk_chain<M>(chain: DescriptorChain<M>, keep: usize) -> WalkedChain
where
    M: Deref,
    M::Target: GuestMemory,
{
    let mut walked = WalkedChain::default();
    walk_chain_into(chain, keep, &mut walked);
    walked
}

/// Like [`walk_chain`], but refills `walked` (reusing its allocation, so a
/// queue worker walks chains without allocating).
pub fn walk_chain_into<M>(chain: DescriptorChain<M>, keep: usize, walked: &mut WalkedChain)
where
    M: Deref,
    M::Target: GuestMemory,
{
    walked.descriptors.clear();
    walked.total = 0;
    walked.last = None;
    let mut ended = false;
    for desc in chain {
        let d = ChainDescriptor {
            addr: desc.addr().0,
            len: desc.len(),
            writable: desc.is_write_only(),
        };
        if walked.descriptors.len() < keep {
            walked.descriptors.push(d);
        }
        walked.total += 1;
        walked.last = Some(d);
        // The iterator stops silently on errors; a chain ended well only if
        // its final descriptor has no NEXT flag.
        ended = !desc.has_next();
    }
    walked.complete = ended && walked.total > 0;
}
