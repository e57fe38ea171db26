//! The DSDT's ACPI PCI hotplug, as Cloud Hypervisor lays it out on x86:
//! a Generic Event Device (`\_SB.GED_`, ACPI0013, an edge interrupt on
//! [`crate::layout::GED_IRQ`]) whose `_EVT` calls `\_SB.PCI0.PCNT`; `PCNT` reads the
//! hotplug registers ([`crate::devices::pci_hotplug`]) and notifies each
//! slot device `S001`..`S031` that changed: Device Check (1) for a slot
//! that got a function, Eject Request (3) for one the VMM wants back. A
//! slot's `_EJ0` writes its bit to the eject register (`PCEJ`), which is
//! when the VMM takes the function off the bus.
//!
//! The bytes go inside the `PCI0` device that [`super::dsdt`] builds;
//! [`EVENT_HANDLER`] is what the GED ([`super::ged`]) calls.

use acpi_tables::aml::{
    And, Arg, Device, Field, FieldAccessType, FieldEntry, FieldLockRule, FieldUpdateRule, If,
    Local, Method, MethodCall, Name, Notify, OpRegion, OpRegionSpace, Path, ShiftLeft, Store, ZERO,
};
use acpi_tables::Aml;

use super::encoded::encode;
use crate::devices::pci::MAX_DEVICES;
use crate::devices::pci_hotplug::REGISTER_BYTES;
use crate::layout::PCI_HOTPLUG_PORT;

/// The method the GED calls on a hotplug interrupt.
pub const EVENT_HANDLER: &str = "\\_SB_.PCI0.PCNT";

/// Notify values (ACPI 6.5, table 5.166).
const DEVICE_CHECK: u8 = 1;
const EJECT_REQUEST: u8 = 3;

fn slot_name(slot: usize) -> String {
    format!("S{slot:03}")
}

/// What goes inside `Device(PCI0)`: the register fields, `PCEJ`, `PCNT`,
/// `DVNT` and one device per slot.
pub fn pci0_body() -> Vec<u8> {
    let port = u64::from(PCI_HOTPLUG_PORT);
    let len = REGISTER_BYTES;
    let region = OpRegion::new("PCST".into(), OpRegionSpace::SystemIO, &port, &len);
    let field = Field::new(
        "PCST".into(),
        FieldAccessType::DWord,
        FieldLockRule::NoLock,
        FieldUpdateRule::WriteAsZeroes,
        vec![
            FieldEntry::Named(*b"PCIU", 32),
            FieldEntry::Named(*b"PCID", 32),
            FieldEntry::Named(*b"B0EJ", 32),
        ],
    );
    // PCEJ(slot): B0EJ = 1 << slot.
    let one = 1u8;
    let (b0ej, pciu, pcid) = (Path::new("B0EJ"), Path::new("PCIU"), Path::new("PCID"));
    let shifted = ShiftLeft::new(&b0ej, &one, &Arg(0));
    let pcej = Method::new("PCEJ".into(), 1, true, vec![&shifted]);
    // PCNT: read both (read-to-clear) registers once, then notify.
    let up = Store::new(&Local(0), &pciu);
    let down = Store::new(&Local(1), &pcid);
    let check = DEVICE_CHECK;
    let eject = EJECT_REQUEST;
    let notify_up = MethodCall::new("DVNT".into(), vec![&Local(0), &check]);
    let notify_down = MethodCall::new("DVNT".into(), vec![&Local(1), &eject]);
    let pcnt = Method::new(
        "PCNT".into(),
        0,
        true,
        vec![&up, &down, &notify_up, &notify_down],
    );
    // DVNT(bitmap, type): Notify(Sxx, type) for every slot bit set.
    let slots: Vec<usize> = (1..MAX_DEVICES).collect();
    let masks: Vec<u32> = slots.iter().map(|&s| 1u32 << s).collect();
    let paths: Vec<Path> = slots.iter().map(|&s| Path::new(&slot_name(s))).collect();
    let tests: Vec<And> = masks.iter().map(|m| And::new(&ZERO, &Arg(0), m)).collect();
    let notifies: Vec<Notify> = paths.iter().map(|p| Notify::new(p, &Arg(1))).collect();
    let ifs: Vec<If> = tests
        .iter()
        .zip(&notifies)
        .map(|(t, n)| If::new(t, vec![n]))
        .collect();
    let dvnt = Method::new(
        "DVNT".into(),
        2,
        false,
        ifs.iter().map(|i| i as &dyn Aml).collect(),
    );
    let mut out = encode(&[&region, &field, &pcej, &pcnt, &dvnt]);
    let sun_path = Path::new("_SUN");
    for &slot in &slots {
        let adr = (slot as u32) << 16;
        let sun = slot as u32;
        let adr_name = Name::new("_ADR".into(), &adr);
        let sun_name = Name::new("_SUN".into(), &sun);
        let call = MethodCall::new("PCEJ".into(), vec![&sun_path]);
        let ej0 = Method::new("_EJ0".into(), 1, false, vec![&call]);
        let dev = Device::new(
            slot_name(slot).as_str().into(),
            vec![&adr_name, &sun_name, &ej0],
        );
        dev.to_aml_bytes(&mut out);
    }
    out
}
