//! The VMM.
