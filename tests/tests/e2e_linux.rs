//! End-to-end with a real Linux guest under our own VMM: runs
//! scripts/run-linux-guest.sh, which boots the kernel and initramfs of
//! scripts/build-linux-guest.sh (the ones tests/tests/linux_guest.rs boots
//! under QEMU) under cloud-hypervisor and checks what /init reports about
//! its virtio-blk disk (fio with verify, ext4, discard). It needs a host
//! whose KVM runs guest code natively, so it is `#[ignore]`d: on the
//! development machines guest code is emulated and a Linux boot does not
//! finish in useful time. On a real KVM host:
//! `cargo test -p integration-tests --test e2e_linux -- --ignored`.

use std::path::Path;
use std::process::Command;

#[test]
#[ignore = "needs a real KVM host (docs/linux-guests.md)"]
fn linux_guest_runs_fio() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/run-linux-guest.sh");
    let status = Command::new("bash")
        .arg(script)
        .status()
        .expect("run scripts/run-linux-guest.sh");
    assert!(status.success(), "run-linux-guest.sh failed: {status}");
}
