//! End-to-end with a real Linux guest under our own VMM: runs
//! scripts/run-linux-guest.sh (boot a kernel and root filesystem, fio
//! inside on a scratch virtio-blk disk) with CH_LINUX_KERNEL and
//! CH_LINUX_ROOTFS. It needs a host whose KVM runs guest code natively, so
//! it is `#[ignore]`d: on the development machines guest code is emulated
//! and a Linux boot does not finish in useful time. On a real KVM host:
//! `cargo test -p integration-tests --test e2e_linux -- --ignored`.

use std::path::Path;
use std::process::Command;

#[test]
#[ignore = "needs a real KVM host, CH_LINUX_KERNEL and CH_LINUX_ROOTFS (docs/linux-guests.md)"]
fn linux_guest_runs_fio() {
    let (Ok(kernel), Ok(rootfs)) = (
        std::env::var("CH_LINUX_KERNEL"),
        std::env::var("CH_LINUX_ROOTFS"),
    ) else {
        panic!(
            "set CH_LINUX_KERNEL and CH_LINUX_ROOTFS to boot a Linux guest (docs/linux-guests.md)"
        );
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/run-linux-guest.sh");
    let status = Command::new("bash")
        .arg(script)
        .arg(&kernel)
        .arg(&rootfs)
        .status()
        .expect("run scripts/run-linux-guest.sh");
    assert!(status.success(), "run-linux-guest.sh failed: {status}");
}
