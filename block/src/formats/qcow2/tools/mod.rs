//! The image tools' operations on qcow2 (`ch-img` verbs and what the
//! storage daemon's exports may do to an image): each a type over the
//! image's locked state, behind the tool capabilities of
//! `crate::formats::tools`.
//!
//! - `capabilities`: those capabilities for [`super::Qcow2Image`], each a
//!   thin front over the types below;
//! - `snapshot_ops` (with the tree walks of `tree`): internal snapshots;
//!   `snapshot_view`: reading one in place of the active disk
//!   (`convert -l`);
//! - `resize`; `backing_rewrite` (`rebase -u`, `make_empty`);
//! - `amend` (with `zero_expand` and `refcount_layout`, which `check`'s
//!   repairs use too);
//! - `undo`: a failed tool operation puts the file back;
//! - `create` (new images with qemu-img's defaults, from the options
//!   `new_image` checks) and `measure` (`ch-img measure -O qcow2`).
//!
//! A tool's request enters through a capability; it leaves as metadata
//! changes through `metadata::meta`'s operations (recorded by `undo`).

pub(crate) mod amend;
pub(crate) mod backing_rewrite;
pub(crate) mod capabilities;
pub(crate) mod create;
pub(crate) mod measure;
pub(crate) mod new_image;
pub(crate) mod refcount_layout;
pub(crate) mod resize;
pub(crate) mod snapshot_ops;
pub(crate) mod snapshot_view;
pub(crate) mod tree;
pub(crate) mod undo;
pub(crate) mod zero_expand;
