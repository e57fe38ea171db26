//! End-to-end with a real Linux guest: runs scripts/run-linux-guest.sh
//! (boot a user-supplied kernel and root filesystem, fio inside on a
//! scratch virtio-blk disk) when CH_LINUX_KERNEL and CH_LINUX_ROOTFS are
//! set. Without them it prints that it skipped: on machines where guest
//! code is emulated a Linux boot does not finish in useful time.

use std::path::Path;
use std::process::Command;

#[test]
fn linux_guest_runs_fio() {
    let (Ok(kernel), Ok(rootfs)) = (
        std::env::var("CH_LINUX_KERNEL"),
        std::env::var("CH_LINUX_ROOTFS"),
    ) else {
        eprintln!(
            "SKIPPED linux_guest_runs_fio: set CH_LINUX_KERNEL and CH_LINUX_ROOTFS \
             to boot a Linux guest (see docs/linux-guests.md)"
        );
        return;
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
