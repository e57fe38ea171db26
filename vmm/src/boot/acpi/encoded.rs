//! AML already encoded, and encoding: `acpi_tables` builds its objects
//! from borrowed children, so each device of the DSDT is encoded by the
//! function that builds it and joins its parent as [`Encoded`] bytes.

use acpi_tables::{Aml, AmlSink};

/// Encoded AML that goes into a `Device` or `Scope` as it is.
pub struct Encoded(pub Vec<u8>);

impl Aml for Encoded {
    fn to_aml_bytes(&self, sink: &mut dyn AmlSink) {
        sink.vec(&self.0);
    }
}

/// The bytes of `items`, one after another.
pub fn encode(items: &[&dyn Aml]) -> Vec<u8> {
    let mut out = Vec::new();
    for item in items {
        item.to_aml_bytes(&mut out);
    }
    out
}
