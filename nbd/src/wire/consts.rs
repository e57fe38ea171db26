//! Numbers from the protocol document (`doc/proto.md`), grouped by what
//! they name.

/// "NBDMAGIC": the first eight bytes a server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": newstyle negotiation, and the magic of every option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// The second magic of the oldstyle handshake (not supported).
pub const OLDSTYLE_MAGIC: u64 = 0x4202_8186_1253;
/// The magic of every option reply.
pub const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flags (server) and client flags share these bits.
pub mod handshake {
    pub const FIXED_NEWSTYLE: u16 = 1 << 0;
    pub const NO_ZEROES: u16 = 1 << 1;
}

/// Options (client to server, during the handshake).
pub mod opt {
    pub const EXPORT_NAME: u32 = 1;
    pub const ABORT: u32 = 2;
    pub const LIST: u32 = 3;
    pub const STARTTLS: u32 = 5;
    pub const INFO: u32 = 6;
    pub const GO: u32 = 7;
    pub const STRUCTURED_REPLY: u32 = 8;
    pub const LIST_META_CONTEXT: u32 = 9;
    pub const SET_META_CONTEXT: u32 = 10;
    pub const EXTENDED_HEADERS: u32 = 11;
}

/// Option reply types; errors have bit 31 set.
pub mod rep {
    pub const ACK: u32 = 1;
    pub const SERVER: u32 = 2;
    pub const INFO: u32 = 3;
    pub const META_CONTEXT: u32 = 4;
    pub const ERR_BIT: u32 = 1 << 31;
    pub const ERR_UNSUP: u32 = ERR_BIT | 1;
    pub const ERR_POLICY: u32 = ERR_BIT | 2;
    pub const ERR_INVALID: u32 = ERR_BIT | 3;
    pub const ERR_PLATFORM: u32 = ERR_BIT | 4;
    pub const ERR_TLS_REQD: u32 = ERR_BIT | 5;
    pub const ERR_UNKNOWN: u32 = ERR_BIT | 6;
    pub const ERR_SHUTDOWN: u32 = ERR_BIT | 7;
    pub const ERR_BLOCK_SIZE_REQD: u32 = ERR_BIT | 8;
    pub const ERR_TOO_BIG: u32 = ERR_BIT | 9;
}

/// Information types of `NBD_REP_INFO` (OPT_INFO, OPT_GO).
pub mod info {
    pub const EXPORT: u16 = 0;
    pub const NAME: u16 = 1;
    pub const DESCRIPTION: u16 = 2;
    pub const BLOCK_SIZE: u16 = 3;
}

/// Transmission flags (per export).
pub mod flag {
    pub const HAS_FLAGS: u16 = 1 << 0;
    pub const READ_ONLY: u16 = 1 << 1;
    pub const SEND_FLUSH: u16 = 1 << 2;
    pub const SEND_FUA: u16 = 1 << 3;
    pub const ROTATIONAL: u16 = 1 << 4;
    pub const SEND_TRIM: u16 = 1 << 5;
    pub const SEND_WRITE_ZEROES: u16 = 1 << 6;
    pub const SEND_DF: u16 = 1 << 7;
    pub const CAN_MULTI_CONN: u16 = 1 << 8;
    pub const SEND_RESIZE: u16 = 1 << 9;
    pub const SEND_CACHE: u16 = 1 << 10;
    pub const SEND_FAST_ZERO: u16 = 1 << 11;
}

/// Commands (transmission phase).
pub mod cmd {
    pub const READ: u16 = 0;
    pub const WRITE: u16 = 1;
    pub const DISC: u16 = 2;
    pub const FLUSH: u16 = 3;
    pub const TRIM: u16 = 4;
    pub const CACHE: u16 = 5;
    pub const WRITE_ZEROES: u16 = 6;
    pub const BLOCK_STATUS: u16 = 7;
}

/// Command flags.
pub mod cmd_flag {
    pub const FUA: u16 = 1 << 0;
    pub const NO_HOLE: u16 = 1 << 1;
    pub const DF: u16 = 1 << 2;
    pub const REQ_ONE: u16 = 1 << 3;
    pub const FAST_ZERO: u16 = 1 << 4;
}

/// Structured reply chunks.
pub mod chunk {
    /// Flag: the last chunk of a reply.
    pub const FLAG_DONE: u16 = 1 << 0;
    pub const NONE: u16 = 0;
    pub const OFFSET_DATA: u16 = 1;
    pub const OFFSET_HOLE: u16 = 2;
    pub const BLOCK_STATUS: u16 = 5;
    /// Error types have bit 15 set.
    pub const ERROR_BIT: u16 = 1 << 15;
    pub const ERROR: u16 = ERROR_BIT | 1;
    pub const ERROR_OFFSET: u16 = ERROR_BIT | 2;
}

/// Block status bits: `base:allocation`'s, and the one bit of a
/// `qemu:dirty-bitmap:NAME` context.
pub mod state {
    pub const HOLE: u32 = 1 << 0;
    pub const ZERO: u32 = 1 << 1;
    /// `qemu:dirty-bitmap:NAME`: the extent is dirty.
    pub const DIRTY: u32 = 1 << 0;
}

/// Error values of replies (the same numbers as Linux's errno).
pub mod error {
    pub const EPERM: u32 = 1;
    pub const EIO: u32 = 5;
    pub const ENOMEM: u32 = 12;
    pub const EINVAL: u32 = 22;
    pub const ENOSPC: u32 = 28;
    pub const EOVERFLOW: u32 = 75;
    pub const ENOTSUP: u32 = 95;
    pub const ESHUTDOWN: u32 = 108;
}

/// The meta context every export offers and the client asks for.
pub const BASE_ALLOCATION: &str = "base:allocation";

/// The prefix of QEMU's dirty-bitmap contexts, `qemu:dirty-bitmap:NAME`
/// (QEMU's `docs/interop/nbd.rst`), which an export offers for the
/// bitmaps it names.
pub const QEMU_DIRTY_BITMAP: &str = "qemu:dirty-bitmap:";

/// Largest READ/WRITE payload (QEMU's and nbdkit's limit, and the
/// protocol's advice to clients that know no better).
pub const MAX_PAYLOAD: u32 = 32 << 20;

/// Longest export name, description or meta-context query (QEMU's limit).
pub const MAX_STRING: usize = 4096;

/// The default TCP port.
pub const DEFAULT_PORT: u16 = 10809;
