//! Metadata contexts, server side: which ones an export offers, which a
//! client's `NBD_OPT_LIST_META_CONTEXT` or `NBD_OPT_SET_META_CONTEXT`
//! queries match, and the ids they get. Plain data: the handshake
//! (`negotiate`) reads the queries off the wire and hands each to
//! [`Selection::query`].
//!
//! An export offers `base:allocation` and, for every dirty bitmap it
//! names, `qemu:dirty-bitmap:NAME` (QEMU's `docs/interop/nbd.rst`). The
//! queries understood are QEMU's:
//!
//! | query | LIST | SET |
//! | --- | --- | --- |
//! | `base:allocation`, `qemu:dirty-bitmap:NAME` (offered) | that context | that context |
//! | `base:` | every `base:` context | nothing |
//! | `qemu:` | every `qemu:` context | nothing |
//! | `qemu:dirty-bitmap:` | every bitmap context | nothing |
//! | anything else (an unknown namespace or leaf, a bitmap not offered) | ignored | ignored |
//!
//! A LIST without queries lists every context. Context ids follow QEMU's
//! numbering (0 for `base:allocation`, 2 + n for the export's bitmap n;
//! QEMU gives 1 to `qemu:allocation-depth`, which is not offered here);
//! LIST replies carry id 0, as the protocol asks.

use crate::wire::consts::{BASE_ALLOCATION, QEMU_DIRTY_BITMAP};

/// One context an export offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetaContext {
    /// `base:allocation`: holes and zeroes.
    BaseAllocation,
    /// `qemu:dirty-bitmap:NAME` for the export's bitmap number `n` (in
    /// the order the server listed them).
    DirtyBitmap(u32),
}

/// The id of the first bitmap context (QEMU's `NBD_META_ID_DIRTY_BITMAP`).
const FIRST_BITMAP_ID: u32 = 2;

impl MetaContext {
    /// The id this server gives the context in SET replies and in
    /// BLOCK_STATUS chunks.
    pub fn id(self) -> u32 {
        match self {
            MetaContext::BaseAllocation => 0,
            MetaContext::DirtyBitmap(n) => FIRST_BITMAP_ID + n,
        }
    }

    /// The context's name, given the names of the export's bitmaps.
    pub fn name(self, bitmaps: &[String]) -> String {
        match self {
            MetaContext::BaseAllocation => BASE_ALLOCATION.to_string(),
            MetaContext::DirtyBitmap(n) => {
                format!("{QEMU_DIRTY_BITMAP}{}", bitmaps[n as usize])
            }
        }
    }
}

/// The contexts one LIST or SET option matched so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Selection {
    base_allocation: bool,
    /// One flag per offered bitmap.
    bitmaps: Vec<bool>,
}

impl Selection {
    /// Nothing selected, for an export offering `bitmaps` bitmaps.
    pub fn none(bitmaps: usize) -> Selection {
        Selection {
            base_allocation: false,
            bitmaps: vec![false; bitmaps],
        }
    }

    /// Every context (a LIST without queries).
    pub fn all(bitmaps: usize) -> Selection {
        Selection {
            base_allocation: true,
            bitmaps: vec![true; bitmaps],
        }
    }

    /// Adds what `query` matches (see the module docs); `list` is true for
    /// `NBD_OPT_LIST_META_CONTEXT`, where an empty leaf is a wildcard.
    pub fn query(&mut self, query: &[u8], list: bool, bitmaps: &[String]) {
        if let Some(leaf) = query.strip_prefix(b"base:") {
            let leaf_of_allocation = &BASE_ALLOCATION.as_bytes()[b"base:".len()..];
            if leaf == leaf_of_allocation || (list && leaf.is_empty()) {
                self.base_allocation = true;
            }
            return;
        }
        let Some(rest) = query.strip_prefix(b"qemu:") else {
            return;
        };
        if rest.is_empty() {
            if list {
                self.bitmaps.iter_mut().for_each(|b| *b = true);
            }
            return;
        }
        let Some(name) = rest.strip_prefix(&b"dirty-bitmap:"[..]) else {
            return;
        };
        if name.is_empty() {
            if list {
                self.bitmaps.iter_mut().for_each(|b| *b = true);
            }
            return;
        }
        if let Some(i) = bitmaps.iter().position(|b| b.as_bytes() == name) {
            self.bitmaps[i] = true;
        }
    }

    /// The selected contexts, `base:allocation` first, then the bitmaps
    /// in the export's order.
    pub fn contexts(&self) -> Vec<MetaContext> {
        let base = self.base_allocation.then_some(MetaContext::BaseAllocation);
        let bitmaps = self
            .bitmaps
            .iter()
            .enumerate()
            .filter(|(_, on)| **on)
            .map(|(i, _)| MetaContext::DirtyBitmap(i as u32));
        base.into_iter().chain(bitmaps).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn select(queries: &[&str], list: bool) -> Vec<String> {
        let bitmaps = ["b0".to_string(), "b1".to_string()];
        let mut s = Selection::none(bitmaps.len());
        for q in queries {
            s.query(q.as_bytes(), list, &bitmaps);
        }
        s.contexts().iter().map(|c| c.name(&bitmaps)).collect()
    }

    #[test]
    fn queries_match_as_qemu_matches_them() {
        let all = [
            "base:allocation",
            "qemu:dirty-bitmap:b0",
            "qemu:dirty-bitmap:b1",
        ];
        assert_eq!(select(&["base:"], true), ["base:allocation"]);
        assert!(select(&["base:"], false).is_empty());
        assert_eq!(select(&["qemu:"], true), all[1..]);
        assert!(select(&["qemu:"], false).is_empty());
        assert_eq!(select(&["qemu:dirty-bitmap:"], true), all[1..]);
        assert!(select(&["qemu:dirty-bitmap:"], false).is_empty());
        for list in [true, false] {
            assert_eq!(
                select(&["qemu:dirty-bitmap:b1", "base:allocation"], list),
                ["base:allocation", "qemu:dirty-bitmap:b1"]
            );
            // Unknown namespaces, leaves and bitmaps are ignored.
            assert!(select(
                &[
                    "",
                    "base",
                    "base:allocationx",
                    "qemu:allocation-depth",
                    "qemu:dirty-bitmap:b2",
                    "qemu:dirty-bitmap:b0x",
                    "x-foo:bar",
                    "nbd-server:",
                ],
                list
            )
            .is_empty());
        }
    }

    #[test]
    fn ids_follow_qemus_numbering() {
        assert_eq!(MetaContext::BaseAllocation.id(), 0);
        assert_eq!(MetaContext::DirtyBitmap(0).id(), 2);
        assert_eq!(MetaContext::DirtyBitmap(3).id(), 5);
        let every = Selection::all(2).contexts();
        assert_eq!(every.len(), 3);
    }
}
