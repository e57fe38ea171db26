//! What an image without a tool capability answers: a raw file and an
//! NBD export have no internal snapshots, backing file, compressed
//! clusters, persistent bitmaps or amendable options. Each refusal is a
//! [`BlockError::CannotDo`] naming the image (its path, or the export's
//! URI), in qemu-img's words where qemu-img has them, so every front end
//! prints the same reason and an API can tell the asker's mistake from a
//! failure ([`BlockError::is_callers_mistake`]).
//!
//! `raw/image.rs` and `nbd_image.rs` call these from their capability traits
//! ([`super::tools`]); nothing here changes an image.

use super::dirty_bits::BitmapAction;
use crate::error::BlockError;

/// The image that lacks the capabilities: `image` names it (path or
/// URI), `format` its kind in messages ("raw", "raw (over NBD)").
pub(crate) struct Lacking {
    pub image: String,
    pub format: &'static str,
}

impl Lacking {
    fn cannot(&self, reason: String) -> BlockError {
        BlockError::CannotDo {
            image: self.image.clone(),
            reason,
        }
    }

    /// Internal snapshots (qemu-img's words for `snapshot -a`).
    pub fn snapshots(&self) -> BlockError {
        self.cannot("Block driver does not support snapshots".into())
    }

    /// Reading an internal snapshot in place of the disk (qemu-img's
    /// words for `convert -l`).
    pub fn snapshot_view(&self) -> BlockError {
        self.cannot(format!(
            "Block format '{}' used by device '' does not support temporarily loading internal snapshots",
            // An export is a raw image to qemu too.
            if self.format.starts_with("raw") {
                "raw"
            } else {
                self.format
            }
        ))
    }

    /// A backing file to point at, or to commit into and empty.
    pub fn backing_file(&self) -> BlockError {
        self.cannot(format!("{} images have no backing file", self.format))
    }

    /// Compressed clusters (qemu-img's words for `convert -c`).
    pub fn compression(&self) -> BlockError {
        self.cannot("Compression not supported for this file format".into())
    }

    /// Option amendment (qemu-img's words; the raw format driver is
    /// what qemu-img names for an export too).
    pub fn amendment(&self) -> BlockError {
        BlockError::Refused("Format driver 'raw' does not support option amendment".into())
    }

    /// Reading persistent bitmap `name`: there is none.
    pub fn read_bitmap(&self, name: &str) -> BlockError {
        BlockError::Refused(format!("Dirty bitmap '{name}' not found"))
    }

    /// Changing persistent bitmap `name`: the first action fails, as in
    /// qemu-img ("add" cannot store one, the others find none); no
    /// actions succeed.
    pub fn change_bitmap(&self, name: &str, actions: &[BitmapAction]) -> Result<(), BlockError> {
        let Some(first) = actions.first() else {
            return Ok(());
        };
        let why = match first {
            BitmapAction::Add { .. } => format!(
                "Can't store persistent bitmaps to {}: Operation not supported",
                self.image
            ),
            _ => format!("Dirty bitmap '{name}' not found"),
        };
        let message = format!("Operation {} on bitmap {name} failed: {why}", first.name());
        Err(match first {
            BitmapAction::Add { .. } => self.cannot(message),
            _ => BlockError::Refused(message),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_name_the_image_and_are_the_askers_mistake() {
        let l = Lacking {
            image: "nbd://h:10809/e".into(),
            format: "raw (over NBD)",
        };
        for e in [l.snapshots(), l.backing_file(), l.compression()] {
            assert!(e.is_callers_mistake(), "{e}");
            assert!(e.to_string().starts_with("nbd://h:10809/e: "), "{e}");
        }
        let add = l
            .change_bitmap("b0", &[BitmapAction::Add { granularity: None }])
            .unwrap_err();
        assert!(add.is_callers_mistake());
        assert!(add.to_string().contains(
            "Operation add on bitmap b0 failed: Can't store persistent bitmaps to nbd://h:10809/e"
        ));
        assert!(l.change_bitmap("b0", &[]).is_ok());
    }
}
