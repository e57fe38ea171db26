//! The persistent bitmaps of an image an owner records guest writes in
//! (the VMM's live bitmaps): all of them loaded at once when it opens the
//! image, all of them stored at once when it marks them in use and when
//! it closes the image.
//!
//! [`BitmapEditor::load_all`] returns every bitmap with its flags and, for
//! the consistent ones, its bits; [`BitmapEditor::store_all`] makes a
//! given list the image's bitmaps the way `bitmap_write` stores a change
//! (new tables and directory, one header write, then the old clusters
//! freed), keeping the stored tables of bitmaps whose bits are not given.

use super::bitmap_directory::{FLAG_AUTO, FLAG_IN_USE, MAX_BITMAPS};
use super::bitmap_write::{BitmapEditor, Working};
use crate::error::BlockError;
use crate::formats::dirty_bits::PersistedBitmap;
use crate::formats::qcow2::on_disk::header_cluster::current_header;

impl BitmapEditor<'_> {
    /// Every bitmap of the image (see the module docs).
    pub fn load_all(&self) -> Result<Vec<PersistedBitmap>, BlockError> {
        let header = current_header(self.meta)?;
        let store = self.load_bitmaps(&header)?;
        store
            .bitmaps
            .iter()
            .map(|b| {
                let in_use = b.entry.flags & FLAG_IN_USE != 0;
                Ok(PersistedBitmap {
                    name: b.entry.name.clone(),
                    granularity: 1 << b.entry.granularity_bits,
                    recording: b.entry.flags & FLAG_AUTO != 0,
                    in_use,
                    bits: if in_use {
                        None
                    } else {
                        Some(self.read_bits(b)?)
                    },
                })
            })
            .collect()
    }

    /// Makes `wanted` the image's bitmaps (see the module docs).
    pub fn store_all(&mut self, wanted: &[PersistedBitmap]) -> Result<(), BlockError> {
        if wanted.len() > MAX_BITMAPS as usize {
            return Err(BlockError::Refused(format!(
                "{} persistent bitmaps, more than qcow2's {MAX_BITMAPS}",
                wanted.len()
            )));
        }
        self.meta.flush_dirty()?;
        self.meta.barrier()?;
        let header = current_header(self.meta)?;
        let old = self.load_bitmaps(&header)?;
        if wanted.is_empty() && old.bitmaps.is_empty() {
            // Nothing to store and nothing to drop: the header stays.
            return Ok(());
        }
        let mut bitmaps = Vec::with_capacity(wanted.len());
        for w in wanted {
            let stored = old.find(&w.name).cloned();
            if w.bits.is_none() && stored.is_none() {
                return Err(self.meta.invalid(format!(
                    "bitmap '{}' has no bits and is not in the image",
                    w.name
                )));
            }
            let granularity = match (&w.bits, &stored) {
                (Some(bits), _) => bits.granularity,
                (None, Some(s)) => 1 << s.entry.granularity_bits,
                (None, None) => unreachable!("refused above"),
            };
            if !granularity.is_power_of_two() || !(9..=31).contains(&granularity.trailing_zeros()) {
                return Err(BlockError::Refused(format!(
                    "bitmap '{}': a qcow2 image cannot store a granularity of {granularity} bytes",
                    w.name
                )));
            }
            let mut flags = 0;
            if w.recording {
                flags |= FLAG_AUTO;
            }
            if w.in_use {
                flags |= FLAG_IN_USE;
            }
            bitmaps.push(Working {
                name: w.name.clone(),
                flags,
                granularity_bits: granularity.trailing_zeros() as u8,
                stored,
                bits: w.bits.clone(),
            });
        }
        self.replace(&header, &old, &bitmaps)
    }
}
