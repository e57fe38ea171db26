//! Fuzzes what an NBD server reads from a client: the handshake
//! (`nbd::server::negotiate_offering_bitmaps`, when the first byte's top
//! bit is set; the export offers two `qemu:dirty-bitmap:` contexts when
//! bit 6 is set too) or the transmission-phase request parser, fed in
//! pieces of a size the input chooses. Nothing may panic, a session
//! selects only contexts the export offers (each once, `base:allocation`
//! first), and every request the parser accepts must fit the export and
//! the rules it was given.

#![no_main]

use std::io::{Read, Write};

use libfuzzer_sys::fuzz_target;
use nbd::server::{
    negotiate_offering_bitmaps, Command, ExportDesc, MetaContext, Negotiated, Parsed,
    RequestParser, Rules,
};
use nbd::wire::consts::{cmd_flag, flag};

/// A client whose bytes are the input; what the server says is dropped.
struct Client<'a>(&'a [u8]);

impl Read for Client<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Client<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let (knobs, input) = data.split_at(4);
    if knobs[0] & 0x80 != 0 {
        let export = ExportDesc {
            name: "disk".into(),
            description: Some("fuzz".into()),
            size: 1 << 20,
            flags: flag::HAS_FLAGS | flag::SEND_FLUSH,
            block_sizes: [1, 4096, 1 << 16],
        };
        let bitmaps = match knobs[0] & 0x40 {
            0 => Vec::new(),
            _ => vec!["b0".to_string(), "disk-bitmap".to_string()],
        };
        if let Ok(Negotiated::Go(session)) =
            negotiate_offering_bitmaps(&mut Client(input), &export, &bitmaps)
        {
            let contexts = session.contexts();
            let mut ids: Vec<u32> = contexts.iter().map(|c| c.id()).collect();
            ids.dedup();
            assert_eq!(ids.len(), contexts.len(), "a context selected twice");
            for (i, c) in contexts.iter().enumerate() {
                match c {
                    MetaContext::BaseAllocation => assert_eq!(i, 0),
                    MetaContext::DirtyBitmap(n) => assert!((*n as usize) < bitmaps.len()),
                }
            }
            assert!(contexts.is_empty() || session.structured);
            assert_eq!(session.block_status(), !contexts.is_empty());
        }
        return;
    }
    let rules = Rules {
        size: u64::from(u16::from_le_bytes([knobs[1], knobs[2]])) * 512,
        writable: knobs[0] & 1 != 0,
        structured: knobs[0] & 2 != 0,
        block_status: knobs[0] & 4 != 0,
        max_payload: 1 << 16,
    };
    let step = usize::from(knobs[3]).max(1);
    let mut parser = RequestParser::new(rules);
    let mut out = Vec::new();
    for piece in input.chunks(step) {
        if parser.feed(piece, &mut out).is_err() {
            break;
        }
    }
    for p in out {
        let Parsed::Request(r) = p else { continue };
        assert!(
            r.offset + u64::from(r.len) <= rules.size,
            "a request past the end"
        );
        match &r.command {
            Command::Write(d) => {
                assert_eq!(d.len(), r.len as usize);
                assert!(rules.writable && r.len <= rules.max_payload);
            }
            Command::Trim | Command::WriteZeroes => assert!(rules.writable),
            Command::Read | Command::Cache => assert!(r.len <= rules.max_payload),
            Command::BlockStatus => assert!(rules.block_status && r.len > 0),
            Command::Flush => {}
        }
        if r.has(cmd_flag::DF) {
            assert!(rules.structured && r.command == Command::Read);
        }
    }
});
