//! `ch-img rebase` against `qemu-img rebase` 7.2: safe and unsafe (`-u`)
//! rebases leave the same image and disk contents.

mod ch_img_support;

use ch_img_support::code;
use integration_tests::{ch, ch_status, json, qemu_create_overlay, qemu_img, qemu_io, TempDir};

/// rebase: safe mode keeps what the disk reads (compared with qemu-img's
/// own rebase of the same image), `-b ""` flattens, `-u` only rewrites
/// the header and keeps the other header extensions (an external data
/// file's name).
#[test]
fn rebase_matches_qemu_img() {
    let dir = TempDir::new("cli");
    std::fs::create_dir_all(dir.file("sub")).unwrap();
    let b1 = dir.file("sub/b1.qcow2");
    let b2 = dir.file("sub/b2.raw");
    let top = dir.file("sub/top.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", &b1, "4M"]);
    qemu_io("qcow2", &b1, &["write -P 0x11 0 2M"]);
    qemu_img(&["create", "-q", "-f", "raw", &b2, "3M"]);
    qemu_io("raw", &b2, &["write -P 0x22 1M 2M"]);
    qemu_create_overlay(&top, "b1.qcow2", "qcow2");
    qemu_io(
        "qcow2",
        &top,
        &["write -P 0x33 512k 64k", "write -z 1536k 64k"],
    );
    let info = |img: &str| {
        let mut j = json(&qemu_img(&["info", "--output=json", img]));
        j.as_object_mut().unwrap().remove("actual-size");
        j.as_object_mut().unwrap().remove("filename");
        j
    };
    for args in [
        &["-b", "b2.raw", "-F", "raw"][..],
        &["-b", ""],
        &["-u", "-b", "b2.raw", "-F", "raw"],
        &["-u", "-b", "../sub/b1.qcow2", "-F", "qcow2"],
    ] {
        let theirs = dir.file("sub/theirs.qcow2");
        let ours = dir.file("sub/ours.qcow2");
        std::fs::copy(&top, &theirs).unwrap();
        std::fs::copy(&top, &ours).unwrap();
        let mut q = vec!["rebase"];
        q.extend_from_slice(args);
        let mut c = q.clone();
        q.push(&theirs);
        c.push(&ours);
        qemu_img(&q);
        ch(&c);
        qemu_img(&["check", &ours]);
        assert_eq!(info(&theirs), info(&ours), "{args:?}");
        qemu_img(&["compare", &theirs, &ours]);
        if args[0] != "-u" {
            qemu_img(&["compare", &top, &ours]);
        }
    }
    let c = ch_status(&["rebase", "-b", "b2.raw", &top]);
    assert_eq!(code(&c), 1);
    assert!(String::from_utf8_lossy(&c.stderr).contains("backing format must be specified"));

    // -u keeps the data file extension next to the new backing reference.
    let df = dir.file("sub/df.qcow2");
    let data_opt = format!("data_file={}", dir.file("sub/df.data"));
    qemu_img(&[
        "create", "-q", "-f", "qcow2", "-o", &data_opt, "-b", "b1.qcow2", "-F", "qcow2", &df,
    ]);
    let theirs = dir.file("sub/df-theirs.qcow2");
    std::fs::copy(&df, &theirs).unwrap();
    qemu_img(&["rebase", "-u", "-b", "b2.raw", "-F", "raw", &theirs]);
    ch(&["rebase", "-u", "-b", "b2.raw", "-F", "raw", &df]);
    qemu_img(&["check", &df]);
    assert_eq!(info(&theirs), info(&df));
}
