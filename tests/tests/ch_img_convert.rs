//! `ch-img convert` against `qemu-img convert` 7.2: a sparse qcow2 copy,
//! and compressed copies (`-c`) of every geometry that qemu-img reads
//! back equal, with as many compressed clusters as its own.

mod ch_img_support;

use ch_img_support::{code, sample_qcow2};
use integration_tests::{ch, ch_status, json, qemu_img, qemu_img_status, TempDir};

#[test]
fn convert_to_qcow2_stays_sparse_and_equal() {
    let dir = TempDir::new("cli");
    let src = sample_qcow2(&dir, "src.qcow2");
    let raw = dir.file("src.raw");
    ch(&["convert", "-O", "raw", &src, &raw]);
    qemu_img(&["compare", "-f", "qcow2", "-F", "raw", &src, &raw]);
    let out = dir.file("out.qcow2");
    ch(&["convert", "-f", "raw", "-O", "qcow2", &raw, &out]);
    qemu_img(&["check", &out]);
    qemu_img(&["compare", &src, &out]);
    // Only the clusters with data are allocated: 100k + 4k of data.
    let check = json(&qemu_img(&["check", "--output=json", &out]));
    assert_eq!(check["allocated-clusters"], 3, "{check}");
}

/// A source whose clusters are compressible text, random bytes, zeroes
/// and half-zero halves, ending in a partial cluster.
fn mixed_raw(dir: &TempDir, name: &str, cluster: usize) -> String {
    let path = dir.file(name);
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut data = Vec::new();
    for i in 0..24 {
        let mut c = vec![0u8; cluster];
        match i % 4 {
            0 => {
                let text = format!("cluster {i} of a compressible image; ");
                for (j, b) in c.iter_mut().enumerate() {
                    *b = text.as_bytes()[j % text.len()];
                }
            }
            1 => {
                for b in c.iter_mut() {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    *b = rng as u8;
                }
            }
            2 => {}
            _ => c[..cluster / 2].fill(0x5a),
        }
        data.extend_from_slice(&c);
    }
    data.extend_from_slice(&b"tail".repeat(cluster / 8));
    std::fs::write(&path, &data).unwrap();
    path
}

/// convert -c: what qemu-img reads back equals the source, `check` is
/// clean, and as many clusters are compressed as qemu-img compresses.
#[test]
fn convert_compressed_matches_qemu_img() {
    let dir = TempDir::new("cli");
    for (opts, cluster) in [
        ("cluster_size=65536", 65536),
        ("cluster_size=65536,compression_type=zstd", 65536),
        ("cluster_size=4096,refcount_bits=1", 4096),
        ("cluster_size=512,compat=0.10", 512),
        ("cluster_size=2M", 2 << 20),
    ] {
        let src = mixed_raw(&dir, "src.raw", cluster);
        let ours = dir.file("ours.qcow2");
        let theirs = dir.file("theirs.qcow2");
        for (tool_out, path) in [(true, &ours), (false, &theirs)] {
            let args = [
                "convert", "-c", "-f", "raw", "-O", "qcow2", "-o", opts, &src, path,
            ];
            if tool_out {
                ch(&args);
            } else {
                qemu_img(&args);
            }
        }
        qemu_img(&["check", &ours]);
        qemu_img(&["compare", "-f", "raw", "-F", "qcow2", &src, &ours]);
        let ours_check = json(&qemu_img(&["check", "--output=json", &ours]));
        let theirs_check = json(&qemu_img(&["check", "--output=json", &theirs]));
        assert!(
            ours_check["compressed-clusters"].as_u64().unwrap_or(0) > 0,
            "{opts}: {ours_check}"
        );
        for key in ["compressed-clusters", "allocated-clusters"] {
            assert_eq!(ours_check[key], theirs_check[key], "{opts}: {key}");
        }
        // And we read our compressed clusters back like qemu's.
        let back = dir.file("back.raw");
        ch(&["convert", "-O", "raw", &ours, &back]);
        qemu_img(&["compare", "-f", "raw", "-F", "raw", &src, &back]);
    }
}

#[test]
fn convert_compressed_refuses_raw_output() {
    let dir = TempDir::new("cli");
    let src = mixed_raw(&dir, "src.raw", 4096);
    let out = dir.file("out.raw");
    let q = qemu_img_status(&["convert", "-c", "-f", "raw", "-O", "raw", &src, &out]);
    let c = ch_status(&["convert", "-c", "-f", "raw", "-O", "raw", &src, &out]);
    assert_eq!(code(&q), 1);
    assert_eq!(code(&c), 1);
    assert!(
        String::from_utf8_lossy(&c.stderr).contains("Compression not supported"),
        "{c:?}"
    );
}
