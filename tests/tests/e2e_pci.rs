//! End-to-end: a guest that moves a virtio-pci BAR. A hand-assembled PVH
//! guest turns memory decoding off on 00:01.0, programs BAR 0 at a new
//! address, turns decoding back on, and writes the notify registers at
//! the new place. The VMM must move the KVM ioeventfds with the BAR: a
//! notify for an existing queue then never exits to the VMM (the
//! transport's debug log "notify reached the transport" stays silent for
//! it), while one for a queue that does not exist still does (a positive
//! control that the log would show a miss).

mod e2e_support;

use std::path::Path;

use e2e_support::*;
use integration_tests::TempDir;

/// 32-bit: `mov dx, 0xcf8; mov eax, addr; out dx, eax; mov dx, 0xcfc`.
fn select_config(reg: u8) -> Vec<u8> {
    let addr = 0x8000_0800u32 | u32::from(reg); // bus 0, device 1, function 0
    let mut c = vec![0x66, 0xba, 0xf8, 0x0c, 0xb8];
    c.extend_from_slice(&addr.to_le_bytes());
    c.extend_from_slice(&[0xef, 0x66, 0xba, 0xfc, 0x0c]);
    c
}

/// 32-bit: `mov eax, value; out dx, eax` (or `out dx, ax` if `word`).
fn out_value(value: u32, word: bool) -> Vec<u8> {
    let mut c = vec![0xb8];
    c.extend_from_slice(&value.to_le_bytes());
    if word {
        c.push(0x66);
    }
    c.push(0xef);
    c
}

/// 32-bit: `mov eax, addr; mov word [eax], cx`.
fn write_word_at(addr: u32) -> Vec<u8> {
    let mut c = vec![0xb8];
    c.extend_from_slice(&addr.to_le_bytes());
    c.extend_from_slice(&[0x66, 0x89, 0x08]);
    c
}

#[test]
fn notify_ioeventfds_follow_a_moved_bar() {
    const NEW_BAR: u32 = 0xe010_0000;
    let dir = TempDir::new("e2e-bar-move");
    let mut code = vec![0x31, 0xc9]; // xor ecx, ecx
    code.extend(select_config(0x04));
    code.extend(out_value(0, true)); // command: decoding off
    code.extend(select_config(0x10));
    code.extend(out_value(NEW_BAR, false)); // BAR 0
    code.extend(select_config(0x04));
    code.extend(out_value(6, true)); // memory decoding + bus master
    code.extend(write_word_at(NEW_BAR + 0x3000)); // queue 0 notify
    code.extend(write_word_at(NEW_BAR + 0x3004)); // queue 1 notify
    code.extend(write_word_at(NEW_BAR + 0x3000 + 4 * 5)); // no queue 5
    code = hello_then(&code);
    code.extend_from_slice(ACPI_POWEROFF);
    let k = dir.file("bar.elf");
    std::fs::write(&k, pvh_elf(&code)).unwrap();
    let img = dir.file("d.raw");
    std::fs::write(&img, vec![0u8; 1 << 20]).unwrap();
    let disk = format!("path={img},num_queues=2");
    let b = boot(&dir, Path::new(&k), &["-vv", "--disk", &disk]);
    assert_eq!(b.serial, "Hi\n", "stderr: {}", b.stderr);
    assert!(b.status.success(), "{}: {}", b.status, b.stderr);
    assert!(
        b.stderr
            .contains("BAR 0 moved from 0xe0000000 to 0xe0100000"),
        "{}",
        b.stderr
    );
    assert!(
        b.stderr.contains("queue 5 notify reached the transport"),
        "positive control: {}",
        b.stderr
    );
    for q in [0, 1] {
        assert!(
            !b.stderr
                .contains(&format!("queue {q} notify reached the transport")),
            "queue {q}'s notify exited to the VMM: {}",
            b.stderr
        );
    }
}
