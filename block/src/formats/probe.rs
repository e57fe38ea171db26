//! Recognising image headers qemu or we probe, for the guard of a probed
//! raw image (which formats this crate opens is the registry's business:
//! each format's driver probes its own header).

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
    fn image_headers_are_recognised() {
        assert_eq!(looks_like_image_header(b"QFI\xfbxxxx"), Some("qcow2"));
        assert_eq!(looks_like_image_header(b"KDMV...."), Some("vmdk"));
        assert_eq!(looks_like_image_header(&[0u8; 512]), None);
    }
}
