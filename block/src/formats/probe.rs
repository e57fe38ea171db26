//! Recognising image formats by their first bytes.

use crate::options::ImageType;

/// qcow2's magic, "QFI\xfb".
pub const QCOW2_MAGIC: [u8; 4] = *b"QFI\xfb";

/// The format an image's first bytes claim ([`ImageType::Raw`] when none).
pub fn probe_image_type(first_bytes: &[u8]) -> ImageType {
    if first_bytes.starts_with(&QCOW2_MAGIC) {
        ImageType::Qcow2
    } else {
        ImageType::Raw
    }
}

/// Whether a raw image's first sector would make it look like an image of
/// some format qemu or we probe; returns that format's name. A guest of a
/// probed raw image must not be able to write such a header, or the next
/// open would follow a backing file path of the guest's choosing.
pub fn looks_like_image_header(first_bytes: &[u8]) -> Option<&'static str> {
    const MAGICS: &[(&[u8], &str)] = &[
        (b"QFI\xfb", "qcow2"),
        (b"QFI", "qcow"),
        (b"QED\0", "qed"),
        (b"KDMV", "vmdk"),
        (b"# Disk DescriptorFile", "vmdk"),
        (b"vhdxfile", "vhdx"),
        (b"LUKS\xba\xbe", "luks"),
        (b"conectix", "vpc"),
        (b"<<< Oracle VM VirtualBox Disk Image >>>", "vdi"),
        (b"<<< Sun VirtualBox Disk Image >>>", "vdi"),
        (b"<<< Sun xVM VirtualBox Disk Image >>>", "vdi"),
        (b"<<< innotek VirtualBox Disk Image >>>", "vdi"),
        (b"Bochs Virtual HD Image", "bochs"),
        (b"#!/bin/sh\n#V2.0 Format\nmodprobe cloop", "cloop"),
        (b"ParallelsDiskImage", "parallels"),
        (b"WithoutFreeSpace", "parallels"),
    ];
    MAGICS
        .iter()
        .find(|(magic, _)| first_bytes.starts_with(magic))
        .map(|(_, name)| *name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qcow2_magic_is_recognised() {
        assert_eq!(probe_image_type(b"QFI\xfb\0\0\0\x03"), ImageType::Qcow2);
        assert_eq!(probe_image_type(b"\0\0\0\0"), ImageType::Raw);
        assert_eq!(looks_like_image_header(b"QFI\xfbxxxx"), Some("qcow2"));
        assert_eq!(looks_like_image_header(b"KDMV...."), Some("vmdk"));
        assert_eq!(looks_like_image_header(&[0u8; 512]), None);
    }
}
