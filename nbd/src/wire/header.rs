//! The fixed-size headers of both phases.

use super::bytes::{be16, be32, be64};
use super::consts::{
    IHAVEOPT, REPLY_MAGIC, REQUEST_MAGIC, SIMPLE_REPLY_MAGIC, STRUCTURED_REPLY_MAGIC,
};

/// An option the client sends during the handshake; `len` bytes of data
/// follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionHeader {
    pub magic: u64,
    pub option: u32,
    pub len: u32,
}

impl OptionHeader {
    pub const SIZE: usize = 16;

    pub fn new(option: u32, len: u32) -> Self {
        OptionHeader {
            magic: IHAVEOPT,
            option,
            len,
        }
    }

    pub fn decode(b: &[u8]) -> Self {
        OptionHeader {
            magic: be64(b, 0),
            option: be32(b, 8),
            len: be32(b, 12),
        }
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.magic.to_be_bytes());
        out.extend_from_slice(&self.option.to_be_bytes());
        out.extend_from_slice(&self.len.to_be_bytes());
    }
}

/// A server's reply to an option; `len` bytes of data follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionReplyHeader {
    pub magic: u64,
    pub option: u32,
    pub reply: u32,
    pub len: u32,
}

impl OptionReplyHeader {
    pub const SIZE: usize = 20;

    pub fn new(option: u32, reply: u32, len: u32) -> Self {
        OptionReplyHeader {
            magic: REPLY_MAGIC,
            option,
            reply,
            len,
        }
    }

    pub fn decode(b: &[u8]) -> Self {
        OptionReplyHeader {
            magic: be64(b, 0),
            option: be32(b, 8),
            reply: be32(b, 12),
            len: be32(b, 16),
        }
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.magic.to_be_bytes());
        out.extend_from_slice(&self.option.to_be_bytes());
        out.extend_from_slice(&self.reply.to_be_bytes());
        out.extend_from_slice(&self.len.to_be_bytes());
    }
}

/// A transmission-phase request; a WRITE's `len` bytes of data follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    pub magic: u32,
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub len: u32,
}

impl RequestHeader {
    pub const SIZE: usize = 28;

    pub fn new(kind: u16, flags: u16, cookie: u64, offset: u64, len: u32) -> Self {
        RequestHeader {
            magic: REQUEST_MAGIC,
            flags,
            kind,
            cookie,
            offset,
            len,
        }
    }

    pub fn decode(b: &[u8]) -> Self {
        RequestHeader {
            magic: be32(b, 0),
            flags: be16(b, 4),
            kind: be16(b, 6),
            cookie: be64(b, 8),
            offset: be64(b, 16),
            len: be32(b, 24),
        }
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.magic.to_be_bytes());
        out.extend_from_slice(&self.flags.to_be_bytes());
        out.extend_from_slice(&self.kind.to_be_bytes());
        out.extend_from_slice(&self.cookie.to_be_bytes());
        out.extend_from_slice(&self.offset.to_be_bytes());
        out.extend_from_slice(&self.len.to_be_bytes());
    }
}

/// A simple reply; a successful READ's data follows (the client knows
/// its length from the request).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimpleReplyHeader {
    pub magic: u32,
    pub error: u32,
    pub cookie: u64,
}

impl SimpleReplyHeader {
    pub const SIZE: usize = 16;

    pub fn new(error: u32, cookie: u64) -> Self {
        SimpleReplyHeader {
            magic: SIMPLE_REPLY_MAGIC,
            error,
            cookie,
        }
    }

    pub fn decode(b: &[u8]) -> Self {
        SimpleReplyHeader {
            magic: be32(b, 0),
            error: be32(b, 4),
            cookie: be64(b, 8),
        }
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.magic.to_be_bytes());
        out.extend_from_slice(&self.error.to_be_bytes());
        out.extend_from_slice(&self.cookie.to_be_bytes());
    }
}

/// One chunk of a structured reply; `len` bytes of payload follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    pub magic: u32,
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub len: u32,
}

impl ChunkHeader {
    pub const SIZE: usize = 20;

    pub fn new(flags: u16, kind: u16, cookie: u64, len: u32) -> Self {
        ChunkHeader {
            magic: STRUCTURED_REPLY_MAGIC,
            flags,
            kind,
            cookie,
            len,
        }
    }

    pub fn decode(b: &[u8]) -> Self {
        ChunkHeader {
            magic: be32(b, 0),
            flags: be16(b, 4),
            kind: be16(b, 6),
            cookie: be64(b, 8),
            len: be32(b, 16),
        }
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.magic.to_be_bytes());
        out.extend_from_slice(&self.flags.to_be_bytes());
        out.extend_from_slice(&self.kind.to_be_bytes());
        out.extend_from_slice(&self.cookie.to_be_bytes());
        out.extend_from_slice(&self.len.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_with_their_sizes() {
        let mut b = Vec::new();
        let r = RequestHeader::new(1, 3, 0x1122_3344_5566_7788, 4096, 512);
        r.encode(&mut b);
        assert_eq!(b.len(), RequestHeader::SIZE);
        assert_eq!(&b[..4], &[0x25, 0x60, 0x95, 0x13]);
        assert_eq!(RequestHeader::decode(&b), r);

        b.clear();
        let c = ChunkHeader::new(1, 5, 7, 12);
        c.encode(&mut b);
        assert_eq!(b.len(), ChunkHeader::SIZE);
        assert_eq!(ChunkHeader::decode(&b), c);

        b.clear();
        let s = SimpleReplyHeader::new(5, 9);
        s.encode(&mut b);
        assert_eq!(b.len(), SimpleReplyHeader::SIZE);
        assert_eq!(SimpleReplyHeader::decode(&b), s);

        b.clear();
        let o = OptionHeader::new(7, 10);
        o.encode(&mut b);
        assert_eq!(b.len(), OptionHeader::SIZE);
        assert_eq!(&b[..8], b"IHAVEOPT");
        assert_eq!(OptionHeader::decode(&b), o);

        b.clear();
        let p = OptionReplyHeader::new(7, 3, 12);
        p.encode(&mut b);
        assert_eq!(b.len(), OptionReplyHeader::SIZE);
        assert_eq!(OptionReplyHeader::decode(&b), p);
    }
}
