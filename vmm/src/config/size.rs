//! Sizes on the command line: a decimal number with an optional `K`, `M`,
//! `G` or `T` suffix (binary units, case-insensitive, an optional trailing
//! `B` or `iB` is accepted). Enters as a string, leaves as bytes.

/// Parses `512M`, `1G`, `4096`, `2GiB`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let body = lower
        .strip_suffix("ib")
        .or_else(|| lower.strip_suffix('b'))
        .unwrap_or(&lower);
    let (digits, shift) = match body.chars().last() {
        Some('k') => (&body[..body.len() - 1], 10),
        Some('m') => (&body[..body.len() - 1], 20),
        Some('g') => (&body[..body.len() - 1], 30),
        Some('t') => (&body[..body.len() - 1], 40),
        _ => (body, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("'{s}' is not a size (e.g. 512M, 1G)"));
    }
    let n: u64 = digits.parse().map_err(|_| format!("'{s}' is too large"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("'{s}' is too large"))
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn suffixes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64K").unwrap(), 64 << 10);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
    }

    #[test]
    fn rejects_garbage_and_overflow() {
        for bad in ["", "M", "1.5G", "-1", "1X", "99999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
