//! Creating images (`ch-img create`), with qemu-img's options and defaults.
//!
//! [`CreateOptions`] (user input) enter; the format they name creates the
//! image (its driver in the registry checks every option, and each error
//! names the option); on an NBD export, the export becomes a raw image
//! (`formats::nbd_image`).
//!
//! A new image never replaces a file someone uses: the file is locked
//! like a writer before it is truncated (an image a VMM or qemu holds is
//! refused), and it must not be one of [`CreateOptions::sources`] (the
//! files the command reads, compared by device and inode, so another name,
//! a symbolic link or a hard link to a source is refused too).

use crate::error::BlockError;
pub use crate::formats::create_options::CreateOptions;
use crate::formats::nbd_image::create_on_export;
use crate::formats::registry::FORMATS;
pub use crate::new_file::FileIdentity;
use block_engines::nbd::is_nbd_path;

/// Creates the image; fails if the options are inconsistent (the message
/// names the option). When writing the new file fails (say, ENOSPC while
/// preallocating), the partial file is removed.
pub fn create_image(opts: &CreateOptions) -> Result<(), BlockError> {
    if is_nbd_path(&opts.path) {
        return create_on_export(opts, &FORMATS);
    }
    let r = match FORMATS.driver(opts.format) {
        Some(driver) => (driver.create)(opts, &FORMATS),
        None => Err(opts.invalid("format", format!("give {}", FORMATS.names_or()))),
    };
    if let Err(e) = &r {
        // Only errors after the file was opened and truncated as ours; a
        // refused open (locked, bad options) leaves the file alone.
        if matches!(
            e,
            BlockError::Preallocate { .. }
                | BlockError::MetadataWrite { .. }
                | BlockError::Flush(_)
        ) {
            let _ = std::fs::remove_file(&opts.path);
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::new_file::open_for_create;
    use std::fs::File;

    /// A copy of the creating descriptor that outlives the create (as a
    /// child another thread forked holds one until it execs) must not
    /// keep the new image locked.
    #[test]
    fn a_created_image_is_unlocked_while_a_copy_of_its_descriptor_lives() {
        let dir = std::env::temp_dir().join(format!("create-unlock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("new.img");
        let (file, lock) = open_for_create(&path, &[]).unwrap();
        let forked_copy = file.try_clone().unwrap();
        drop(lock);
        drop(file);
        let again = File::options().read(true).write(true).open(&path).unwrap();
        crate::lock::lock_image(&again, &path, crate::lock::LockMode::Writer)
            .expect("the create's lock is gone");
        drop(forked_copy);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A source under another name (here a hard link) is refused after
    /// the lock and before the truncation: its bytes stay.
    #[test]
    fn a_source_is_never_truncated() {
        let dir = std::env::temp_dir().join(format!("create-source-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let source = dir.join("source.img");
        std::fs::write(&source, [7u8; 4096]).unwrap();
        let link = dir.join("link.img");
        std::fs::hard_link(&source, &link).unwrap();
        let id = FileIdentity::of_path(&source).unwrap();
        let err = open_for_create(&link, &[id]).unwrap_err();
        assert!(matches!(err, BlockError::OverwritesSource { .. }), "{err}");
        assert_eq!(std::fs::read(&source).unwrap(), vec![7u8; 4096]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
