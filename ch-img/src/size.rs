//! Sizes in human output, the way qemu-img writes them: [`human_size`]
//! formats bytes as qemu-img's "10 MiB" / "388 KiB" / "1.25 GiB" (three
//! significant digits). Sizes on the command line are parsed by
//! `ch_util::size::parse_size`, the syntax every binary shares.

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
