//! The ACPI power button, as Cloud Hypervisor gives it to a guest: a
//! control-method power button device `\_SB.PWRB` (`PNP0C0C`) that the
//! Generic Event Device notifies (0x80, "the button was pressed") when
//! its power-button interrupt ([`POWER_BUTTON_IRQ`]) fires. A
//! hardware-reduced machine has no fixed power button (no PM1 event
//! block), so this is the one a guest's ACPI button driver finds.
//!
//! The handler also reads the GED event register
//! ([`crate::devices::ged`]), which clears its power-button bit, so the
//! register tells a guest without ACPI (the bare-metal test guest polls
//! it) the same thing the interrupt tells an ACPI one.
//!
//! Enters as the layout constants; leaves as the encoded device and
//! [`EVENT_HANDLER`], the method the GED calls.

use acpi_tables::aml::{
    Device, EISAName, Field, FieldAccessType, FieldEntry, FieldLockRule, FieldUpdateRule, Local,
    Method, Name, Notify, OpRegion, OpRegionSpace, Path, Store, ZERO,
};

use super::encoded::encode;
use crate::devices::ged::REGISTER_BYTES;
use crate::layout::GED_EVENT_PORT;
pub use crate::layout::POWER_BUTTON_IRQ;

/// The method the GED calls on a power-button interrupt.
pub const EVENT_HANDLER: &str = "\\_SB_.PWRB.PRES";

/// Notify value of a control-method power button: pressed (ACPI 6.5,
/// 4.8.3.1.1).
const BUTTON_PRESSED: u8 = 0x80;

/// `Device(PWRB)` with the event register's field and `PRES`.
pub fn device() -> Vec<u8> {
    let hid = Name::new("_HID".into(), &EISAName::new("PNP0C0C"));
    let uid = Name::new("_UID".into(), &ZERO);
    let port = u64::from(GED_EVENT_PORT);
    let len = REGISTER_BYTES;
    let region = OpRegion::new("GEDR".into(), OpRegionSpace::SystemIO, &port, &len);
    let field = Field::new(
        "GEDR".into(),
        FieldAccessType::DWord,
        FieldLockRule::NoLock,
        FieldUpdateRule::WriteAsZeroes,
        vec![FieldEntry::Named(*b"GEDS", 32)],
    );
    // Read (and so clear) the register, then tell the OS.
    let geds = Path::new("GEDS");
    let clear = Store::new(&Local(0), &geds);
    let me = Path::new("\\_SB_.PWRB");
    let pressed = BUTTON_PRESSED;
    let notify = Notify::new(&me, &pressed);
    let pres = Method::new("PRES".into(), 0, true, vec![&clear, &notify]);
    encode(&[&Device::new(
        "PWRB".into(),
        vec![&hid, &uid, &region, &field, &pres],
    )])
}
