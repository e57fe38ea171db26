//! qemu-img's JSON layout for serde_json: four-space indentation, one
//! value per line, and an empty array written as `[`, a newline and the
//! closing bracket at the array's indentation (serde_json's pretty printer
//! writes `[]`; qemu-img 7.2 lists a bitmap without flags that way).

use std::io::{self, Write};

use serde_json::ser::Formatter;

/// See the module docs.
#[derive(Default)]
pub struct QemuJson {
    depth: usize,
    /// Whether the innermost object being written has a member yet.
    has_value: bool,
}

fn indent<W: ?Sized + Write>(w: &mut W, depth: usize) -> io::Result<()> {
    for _ in 0..depth {
        w.write_all(b"    ")?;
    }
    Ok(())
}

impl Formatter for QemuJson {
    fn begin_array<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.depth += 1;
        w.write_all(b"[")
    }

    fn end_array<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.depth -= 1;
        w.write_all(b"\n")?;
        indent(w, self.depth)?;
        w.write_all(b"]")
    }

    fn begin_array_value<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        w.write_all(if first { b"\n" } else { b",\n" })?;
        indent(w, self.depth)
    }

    fn end_array_value<W: ?Sized + Write>(&mut self, _w: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn begin_object<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        w.write_all(b"{")
    }

    fn end_object<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.depth -= 1;
        if self.has_value {
            w.write_all(b"\n")?;
            indent(w, self.depth)?;
        }
        w.write_all(b"}")
    }

    fn begin_object_key<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        w.write_all(if first { b"\n" } else { b",\n" })?;
        indent(w, self.depth)
    }

    fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }

    fn end_object_value<W: ?Sized + Write>(&mut self, _w: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(v: &serde_json::Value) -> String {
        let mut out = Vec::new();
        let mut ser = serde_json::Serializer::with_formatter(&mut out, QemuJson::default());
        serde::Serialize::serialize(v, &mut ser).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn nested_values_and_empty_containers() {
        let v = json!({"a": [{"flags": [], "n": 1}, {"flags": ["x"]}], "e": {}, "s": "[]"});
        assert_eq!(
            render(&v),
            "{\n    \"a\": [\n        {\n            \"flags\": [\n            ],\n            \"n\": 1\n        },\n        {\n            \"flags\": [\n                \"x\"\n            ]\n        }\n    ],\n    \"e\": {},\n    \"s\": \"[]\"\n}"
        );
    }
}
