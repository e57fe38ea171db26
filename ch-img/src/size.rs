//! Sizes on the command line and in human output, the way qemu-img writes
//! them.
//!
//! [`parse_size`] turns "10G", "1.5M", "4096", "0x10000" into bytes
//! (binary suffixes k/K, M, G, T, P, E; a plain number is bytes; fractions
//! allowed with a suffix; hexadecimal after `0x`, with a suffix too, which
//! qemu-img still takes with a deprecation warning). [`human_size`] formats bytes as qemu-img's "10 MiB" / "388 KiB"
//! / "1.25 GiB" (three significant digits).

/// Parses a size with an optional binary suffix; `None` if malformed or if
/// it does not fit in an `i64` (qemu refuses sizes of 8 EiB and more).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let value = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => parse_hex(hex)?,
        None => parse_decimal(s)?,
    };
    if value > i64::MAX as u64 {
        return None;
    }
    Some(value)
}

/// The power of two a size suffix multiplies by.
fn suffix_shift(suffix: &str) -> Option<u32> {
    Some(match suffix {
        "" | "b" | "B" => 0,
        "k" | "K" => 10,
        "m" | "M" => 20,
        "g" | "G" => 30,
        "t" | "T" => 40,
        "p" | "P" => 50,
        "e" | "E" => 60,
        _ => return None,
    })
}

/// Hex digits (no fraction) and an optional suffix.
fn parse_hex(s: &str) -> Option<u64> {
    let split = s.find(|c: char| !c.is_ascii_hexdigit()).unwrap_or(s.len());
    let (digits, suffix) = s.split_at(split);
    if digits.is_empty() {
        return None;
    }
    let n = u64::from_str_radix(digits, 16).ok()?;
    n.checked_mul(1u64 << suffix_shift(suffix)?)
}

/// Decimal digits, an optional fraction (only with a suffix) and suffix.
fn parse_decimal(s: &str) -> Option<u64> {
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    if num.is_empty() {
        return None;
    }
    let shift = suffix_shift(suffix)?;
    let value = if let Some((int, frac)) = num.split_once('.') {
        if shift == 0 || frac.contains('.') || int.is_empty() && frac.is_empty() {
            return None;
        }
        let int: u64 = if int.is_empty() { 0 } else { int.parse().ok()? };
        let whole = int.checked_mul(1u64 << shift)?;
        // Fractional part: digits / 10^n of one unit, truncated to bytes.
        let frac_digits = &frac[..frac.len().min(18)];
        let denom = 10u128.pow(frac_digits.len() as u32);
        let f: u128 = if frac_digits.is_empty() {
            0
        } else {
            frac_digits.parse().ok()?
        };
        let part = f.checked_mul(1u128 << shift)? / denom;
        whole.checked_add(u64::try_from(part).ok()?)?
    } else {
        let n: u64 = num.parse().ok()?;
        n.checked_mul(1u64 << shift)?
    };
    Some(value)
}

/// qemu's human-readable size: the binary unit is chosen from
/// floor(log2(bytes * 1.024)) / 10, so the printed value stays below 1000;
/// the value is printed with three significant digits like C's `%0.3g`.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let unit = if bytes == 0 {
        0
    } else {
        let exp = (bytes as f64 * 1.024).log2().floor().max(0.0) as usize;
        (exp / 10).min(UNITS.len() - 1)
    };
    let value = bytes as f64 / (1u64 << (10 * unit)) as f64;
    format!("{} {}", three_significant(value), UNITS[unit])
}

/// C's `%0.3g` for values in [0, 1024): three significant digits, trailing
/// zeros dropped, exponent form once the value rounds to 1000 or more.
fn three_significant(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let digits_before = v.log10().floor() as i32 + 1;
    let decimals = (3 - digits_before).max(0) as usize;
    let rounded: f64 = format!("{v:.decimals$}").parse().unwrap_or(v);
    if rounded >= 1000.0 {
        let m = format!("{:.2}", rounded / 1000.0);
        let m = m.trim_end_matches('0').trim_end_matches('.');
        return format!("{m}e+03");
    }
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes_like_qemu() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("1k"), Some(1024));
        assert_eq!(parse_size("10M"), Some(10 << 20));
        assert_eq!(parse_size("2G"), Some(2 << 30));
        assert_eq!(parse_size("1T"), Some(1 << 40));
        assert_eq!(parse_size("1.5M"), Some(3 << 19));
        assert_eq!(parse_size("8E"), None);
        assert_eq!(parse_size("12X"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("-1"), None);
        assert_eq!(parse_size("99999999999999999999999"), None);
        // Hexadecimal, as qemu-img takes it (a suffix too, deprecated).
        assert_eq!(parse_size("0x10000"), Some(65536));
        assert_eq!(parse_size("0X10"), Some(16));
        assert_eq!(parse_size("0x1M"), Some(1 << 20));
        assert_eq!(parse_size("0x10k"), Some(16 << 10));
        assert_eq!(parse_size("0x"), None);
        assert_eq!(parse_size("0x1.5M"), None);
        assert_eq!(parse_size("0xg"), None);
        assert_eq!(parse_size("0x8000000000000000"), None);
    }

    #[test]
    fn human_sizes_match_qemu_img_info() {
        assert_eq!(human_size(0), "0 B");
        assert_eq!(human_size(4096), "4 KiB");
        assert_eq!(human_size(397312), "388 KiB");
        assert_eq!(human_size(10 << 20), "10 MiB");
        assert_eq!(human_size(200704), "196 KiB");
        assert_eq!(human_size(1_310_720), "1.25 MiB");
        assert_eq!(human_size(999), "999 B");
    }
}
