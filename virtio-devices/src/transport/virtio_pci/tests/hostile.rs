//! Hostile guest accesses thrown at a [`VirtioPciDevice`]: every BAR 0
//! region and config-space offset with every access size (including 0,
//! odd and oversized ones), out-of-range queue selectors and vectors,
//! queue sizes that are not powers of two or exceed the maximum, ring
//! addresses outside guest memory, notifies to queues that do not exist,
//! and a long pseudo-random access sequence. After each, the register
//! state must stay sane, and afterwards a well-behaved driver must still
//! bring the device up.

use super::*;

/// Access sizes a vCPU exit or a confused driver can produce.
const SIZES: &[usize] = &[0, 1, 2, 3, 4, 5, 7, 8, 16];

/// BAR 0 offsets at region edges and inside each region.
fn bar_offsets() -> Vec<u64> {
    let mut v: Vec<u64> = (0..0x40).collect();
    for edge in [
        ISR_OFFSET,
        DEVICE_CFG_OFFSET,
        NOTIFY_OFFSET,
        MSIX_TABLE_OFFSET,
        MSIX_PBA_OFFSET,
        u64::from(BAR_SIZE),
    ] {
        v.extend([edge - 3, edge - 2, edge - 1, edge, edge + 1, edge + 3]);
    }
    // Past the last queue's notify slot, the last MSI-X entry, the end
    // of the PBA word, and offsets no BAR can have.
    v.extend([
        NOTIFY_OFFSET + 4 * 2,
        NOTIFY_OFFSET + 4 * 1000,
        MSIX_TABLE_OFFSET + 16 * 3,
        MSIX_TABLE_OFFSET + 16 * 3 + 12,
        MSIX_PBA_OFFSET - 4,
        MSIX_PBA_OFFSET + 7,
        MSIX_PBA_OFFSET + 8,
        u64::from(u32::MAX),
        u64::MAX - 7,
        u64::MAX,
    ]);
    v
}

/// The invariants no guest access may break.
fn assert_sane(d: &mut VirtioPciDevice, what: &str) {
    for (i, q) in d.common.queues.iter().enumerate() {
        assert!(
            q.size.is_power_of_two() && q.size <= q.max_size,
            "{what}: queue {i} size {} (max {})",
            q.size,
            q.max_size
        );
        assert_eq!(q.max_size, 64, "{what}: queue {i} max size changed");
    }
    assert_eq!(d.common.queues.len(), 2, "{what}: queue count changed");
    assert_eq!(d.kicks.len(), 2, "{what}: kick slots");
    for q in 0..2 {
        let v = d.msix.queue_vector(q);
        assert!(v == 0xffff || v < 3, "{what}: queue {q} vector {v}");
    }
    let v = d.msix.config_vector();
    assert!(v == 0xffff || v < 3, "{what}: config vector {v}");
    assert_eq!(d.bar_range().1, u64::from(BAR_SIZE), "{what}: BAR size");
}

/// Programs queue 0's size and ring addresses and enables it.
fn enable_queue0(d: &mut VirtioPciDevice, size: u16, (desc, driver, device): (u64, u64, u64)) {
    bar_w(d, 0x16, &0u16.to_le_bytes());
    bar_w(d, 0x18, &size.to_le_bytes());
    bar_w(d, 0x20, &desc.to_le_bytes());
    bar_w(d, 0x28, &driver.to_le_bytes());
    bar_w(d, 0x30, &device.to_le_bytes());
    bar_w(d, 0x1c, &1u16.to_le_bytes());
}

/// A clean driver bring-up of queue 0 after the device was abused: reset,
/// negotiate, program, DRIVER_OK; the device must activate with exactly
/// what was programmed.
fn assert_clean_bring_up_works(r: &mut Rig) {
    let before = r.rec.lock().unwrap().activated.len();
    let d = &mut r.dev;
    // Memory decoding on, BAR back where it started.
    d.config_write(0x10, &0xe000_0000u32.to_le_bytes());
    d.config_write(0x04, &6u16.to_le_bytes());
    bar_w(d, 0x14, &[0]);
    let mut st = [0u8];
    d.bar_read(0x14, &mut st);
    assert_eq!(st[0], 0, "reset clears status");
    bar_w(d, 0x14, &[1 | 2]);
    bar_w(d, 0x08, &1u32.to_le_bytes());
    bar_w(d, 0x0c, &1u32.to_le_bytes());
    bar_w(d, 0x08, &0u32.to_le_bytes());
    bar_w(d, 0x0c, &0u32.to_le_bytes());
    bar_w(d, 0x14, &[1 | 2 | 8]);
    enable_queue0(d, 16, (0x4000, 0x5000, 0x6000));
    bar_w(d, 0x14, &[1 | 2 | 8 | 4]);
    d.bar_read(0x14, &mut st);
    assert_eq!(st[0], 1 | 2 | 8 | 4, "device accepted DRIVER_OK");
    let rec = r.rec.lock().unwrap();
    assert_eq!(rec.activated.len(), before + 1);
    assert_eq!(rec.activated.last(), Some(&(0, 16, 0x4000)));
}

#[test]
fn bar_accesses_of_every_size_and_offset() {
    let mut r = rig();
    for &off in &bar_offsets() {
        for &len in SIZES {
            for fill in [0x00u8, 0xff, 0xa5] {
                let mut buf = vec![0x5au8; len];
                r.dev.bar_read(off, &mut buf);
                let data = vec![fill; len];
                r.dev.bar_write(off, &data);
                assert_sane(
                    &mut r.dev,
                    &format!("bar {off:#x} len {len} fill {fill:#x}"),
                );
            }
        }
    }
    assert_clean_bring_up_works(&mut r);
}

#[test]
fn config_accesses_of_every_size_and_offset() {
    let mut r = rig();
    let cap = caps(&mut r.dev).iter().find(|x| x.1 == 5).unwrap().2;
    // Point the PCI-config-access window at odd places first.
    for (bar_off, len) in [(u32::MAX, 4u32), (0x14, 3), (0x4ffc, 4), (0x7fff, 2)] {
        r.dev.config_write(cap + 8, &bar_off.to_le_bytes());
        r.dev.config_write(cap + 12, &len.to_le_bytes());
        for &size in SIZES {
            let mut buf = vec![0u8; size];
            r.dev.config_read(cap + 16, &mut buf);
            r.dev.config_write(cap + 16, &vec![0xff; size]);
            r.dev.config_write(cap + 17, &vec![0xff; size]);
        }
    }
    // Everything but BAR 0 and the command register (kept for the
    // bring-up) with every size, including past the end of the space.
    let offsets = (0..0x10)
        .chain(0x14..0x104)
        .chain([usize::MAX - 1, usize::MAX]);
    for off in offsets {
        for &size in SIZES {
            for fill in [0x00u8, 0xff] {
                let mut buf = vec![0u8; size];
                r.dev.config_read(off, &mut buf);
                r.dev.config_write(off, &vec![fill; size]);
                assert_sane(&mut r.dev, &format!("config {off:#x} len {size}"));
            }
        }
    }
    // Read-only identity survived.
    assert_eq!(cfg32(&mut r.dev, 0), 0x1042_1af4);
    assert_clean_bring_up_works(&mut r);
}

#[test]
fn empty_writes_change_nothing() {
    let mut r = rig();
    let d = &mut r.dev;
    bar_w(d, 0x14, &[1 | 2]);
    bar_w(d, 0x14, &[]);
    let cap = caps(d).iter().find(|x| x.1 == 5).unwrap().2;
    // PCI-config-access window aimed at the status register with an
    // invalid length (0 after validation).
    d.config_write(cap + 8, &0x14u32.to_le_bytes());
    d.config_write(cap + 12, &3u32.to_le_bytes());
    d.config_write(cap + 16, &[0, 0, 0, 0]);
    let mut st = [0u8];
    d.bar_read(0x14, &mut st);
    assert_eq!(st[0], 1 | 2, "no reset from an empty write");
}

#[test]
fn common_config_hostile_values() {
    let mut r = rig();
    let d = &mut r.dev;
    bar_w(d, 0x14, &[1 | 2]);
    // queue_select far out of range: reads are zero / no vector, writes
    // go nowhere.
    bar_w(d, 0x16, &0xffffu16.to_le_bytes());
    for reg in [0x18u64, 0x1a, 0x1c, 0x1e, 0x20, 0x24, 0x28, 0x30] {
        bar_w(d, reg, &u64::MAX.to_le_bytes());
        let mut b = [0u8; 2];
        d.bar_read(reg, &mut b);
        let want = if reg == 0x1a { 0xffff } else { 0 };
        assert_eq!(u16::from_le_bytes(b), want, "reg {reg:#x} with no queue");
    }
    assert!(d.common.queues.iter().all(|q| !q.enabled));
    // Queue sizes: zero, not a power of two, larger than the maximum.
    bar_w(d, 0x16, &1u16.to_le_bytes());
    for bad in [0u16, 3, 100, 128, 0x8000, 0xffff] {
        bar_w(d, 0x18, &bad.to_le_bytes());
        assert_eq!(d.common.queues[1].size, 64, "size {bad} refused");
    }
    bar_w(d, 0x18, &8u16.to_le_bytes());
    assert_eq!(d.common.queues[1].size, 8);
    // Vectors beyond the table read back as NO_VECTOR.
    for bad in [3u16, 0xfff0, 0xfffe] {
        bar_w(d, 0x1a, &bad.to_le_bytes());
        bar_w(d, 0x10, &bad.to_le_bytes());
        assert_eq!(d.msix.queue_vector(1), 0xffff);
        assert_eq!(d.msix.config_vector(), 0xffff);
    }
    // Notifies to queues that do not exist are dropped.
    for q in [2u64, 3, 1000, 0x3ff] {
        bar_w(d, NOTIFY_OFFSET + 4 * q, &(q as u16).to_le_bytes());
    }
    assert!(r.dev.kick_clones.iter().all(|k| k.read().is_err()));
    assert_sane(&mut r.dev, "common config");
    assert_clean_bring_up_works(&mut r);
}

#[test]
fn rings_outside_guest_memory_fail_activation_then_recover() {
    // Guest memory is 1 MiB at 0: rings straddling its end, beyond it,
    // and at addresses that overflow when the ring size is added.
    let bad = [
        (0xf_fff0u64, 0x2000u64, 0x3000u64),
        (0x1000, 0x10_0000, 0x3000),
        (0x1000, 0x2000, 0xffff_ffff_ffff_f000),
        (u64::MAX, 0x2000, 0x3000),
        // Misaligned (descriptor table 16, driver area 2, device area 4).
        (0x1008, 0x2000, 0x3000),
        (0x1000, 0x2001, 0x3000),
        (0x1000, 0x2000, 0x3002),
    ];
    let mut r = rig();
    for (desc, driver, device) in bad {
        let d = &mut r.dev;
        bar_w(d, 0x14, &[0]);
        bar_w(d, 0x14, &[1 | 2]);
        bar_w(d, 0x08, &1u32.to_le_bytes());
        bar_w(d, 0x0c, &1u32.to_le_bytes());
        bar_w(d, 0x14, &[1 | 2 | 8]);
        enable_queue0(d, 64, (desc, driver, device));
        bar_w(d, 0x14, &[1 | 2 | 8 | 4]);
        let mut st = [0u8];
        d.bar_read(0x14, &mut st);
        assert_ne!(
            st[0] & STATUS_NEEDS_RESET,
            0,
            "rings {desc:#x}/{driver:#x}/{device:#x}"
        );
        assert!(r.rec.lock().unwrap().activated.is_empty());
        assert!(r.dev.kicks.iter().all(Option::is_some), "kicks kept");
    }
    assert_clean_bring_up_works(&mut r);
}

#[test]
fn driver_ok_without_enabled_queues_or_features_does_not_activate() {
    let mut r = rig();
    let d = &mut r.dev;
    // DRIVER_OK before FEATURES_OK, and FEATURES_OK without VERSION_1.
    bar_w(d, 0x14, &[1 | 2 | 4]);
    bar_w(d, 0x14, &[1 | 2 | 8 | 4]);
    let mut st = [0u8];
    d.bar_read(0x14, &mut st);
    assert_eq!(st[0] & 8, 0, "FEATURES_OK refused without VERSION_1");
    // Features fine, but no queue enabled.
    bar_w(d, 0x14, &[0]);
    bar_w(d, 0x08, &1u32.to_le_bytes());
    bar_w(d, 0x0c, &1u32.to_le_bytes());
    bar_w(d, 0x14, &[1 | 2 | 8 | 4]);
    d.bar_read(0x14, &mut st);
    assert_ne!(st[0] & STATUS_NEEDS_RESET, 0);
    assert!(r.rec.lock().unwrap().activated.is_empty());
    assert_clean_bring_up_works(&mut r);
}

#[test]
fn random_access_storm_keeps_state_sane() {
    let mut r = rig();
    // A fixed-seed xorshift: reproducible, no extra dependency.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..20_000 {
        let pick = next();
        let len = SIZES[(pick % SIZES.len() as u64) as usize];
        let data = next().to_le_bytes().repeat(2);
        let data = &data[..len];
        match (pick >> 8) % 4 {
            0 => r.dev.bar_write(next() % 0x8010, data),
            // Mostly the registers with side effects.
            1 => r.dev.bar_write(next() % 0x40, data),
            2 => {
                let mut b = vec![0u8; len];
                r.dev.bar_read(next() % 0x8010, &mut b);
            }
            _ => {
                let off = (next() % 0x110) as usize;
                // Keep BAR 0 and the command register, which would turn
                // the rest of the run into decoding-off no-ops.
                if !(0x04..0x06).contains(&off) && !(0x10..0x14).contains(&off) {
                    r.dev.config_write(off, data);
                }
            }
        }
        if i % 64 == 0 {
            assert_sane(&mut r.dev, &format!("step {i}"));
        }
    }
    assert_sane(&mut r.dev, "end");
    assert_clean_bring_up_works(&mut r);
}

#[test]
fn moving_the_bar_reports_the_notify_move_once_decoding_is_on() {
    let mut r = rig();
    let d = &mut r.dev;
    let at = |d: &VirtioPciDevice| -> Vec<u64> {
        d.notify_eventfds()
            .unwrap()
            .into_iter()
            .map(|(a, _)| a)
            .collect()
    };
    assert_eq!(at(d), vec![0xe000_3000, 0xe000_3004]);
    // Sizing and reprogramming with decoding off: nothing to move yet.
    assert_eq!(d.config_write(0x10, &[0xff; 4]), None);
    assert_eq!(d.config_write(0x10, &0xe010_0000u32.to_le_bytes()), None);
    assert_eq!(at(d), vec![0xe000_3000, 0xe000_3004]);
    // Decoding on: the move is reported once.
    assert_eq!(
        d.config_write(0x04, &2u16.to_le_bytes()),
        Some(BarMoved {
            old: 0xe000_0000,
            new: 0xe010_0000
        })
    );
    assert_eq!(d.config_write(0x04, &6u16.to_le_bytes()), None);
    assert_eq!(at(d), vec![0xe010_3000, 0xe010_3004]);
    // A move while decoding is on is reported by the BAR write itself,
    // also when it comes as a single byte; rewriting the same address
    // is not a move.
    assert_eq!(
        d.config_write(0x12, &[0x30]),
        Some(BarMoved {
            old: 0xe010_0000,
            new: 0xe030_0000
        })
    );
    assert_eq!(d.config_write(0x10, &0xe030_0000u32.to_le_bytes()), None);
    // The old addresses can still be listed to unregister them, and the
    // eventfds are clones of the ones the device gets.
    let old = d.notify_eventfds_at(0xe010_0000).unwrap();
    assert_eq!(old[1].0, 0xe010_3004);
    old[1].1.write(1).unwrap();
    assert_eq!(d.kick_clones[1].read().unwrap(), 1);
    // A notify write at the new place still kicks the queue.
    assert_eq!(d.bar_range().0, 0xe030_0000);
    bar_w(d, NOTIFY_OFFSET + 4, &1u16.to_le_bytes());
    assert_eq!(d.kick_clones[1].read().unwrap(), 1);
}
