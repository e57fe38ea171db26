//! The Generic Event Device (`\_SB.GED_`, ACPI0013; ACPI 6.5, 5.6.9): an
//! edge-triggered interrupt per event in its `_CRS`, and an `_EVT`
//! method that, given the interrupt that fired, calls that event's
//! handler. A hardware-reduced machine has no GPE blocks, so this is how
//! the VMM tells the guest something happened (a hotplug slot changed,
//! the power button was pressed).
//!
//! Enters as the list of events ([`GedEvent`]: interrupt and handler
//! method); leaves as the encoded device, for the `\_SB` scope.

use acpi_tables::aml::{
    Arg, Device, Equal, If, Interrupt, Method, MethodCall, Name, ResourceTemplate, ZERO,
};
use acpi_tables::Aml;

use super::encoded::encode;

/// One event the GED signals: its interrupt (GSI) and the method `_EVT`
/// calls for it (a full path, such as `\_SB_.PCI0.PCNT`).
pub struct GedEvent {
    pub irq: u32,
    pub handler: &'static str,
}

/// `Device(GED_)` with one interrupt and one `_EVT` branch per event.
pub fn device(events: &[GedEvent]) -> Vec<u8> {
    let hid = Name::new("_HID".into(), &"ACPI0013");
    let uid = Name::new("_UID".into(), &ZERO);
    // Consumer, edge-triggered, active high, exclusive.
    let irqs: Vec<Interrupt> = events
        .iter()
        .map(|e| Interrupt::new(true, true, false, false, e.irq))
        .collect();
    let resources = ResourceTemplate::new(irqs.iter().map(|i| i as &dyn Aml).collect());
    let crs = Name::new("_CRS".into(), &resources);
    let calls: Vec<MethodCall> = events
        .iter()
        .map(|e| MethodCall::new(e.handler.into(), vec![]))
        .collect();
    let fired: Vec<Equal> = events.iter().map(|e| Equal::new(&Arg(0), &e.irq)).collect();
    let branches: Vec<If> = fired
        .iter()
        .zip(&calls)
        .map(|(test, call)| If::new(test, vec![call]))
        .collect();
    let evt = Method::new(
        "_EVT".into(),
        1,
        true,
        branches.iter().map(|b| b as &dyn Aml).collect(),
    );
    encode(&[&Device::new("GED_".into(), vec![&hid, &uid, &crs, &evt])])
}
