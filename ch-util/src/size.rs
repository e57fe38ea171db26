//! Sizes on the command line, one syntax for every binary: `ch-img`'s
//! sizes (qemu-img's syntax), `cloud-hypervisor --memory size=`,
//! `ch-remote resize --size`, `blk-bench --bs`.
//!
//! A size is a number and an optional unit, with blanks around them
//! ignored:
//! - the number is decimal (`4096`), decimal with a fraction when a unit
//!   other than bytes follows (`1.5G`; the bytes below one are dropped),
//!   or hexadecimal after `0x` (`0x10000`, `0x1M`; qemu-img still takes
//!   the suffix, with a deprecation warning);
//! - the unit is `B` (bytes) or one of `K`, `M`, `G`, `T`, `P`, `E`
//!   (powers of 1024), in either case, optionally followed by `B` or
//!   `iB` (`512MB`, `2GiB`: still powers of 1024);
//! - the value is at most `i64::MAX` (qemu refuses sizes of 8 EiB and
//!   more; a size is a file offset).
//!
//! Zero is a size; whether it is a useful one is the caller's business
//! (`--memory size=0` is refused by the memory check, `ch-img create`
//! takes it). Enters as a string ([`parse_size`]); leaves as bytes or a
//! [`SizeError`] that quotes the string.

use thiserror::Error;

/// A string that is not a size.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SizeError {
    /// Not a number with a known unit.
    #[error("'{0}' is not a size (e.g. 512M, 1G)")]
    Malformed(String),
    /// A size of 8 EiB or more.
    #[error("'{0}' is too large")]
    TooLarge(String),
}

/// Parses `4096`, `64k`, `512M`, `2GiB`, `1.5G`, `0x10000` into bytes.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => parse_hex(hex),
        None => parse_decimal(t),
    };
    match parsed {
        Parsed::Bytes(n) if n <= i64::MAX as u64 => Ok(n),
        Parsed::Bytes(_) | Parsed::TooLarge => Err(SizeError::TooLarge(s.to_string())),
        Parsed::Malformed => Err(SizeError::Malformed(s.to_string())),
    }
}

enum Parsed {
    Bytes(u64),
    TooLarge,
    Malformed,
}

/// The power of two a unit multiplies by: `B`, or a letter with an
/// optional `B`/`iB` after it, any case.
fn unit_shift(unit: &str) -> Option<u32> {
    let mut chars = unit.chars();
    let Some(letter) = chars.next() else {
        return Some(0);
    };
    let shift = match letter.to_ascii_lowercase() {
        'b' => return chars.as_str().is_empty().then_some(0),
        'k' => 10,
        'm' => 20,
        'g' => 30,
        't' => 40,
        'p' => 50,
        'e' => 60,
        _ => return None,
    };
    let tail = chars.as_str();
    (tail.is_empty() || tail.eq_ignore_ascii_case("b") || tail.eq_ignore_ascii_case("ib"))
        .then_some(shift)
}

/// `n` units of `1 << shift` bytes.
fn scaled(n: u64, shift: u32) -> Parsed {
    match n.checked_mul(1u64 << shift) {
        Some(v) => Parsed::Bytes(v),
        None => Parsed::TooLarge,
    }
}

/// Hex digits (no fraction) and an optional unit.
fn parse_hex(s: &str) -> Parsed {
    let split = s.find(|c: char| !c.is_ascii_hexdigit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let Some(shift) = unit_shift(unit) else {
        return Parsed::Malformed;
    };
    if digits.is_empty() {
        return Parsed::Malformed;
    }
    match u64::from_str_radix(digits, 16) {
        Ok(n) => scaled(n, shift),
        Err(_) => Parsed::TooLarge,
    }
}

/// Decimal digits, an optional fraction (only with a unit above bytes)
/// and an optional unit.
fn parse_decimal(s: &str) -> Parsed {
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let Some(shift) = unit_shift(unit) else {
        return Parsed::Malformed;
    };
    if num.is_empty() {
        return Parsed::Malformed;
    }
    let Some((int, frac)) = num.split_once('.') else {
        return match num.parse::<u64>() {
            Ok(n) => scaled(n, shift),
            Err(_) => Parsed::TooLarge,
        };
    };
    if shift == 0 || frac.contains('.') || int.is_empty() && frac.is_empty() {
        return Parsed::Malformed;
    }
    let int = if int.is_empty() {
        0
    } else {
        match int.parse::<u64>() {
            Ok(n) => n,
            Err(_) => return Parsed::TooLarge,
        }
    };
    let Parsed::Bytes(whole) = scaled(int, shift) else {
        return Parsed::TooLarge;
    };
    // The fraction: digits / 10^n of one unit, truncated to bytes (18
    // digits are more than a byte of an exbibyte needs).
    let frac_digits = &frac[..frac.len().min(18)];
    let part = if frac_digits.is_empty() {
        0
    } else {
        let Ok(f) = frac_digits.parse::<u128>() else {
            return Parsed::Malformed;
        };
        (f << shift) / 10u128.pow(frac_digits.len() as u32)
    };
    match u64::try_from(part).ok().and_then(|p| whole.checked_add(p)) {
        Some(v) => Parsed::Bytes(v),
        None => Parsed::TooLarge,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> u64 {
        parse_size(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn plain_numbers_are_bytes_and_zero_is_a_size() {
        assert_eq!(ok("4096"), 4096);
        assert_eq!(ok("0"), 0);
        assert_eq!(ok("0K"), 0);
        assert_eq!(ok(" 512 "), 512);
        assert_eq!(ok("512B"), 512);
        assert_eq!(ok("512b"), 512);
    }

    /// What `ch-img` documents (qemu-img's suffixes, fractions, hex).
    #[test]
    fn qemu_img_sizes() {
        assert_eq!(ok("1k"), 1024);
        assert_eq!(ok("10M"), 10 << 20);
        assert_eq!(ok("2G"), 2 << 30);
        assert_eq!(ok("1T"), 1 << 40);
        assert_eq!(ok("1P"), 1 << 50);
        assert_eq!(ok("1E"), 1 << 60);
        assert_eq!(ok("1.5M"), 3 << 19);
        assert_eq!(ok(".5K"), 512);
        assert_eq!(ok("5.M"), 5 << 20);
        assert_eq!(ok("0x10000"), 65536);
        assert_eq!(ok("0X10"), 16);
        assert_eq!(ok("0x1M"), 1 << 20);
        assert_eq!(ok("0x10k"), 16 << 10);
        // `b` and `e` are hex digits after 0x, as in qemu-img.
        assert_eq!(ok("0x1b"), 0x1b);
        assert_eq!(ok("0x7fffffffffffffff"), i64::MAX as u64);
    }

    /// What `cloud-hypervisor --memory size=` and `ch-remote resize
    /// --size` document (K/M/G/T in either case, `B`/`iB` after them).
    #[test]
    fn vmm_sizes() {
        assert_eq!(ok("64K"), 64 << 10);
        assert_eq!(ok("512M"), 512 << 20);
        assert_eq!(ok("1g"), 1 << 30);
        assert_eq!(ok("2GiB"), 2 << 30);
        assert_eq!(ok("2gib"), 2 << 30);
        assert_eq!(ok("512MB"), 512 << 20);
        assert_eq!(ok("1tb"), 1 << 40);
    }

    /// What `blk-bench` documents for its sizes and counts.
    #[test]
    fn benchmark_sizes() {
        assert_eq!(ok("4k"), 4096);
        assert_eq!(ok("128K"), 128 << 10);
        assert_eq!(ok("1m"), 1 << 20);
        assert_eq!(ok("2g"), 2 << 30);
    }

    #[test]
    fn malformed_sizes_are_refused_quoting_the_input() {
        for bad in [
            "", " ", "M", "GiB", "x", "12X", "-1", "+1", "1.5", "1.5B", "1..5M", ".M", "1 M",
            "1KBB", "1iB", "1Ki", "0x", "0xg", "0x1.5M", "1e3",
        ] {
            assert_eq!(
                parse_size(bad),
                Err(SizeError::Malformed(bad.to_string())),
                "{bad:?}"
            );
        }
        assert_eq!(
            parse_size("12X").unwrap_err().to_string(),
            "'12X' is not a size (e.g. 512M, 1G)"
        );
    }

    #[test]
    fn sizes_of_8_eib_and_more_are_too_large() {
        for big in [
            "8E",
            "16E",
            "8192P",
            "99999999999T",
            "99999999999999999999999",
            "0x8000000000000000",
            "0x10000000000000000",
            "9223372036854775808",
            "99999999999999999999.5K",
        ] {
            assert_eq!(
                parse_size(big),
                Err(SizeError::TooLarge(big.to_string())),
                "{big}"
            );
        }
        assert_eq!(ok("9223372036854775807"), i64::MAX as u64);
        assert_eq!(
            parse_size("8E").unwrap_err().to_string(),
            "'8E' is too large"
        );
    }
}
