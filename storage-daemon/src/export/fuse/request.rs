//! One FUSE request as a transport hands it over: its header, its first
//! argument and its data, split from a /dev/fuse read
//! ([`FuseRequest::from_dev_buffer`]) or taken from a ring entry's header
//! and payload buffers (with [`InPlace`], where its I/O may happen in the
//! entry's payload). The handlers read requests; they answer with
//! `super::reply`'s types.

use std::sync::Arc;

use block::request::GuestSegment;
use block::IoMemory;
use vm_memory::{GuestAddress, GuestMemoryMmap};

use super::abi::{opcode, InHeader, Pod, ReadWriteIn};

/// One FUSE request as a transport received it.
pub struct FuseRequest<'a> {
    pub header: InHeader,
    /// The opcode's first argument (`fuse_write_in`, ...), maybe longer.
    pub arg: &'a [u8],
    /// What follows the first argument (write data).
    pub data: &'a [u8],
    /// Where a READ/WRITE may do its I/O in place (ring entries: the
    /// payload buffer `data` lies in); None: in a buffer of its own.
    pub in_place: Option<InPlace>,
}

/// A ring entry's payload buffer as request memory: the write data is
/// already at its start, and read data is left there for the reply
/// (`Reply::Data` of [`IoMemory::Guest`]), with no copy either way.
pub struct InPlace {
    pub mem: Arc<GuestMemoryMmap>,
    pub addr: GuestAddress,
    pub capacity: usize,
}

impl InPlace {
    /// The first `len` bytes of the buffer; None when they do not fit.
    pub fn memory(&self, len: usize) -> Option<IoMemory> {
        (len <= self.capacity).then(|| IoMemory::Guest {
            mem: self.mem.clone(),
            segments: vec![GuestSegment {
                addr: self.addr,
                len: len as u32,
            }],
        })
    }
}

/// Why a buffer is not a FUSE request.
#[derive(Debug, PartialEq, Eq)]
pub enum ParseError {
    /// Shorter than a `fuse_in_header`: nobody to answer.
    NoHeader,
    /// The header's length disagrees with the bytes received.
    BadLength(InHeader),
}

/// Size of the first argument of the opcodes whose data follows it.
fn first_arg_size(op: u32) -> usize {
    match op {
        opcode::WRITE | opcode::READ => std::mem::size_of::<ReadWriteIn>(),
        _ => 0,
    }
}

impl<'a> FuseRequest<'a> {
    /// Splits one /dev/fuse read: header, first argument, data.
    pub fn from_dev_buffer(buf: &'a [u8]) -> Result<Self, ParseError> {
        let header = InHeader::read_from(buf).ok_or(ParseError::NoHeader)?;
        let header_len = std::mem::size_of::<InHeader>();
        if header.len as usize != buf.len() {
            return Err(ParseError::BadLength(header));
        }
        let rest = &buf[header_len..];
        let split = first_arg_size(header.opcode).min(rest.len());
        Ok(FuseRequest {
            header,
            arg: rest,
            data: &rest[split..],
            in_place: None,
        })
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A /dev/fuse read of one request: header, argument, data.
    pub(in crate::export::fuse) fn dev_buffer(op: u32, arg: &[u8], data: &[u8]) -> Vec<u8> {
        let len = 40 + arg.len() + data.len();
        let h = InHeader {
            len: len as u32,
            opcode: op,
            unique: 9,
            nodeid: 1,
            ..Default::default()
        };
        [h.as_bytes(), arg, data].concat()
    }

    #[test]
    fn dev_buffer_splits_header_argument_and_data() {
        let w = ReadWriteIn {
            offset: 4096,
            size: 3,
            ..Default::default()
        };
        let buf = dev_buffer(opcode::WRITE, w.as_bytes(), b"abc");
        let req = FuseRequest::from_dev_buffer(&buf).unwrap();
        assert_eq!(req.header.opcode, opcode::WRITE);
        assert_eq!(ReadWriteIn::read_from(req.arg).unwrap().offset, 4096);
        assert_eq!(req.data, b"abc");
    }

    #[test]
    fn bad_lengths_are_refused() {
        assert_eq!(
            FuseRequest::from_dev_buffer(&[0u8; 10]).err(),
            Some(ParseError::NoHeader)
        );
        let mut buf = dev_buffer(opcode::GETATTR, &[0; 16], &[]);
        buf.push(0);
        assert!(matches!(
            FuseRequest::from_dev_buffer(&buf),
            Err(ParseError::BadLength(h)) if h.unique == 9
        ));
    }
}
