//! Structure and checksums of the ACPI tables, and (when `iasl` from
//! acpica-tools is installed) ACPICA's own disassembler as an oracle.

use super::*;

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}
fn sums_to_zero(b: &[u8]) -> bool {
    b.iter().fold(0u8, |a, x| a.wrapping_add(*x)) == 0
}

/// The table at `addr` among `all`.
fn at(all: &[(u64, Vec<u8>)], addr: u64) -> &[u8] {
    &all.iter()
        .find(|(a, _)| *a == addr)
        .expect("no table there")
        .1
}

#[test]
fn rsdp_xsdt_and_every_table_check_out() {
    for cpus in [1u8, 4, 64] {
        let all = build(ACPI_START, cpus);
        let rsdp = &all[0].1;
        assert_eq!(&rsdp[..8], b"RSD PTR ");
        assert!(sums_to_zero(&rsdp[..20]), "RSDP v1 checksum");
        assert!(sums_to_zero(rsdp), "RSDP extended checksum");
        assert_eq!(rsdp[15], 2);
        assert_eq!(u32_at(rsdp, 20), 36);
        let xsdt = at(&all, u64_at(rsdp, 24));
        assert_eq!(&xsdt[..4], b"XSDT");
        let mut sigs = Vec::new();
        for (addr, t) in &all[1..] {
            assert_eq!(u32_at(t, 4) as usize, t.len(), "length field");
            assert!(
                sums_to_zero(t),
                "{} checksum",
                String::from_utf8_lossy(&t[..4])
            );
            assert_eq!(addr % 16, 0);
            assert!(addr + t.len() as u64 <= ACPI_END);
        }
        for i in 0..(xsdt.len() - 36) / 8 {
            sigs.push(at(&all, u64_at(xsdt, 36 + 8 * i))[..4].to_vec());
        }
        assert_eq!(sigs, vec![b"FACP".to_vec(), b"APIC".to_vec()]);
        // No two tables overlap.
        for w in all.windows(2) {
            assert!(w[0].0 + w[0].1.len() as u64 <= w[1].0);
        }
    }
}

#[test]
fn fadt_is_hardware_reduced_with_reset_and_sleep_registers() {
    let all = build(ACPI_START, 2);
    let fadt = at(&all, u64_at(at(&all, all[1].0), 36));
    assert_eq!(fadt.len(), 276);
    let flags = u32_at(fadt, 112);
    assert_ne!(flags & (1 << 20), 0, "HW_REDUCED_ACPI");
    assert_ne!(flags & (1 << 10), 0, "RESET_REG_SUP");
    // Reset register: system I/O, 8 bits, byte access, our port.
    let pm = u64::from(crate::layout::ACPI_PM_PORT);
    assert_eq!(fadt[116..120], [1, 8, 0, 1]);
    assert_eq!(u64_at(fadt, 120), pm + 2);
    assert_eq!(fadt[128], crate::devices::acpi_pm_registers::RESET_VALUE);
    assert_eq!(u64_at(fadt, 248), pm, "sleep control");
    assert_eq!(u64_at(fadt, 260), pm + 1, "sleep status");
    let dsdt = at(&all, u64_at(fadt, 140));
    assert_eq!(&dsdt[..4], b"DSDT");
    assert_eq!(u64::from(u32_at(fadt, 40)), u64_at(fadt, 140));
}

#[test]
fn madt_lists_every_cpu_and_the_ioapic() {
    let cpus = 3;
    let all = build(ACPI_START, cpus);
    let madt = at(&all, u64_at(at(&all, all[1].0), 44));
    assert_eq!(u64::from(u32_at(madt, 36)), crate::layout::LAPIC_START);
    assert_eq!(u32_at(madt, 40), 1, "PCAT_COMPAT");
    let (mut lapics, mut ioapics, mut others) = (Vec::new(), Vec::new(), Vec::new());
    let mut o = 44;
    while o < madt.len() {
        let (kind, len) = (madt[o], usize::from(madt[o + 1]));
        assert!(len >= 2 && o + len <= madt.len(), "entry at {o}");
        match kind {
            0 => lapics.push((madt[o + 3], u32_at(madt, o + 4))),
            1 => ioapics.push((madt[o + 2], u32_at(madt, o + 4))),
            _ => others.push(madt[o..o + len].to_vec()),
        }
        o += len;
    }
    assert_eq!(o, madt.len());
    assert_eq!(lapics, vec![(0, 1), (1, 1), (2, 1)]);
    assert_eq!(
        ioapics,
        vec![(cpus, crate::layout::IOAPIC_START as u32)],
        "IOAPIC ID as in the MP table"
    );
    // ISA IRQ 0 is GSI 2 (as KVM wires it); NMI on LINT1 of every CPU.
    assert_eq!(
        others,
        vec![
            vec![2, 10, 0, 0, 2, 0, 0, 0, 0, 0],
            vec![4, 6, 0xff, 0, 0, 1]
        ]
    );
}

#[test]
fn tables_land_in_guest_memory() {
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 2 << 20)]).unwrap();
    let rsdp = write_tables(&mem, 2).unwrap();
    assert_eq!(rsdp, ACPI_START);
    let mut sig = [0u8; 8];
    mem.read_slice(&mut sig, GuestAddress(rsdp)).unwrap();
    assert_eq!(&sig, b"RSD PTR ");
}

/// ACPICA's disassembler reads every table back without complaint.
#[test]
fn iasl_disassembles_every_table() {
    if !testkit::available(
        "iasl (Debian package acpica-tools)",
        testkit::command("iasl"),
    ) {
        return;
    }
    let dir = std::env::temp_dir().join(format!("acpi-iasl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (_, t) in &build(ACPI_START, 2)[1..] {
        let sig = String::from_utf8_lossy(&t[..4]).to_string();
        let path = dir.join(format!("{sig}.dat"));
        std::fs::write(&path, t).unwrap();
        let out = testkit::output_within(
            std::process::Command::new("iasl")
                .arg("-d")
                .arg(&path)
                .current_dir(&dir),
            testkit::COMMAND_LIMIT,
        );
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "iasl -d {sig}: {text}");
        let dsl = std::fs::read_to_string(dir.join(format!("{sig}.dsl"))).unwrap();
        assert!(!dsl.contains("Incorrect checksum"), "{sig}: {dsl}");
        assert!(!dsl.to_lowercase().contains("error"), "{sig}: {dsl}");
        if sig == "DSDT" {
            for want in [
                "_S5_",
                "PNP0A03",
                "0xE0000000",
                "0xFEBFFFFF",
                "0x0CF8",
                "PNP0501",
                "0x03F8",
                "0x00000004",
                "ACPI0013",
                "_EVT",
                "PCNT",
                "_EJ0",
                "Device (S031)",
                "Notify (S001, Arg1)",
                "SystemIO, 0x0610",
            ] {
                assert!(dsl.contains(want), "DSDT lacks {want}: {dsl}");
            }
        }
    }
    if std::env::var_os("KEEP_ACPI").is_none() {
        std::fs::remove_dir_all(&dir).ok();
    }
}

/// ACPICA's interpreter runs the hotplug methods: DVNT notifies exactly
/// the slots whose bits are set with the type given, the GED's `_EVT`
/// and a slot's `_EJ0` run without an error; `_EVT` of the power-button
/// interrupt notifies `\_SB.PWRB` with 0x80 (pressed).
#[test]
fn acpiexec_runs_the_hotplug_methods() {
    if !testkit::available(
        "acpiexec (Debian package acpica-tools)",
        testkit::command("acpiexec"),
    ) {
        return;
    }
    let dir = std::env::temp_dir().join(format!("acpi-exec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("DSDT.dat");
    std::fs::write(&path, tables::dsdt()).unwrap();
    let script = "execute \\_SB.PCI0.DVNT 0x0c 3; execute \\_SB.PCI0.DVNT 0x80000002 1; \
                  execute \\_SB.GED_._EVT 5; execute \\_SB.PCI0.S002._EJ0 0; \
                  execute \\_SB.GED_._EVT 6";
    let out = testkit::output_within(
        std::process::Command::new("acpiexec")
            .args(["-b", script])
            .arg(&path),
        testkit::COMMAND_LIMIT,
    );
    std::fs::remove_dir_all(&dir).ok();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    let notifies: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("Received a System Notify"))
        .collect();
    assert_eq!(notifies.len(), 4, "{text}");
    // 0x80 and up are the device's own notifies (for a button: pressed).
    let button: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("Received a Device Notify"))
        .collect();
    assert_eq!(button.len(), 1, "{text}");
    assert!(
        button[0].contains("[PWRB]") && button[0].contains("Value 0x80"),
        "the power button: {text}"
    );
    for (slot, kind) in [
        ("S002", "Eject Request"),
        ("S003", "Eject Request"),
        ("S001", "Device Check"),
        ("S031", "Device Check"),
    ] {
        assert!(
            notifies
                .iter()
                .any(|l| l.contains(slot) && l.contains(kind)),
            "{slot} {kind}: {text}"
        );
    }
    assert!(!text.contains("AE_"), "an ACPICA exception: {text}");
}
