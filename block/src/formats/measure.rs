//! `ch-img measure` as a format capability: how many bytes a new image
//! of a format would take, for a disk of a size or to hold a copy of an
//! opened image. A format's driver checks the new image's options and
//! returns a [`Measure`]; it measures, and a [`Measurement`] leaves with
//! qemu-img's three numbers.

use super::format::Format;
use crate::error::BlockError;

/// What qemu-img measure prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Measurement {
    pub required: u64,
    pub fully_allocated: u64,
    /// Persistent bitmaps a copy would carry (qcow2 v3 from qcow2 v3).
    pub bitmaps: Option<u64>,
}

/// Why a measurement failed.
#[derive(Debug)]
pub enum MeasureError {
    /// The asked size or the input does not fit the format, in qemu-img's
    /// words.
    Refused(String),
    /// The input's block status at `offset` could not be read.
    BlockStatus { offset: u64, source: BlockError },
}

/// A new image's options, checked, ready to measure.
pub trait Measure {
    /// Measures a new image of the options' size (`input` `None`), or
    /// one holding a copy of `input`.
    fn measure(&self, input: Option<&dyn Format>) -> Result<Measurement, MeasureError>;
}
