//! The request sizes the export asks the kernel for at FUSE_INIT
//! ([`super::init`]), and the buffers that follow from them: what a
//! /dev/fuse read ([`super::devfuse`]) and a ring entry's payload
//! ([`super::uring_payload`]) must hold.

/// Largest WRITE (and READ) the kernel sends us: FUSE_MAX_PAGES pages.
pub const MAX_PAGES: u16 = 32;
pub const MAX_WRITE: u32 = MAX_PAGES as u32 * 4096;
/// A /dev/fuse read needs room for the header, `fuse_write_in` and the
/// largest write.
pub const DEV_BUFFER_SIZE: usize = MAX_WRITE as usize + 4096;
