//! Just enough AML (ACPI Machine Language, ACPI 6.5 chapter 20) to write
//! the DSDT: names, integers, packages, scopes, devices, EISA IDs and the
//! resource descriptors a PCI host bridge's `_CRS` needs.
//!
//! Every function returns the encoded bytes; callers concatenate them.
//! Nothing here reads guest input.

const NAME_OP: u8 = 0x08;
const BYTE_PREFIX: u8 = 0x0a;
const WORD_PREFIX: u8 = 0x0b;
const DWORD_PREFIX: u8 = 0x0c;
const QWORD_PREFIX: u8 = 0x0e;
const ZERO_OP: u8 = 0x00;
const ONE_OP: u8 = 0x01;
const SCOPE_OP: u8 = 0x10;
const BUFFER_OP: u8 = 0x11;
const PACKAGE_OP: u8 = 0x12;
const EXT_OP_PREFIX: u8 = 0x5b;
const DEVICE_OP: u8 = 0x82;
const ROOT_CHAR: u8 = b'\\';

/// A PkgLength (20.2.4) for `body` bytes that follow it; the encoded
/// length counts the PkgLength bytes themselves.
pub fn pkg_length(body: usize) -> Vec<u8> {
    if body + 1 < 0x40 {
        return vec![(body + 1) as u8];
    }
    // Lengths here are at most a few KiB, far below the 2^28 limit.
    for extra in 1..=3usize {
        let total = body + extra + 1;
        if total < 1 << (4 + 8 * extra) {
            let mut out = vec![((extra as u8) << 6) | (total & 0xf) as u8];
            for i in 0..extra {
                out.push((total >> (4 + 8 * i)) as u8);
            }
            return out;
        }
    }
    // Unreachable for the tables we build: clamp rather than panic.
    vec![0xff, 0xff, 0xff, 0xff]
}

/// A NameSeg or a rooted path of NameSegs (`"\\_SB_"`, `"PCI0"`); each
/// segment is four characters.
fn name_string(name: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let segs = match name.strip_prefix('\\') {
        Some(rest) => {
            out.push(ROOT_CHAR);
            rest
        }
        None => name,
    };
    let parts: Vec<&str> = segs.split('.').collect();
    match parts.len() {
        1 => {}
        2 => out.push(0x2e), // DualNamePrefix
        n => {
            out.push(0x2f); // MultiNamePrefix
            out.push(n as u8);
        }
    }
    for p in parts {
        let mut seg = [b'_'; 4];
        for (d, s) in seg.iter_mut().zip(p.bytes()) {
            *d = s;
        }
        out.extend_from_slice(&seg);
    }
    out
}

/// The smallest integer encoding of `v`.
pub fn integer(v: u64) -> Vec<u8> {
    match v {
        0 => vec![ZERO_OP],
        1 => vec![ONE_OP],
        v if v <= 0xff => vec![BYTE_PREFIX, v as u8],
        v if v <= 0xffff => {
            let mut o = vec![WORD_PREFIX];
            o.extend_from_slice(&(v as u16).to_le_bytes());
            o
        }
        v if v <= 0xffff_ffff => {
            let mut o = vec![DWORD_PREFIX];
            o.extend_from_slice(&(v as u32).to_le_bytes());
            o
        }
        v => {
            let mut o = vec![QWORD_PREFIX];
            o.extend_from_slice(&v.to_le_bytes());
            o
        }
    }
}

/// `Name(name, value)`; `value` is already encoded.
pub fn name(name: &str, value: &[u8]) -> Vec<u8> {
    let mut o = vec![NAME_OP];
    o.extend(name_string(name));
    o.extend_from_slice(value);
    o
}

/// `Package() { integers }`.
pub fn package(items: &[u64]) -> Vec<u8> {
    let mut body = vec![items.len() as u8];
    for &i in items {
        body.extend(integer(i));
    }
    let mut o = vec![PACKAGE_OP];
    o.extend(pkg_length(body.len()));
    o.extend(body);
    o
}

/// `Scope(name) { body }`.
pub fn scope(name: &str, body: &[u8]) -> Vec<u8> {
    let mut inner = name_string(name);
    inner.extend_from_slice(body);
    let mut o = vec![SCOPE_OP];
    o.extend(pkg_length(inner.len()));
    o.extend(inner);
    o
}

/// `Device(name) { body }`.
pub fn device(name: &str, body: &[u8]) -> Vec<u8> {
    let mut inner = name_string(name);
    inner.extend_from_slice(body);
    let mut o = vec![EXT_OP_PREFIX, DEVICE_OP];
    o.extend(pkg_length(inner.len()));
    o.extend(inner);
    o
}

/// `EisaId("PNP0A03")` as the integer it compiles to: three letters of
/// five bits each and four hex digits, stored big-endian.
pub fn eisa_id(id: &str) -> Option<u32> {
    let b = id.as_bytes();
    if b.len() != 7 || !b[..3].iter().all(u8::is_ascii_uppercase) {
        return None;
    }
    let letters = b[..3]
        .iter()
        .fold(0u32, |a, &c| (a << 5) | u32::from(c - 0x40));
    let product = u32::from_str_radix(id.get(3..)?, 16).ok()?;
    Some(((letters << 16) | product).swap_bytes())
}

/// `ResourceTemplate() { descriptors }`: a buffer ending in an End Tag
/// (checksum 0: "treat as correct").
pub fn resource_template(descriptors: &[Vec<u8>]) -> Vec<u8> {
    let mut bytes: Vec<u8> = descriptors.concat();
    bytes.extend_from_slice(&[0x79, 0]);
    let mut body = integer(bytes.len() as u64);
    body.extend(bytes);
    let mut o = vec![BUFFER_OP];
    o.extend(pkg_length(body.len()));
    o.extend(body);
    o
}

/// General flags of an address space descriptor: minimum and maximum
/// fixed, the range produced (bridged) by this device.
const PRODUCER_FIXED: u8 = 0x0c;

/// A Word Address Space descriptor (6.4.3.5.3) of `kind` (1 I/O, 2 bus
/// numbers) covering `min..=max`.
pub fn word_space(kind: u8, type_flags: u8, min: u16, max: u16) -> Vec<u8> {
    let mut o = vec![0x88, 13, 0, kind, PRODUCER_FIXED, type_flags];
    o.extend_from_slice(&0u16.to_le_bytes()); // granularity
    o.extend_from_slice(&min.to_le_bytes());
    o.extend_from_slice(&max.to_le_bytes());
    o.extend_from_slice(&0u16.to_le_bytes()); // translation
    o.extend_from_slice(&(max - min).wrapping_add(1).to_le_bytes());
    o
}

/// A DWord Memory descriptor (6.4.3.5.2), read-write, not cacheable.
pub fn dword_memory(min: u32, max: u32) -> Vec<u8> {
    let mut o = vec![0x87, 23, 0, 0, PRODUCER_FIXED, 0x01];
    o.extend_from_slice(&0u32.to_le_bytes()); // granularity
    o.extend_from_slice(&min.to_le_bytes());
    o.extend_from_slice(&max.to_le_bytes());
    o.extend_from_slice(&0u32.to_le_bytes()); // translation
    o.extend_from_slice(&(max - min).wrapping_add(1).to_le_bytes());
    o
}

/// A small I/O Port descriptor (6.4.2.5), 16-bit decode, fixed.
pub fn io_port(base: u16, len: u8) -> Vec<u8> {
    let mut o = vec![0x47, 1];
    o.extend_from_slice(&base.to_le_bytes());
    o.extend_from_slice(&base.to_le_bytes());
    o.extend_from_slice(&[1, len]);
    o
}

/// An Extended Interrupt descriptor (6.4.3.6): one edge-triggered,
/// active-high, exclusive interrupt consumed by the device.
pub fn interrupt(gsi: u32) -> Vec<u8> {
    let mut o = vec![0x89, 6, 0, 0x03, 1];
    o.extend_from_slice(&gsi.to_le_bytes());
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkg_length_encodings() {
        assert_eq!(pkg_length(0), vec![1]);
        assert_eq!(pkg_length(62), vec![63]);
        // 63 body bytes + 2 length bytes = 65 = 0x41.
        assert_eq!(pkg_length(63), vec![0x41, 0x04]);
        assert_eq!(pkg_length(0xffd), vec![0x4f, 0xff]);
        assert_eq!(pkg_length(0xffe), vec![0x81, 0x00, 0x01]);
    }

    #[test]
    fn eisa_ids_match_the_known_constants() {
        assert_eq!(eisa_id("PNP0A03"), Some(0x030a_d041));
        assert_eq!(eisa_id("PNP0A08"), Some(0x080a_d041));
        assert_eq!(eisa_id("pnp0a03"), None);
        assert_eq!(eisa_id("PNP0A0"), None);
    }

    #[test]
    fn names_integers_and_packages() {
        assert_eq!(integer(0), vec![0]);
        assert_eq!(integer(5), vec![0x0a, 5]);
        assert_eq!(integer(0x1234), vec![0x0b, 0x34, 0x12]);
        assert_eq!(name_string("\\_SB_"), b"\\_SB_".to_vec());
        assert_eq!(name_string("_SB.PCI0")[0], 0x2e);
        assert_eq!(
            name("_S5_", &package(&[5, 0, 0, 0])),
            vec![0x08, b'_', b'S', b'5', b'_', 0x12, 0x07, 0x04, 0x0a, 0x05, 0, 0, 0]
        );
    }

    #[test]
    fn descriptors_have_their_declared_lengths() {
        assert_eq!(word_space(2, 0, 0, 0).len(), 3 + 13);
        assert_eq!(dword_memory(0xe000_0000, 0xfebf_ffff).len(), 3 + 23);
        assert_eq!(io_port(0xcf8, 8).len(), 8);
        assert_eq!(interrupt(4).len(), 3 + 6);
        let rt = resource_template(&[io_port(0xcf8, 8)]);
        // BufferOp, PkgLength, BytePrefix size, 8 + 2 bytes.
        assert_eq!(rt, {
            let mut v = vec![0x11, 13, 0x0a, 10];
            v.extend(io_port(0xcf8, 8));
            v.extend([0x79, 0]);
            v
        });
    }
}
