//! What `ch-img amend` asks of a format: the image options to change in
//! place ([`Amendment`]) and how far the work is ([`AmendStep`]).
//!
//! The command line's `-o` options enter (parsed by the tool); the format
//! checks the whole amendment against the image before it changes
//! anything ([`crate::formats::Amendable::check_amendment`]), refusing
//! with qemu-img's message, then applies it
//! ([`crate::formats::Amendable::amend`]). The virtual size is changed by
//! the tool through the image's resizer; it is part of the amendment only
//! because a version downgrade checks the snapshots against it.

/// The options an amend changes; `None` keeps the image's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Amendment {
    /// qcow2 version: 2 (`compat=0.10`) or 3 (`compat=1.1`).
    pub version: Option<u32>,
    pub lazy_refcounts: Option<bool>,
    /// Refcount width in bits (a power of two up to 64, checked here).
    pub refcount_bits: Option<u64>,
    /// `backing_file` and `backing_fmt` as given (both `None` when
    /// neither was): they must name what the image already has.
    pub backing: Option<(Option<String>, Option<String>)>,
    /// The external data file's name (only for images that have one).
    pub data_file: Option<String>,
    pub data_file_raw: Option<bool>,
    /// The virtual size the image will have once the tool resized it.
    pub size: Option<u64>,
}

/// Which part of an amend a progress report is about, in the order the
/// parts run (qemu's order: upgrade, refcount width, downgrade).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AmendStep {
    Upgrading,
    ChangingRefcountWidth,
    Downgrading,
}

/// Reports `done` of `total` units of the work of `step`.
pub type AmendProgress<'a> = &'a mut dyn FnMut(AmendStep, u64, u64);
