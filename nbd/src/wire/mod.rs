//! The NBD wire format: constants ([`consts`]) and the fixed-size
//! headers of both phases, each a plain struct with `encode` and `decode`
//! over byte slices (big-endian, as the protocol wants).
//!
//! - handshake: [`OptionHeader`] (client to server), [`OptionReplyHeader`]
//!   (server to client);
//! - transmission: [`RequestHeader`] (client to server),
//!   [`SimpleReplyHeader`] and [`ChunkHeader`] (server to client).
//!
//! Decoding never fails on content (a wrong magic is a field the caller
//! checks); it only needs enough bytes, which callers guarantee by asking
//! for `SIZE` bytes first.

mod bytes;
pub mod consts;
mod header;

pub use bytes::{be16, be32, be64, put_string};
pub use header::{ChunkHeader, OptionHeader, OptionReplyHeader, RequestHeader, SimpleReplyHeader};

/// The protocol's error numbers for a Linux errno (the values agree for
/// the errors it names; anything else is EINVAL, as the protocol asks).
pub fn nbd_error_from_errno(errno: i32) -> u32 {
    use consts::error::*;
    match errno {
        0 => 0,
        libc::EPERM | libc::EROFS | libc::EACCES => EPERM,
        libc::EIO => EIO,
        libc::ENOMEM => ENOMEM,
        libc::ENOSPC | libc::EFBIG | libc::EDQUOT => ENOSPC,
        libc::EOVERFLOW => EOVERFLOW,
        libc::EOPNOTSUPP => ENOTSUP,
        libc::ESHUTDOWN => ESHUTDOWN,
        _ => EINVAL,
    }
}

/// The Linux errno for an error number a server sent (unknown values
/// read as EINVAL, as the protocol asks of clients).
pub fn errno_from_nbd_error(error: u32) -> i32 {
    use consts::error::*;
    match error {
        EPERM => libc::EPERM,
        EIO => libc::EIO,
        ENOMEM => libc::ENOMEM,
        ENOSPC => libc::ENOSPC,
        EOVERFLOW => libc::EOVERFLOW,
        ENOTSUP => libc::EOPNOTSUPP,
        ESHUTDOWN => libc::ESHUTDOWN,
        _ => libc::EINVAL,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_round_trip_and_unknown_ones_are_einval() {
        for e in [
            libc::EPERM,
            libc::EIO,
            libc::ENOMEM,
            libc::ENOSPC,
            libc::EOVERFLOW,
            libc::EOPNOTSUPP,
            libc::ESHUTDOWN,
            libc::EINVAL,
        ] {
            assert_eq!(errno_from_nbd_error(nbd_error_from_errno(e)), e);
        }
        assert_eq!(nbd_error_from_errno(libc::EROFS), consts::error::EPERM);
        assert_eq!(nbd_error_from_errno(libc::ENOENT), consts::error::EINVAL);
        assert_eq!(errno_from_nbd_error(12345), libc::EINVAL);
    }
}
