//! Allocating-write cost of the qcow2 metadata path, per L2 publication
//! mode. A benchmark that prints a table, not a test: run with
//! `cargo test -p block --release --test qcow2_bench -- --ignored --nocapture`.
//! Data goes through the tests' synchronous plan runner (pwrite), so the
//! numbers measure planning, metadata I/O and fdatasync barriers.

mod support;

use std::time::Instant;

use block::formats::qcow2::open_qcow2;
use block::formats::Format;
use support::*;

#[test]
#[ignore = "benchmark: prints a table"]
fn allocating_writes_per_second() {
    let d = temp_dir("bench");
    println!("| L2 publication | barriers | allocating 4 KiB writes/s |");
    println!("| --- | --- | --- |");
    for (write_through, barriers) in [(true, true), (false, true), (false, false)] {
        let mut rates = Vec::new();
        for round in 0..3 {
            let p = d.join(format!("b{round}.qcow2"));
            qemu_create("qcow2", p.to_str().unwrap(), "1G", "");
            let o = block::options::DiskOptions::new(&p);
            let file = block::formats::open::open_file(&o).unwrap();
            let img = open_qcow2(&o, file, &block::formats::FORMATS).unwrap();
            img.set_l2_write_through(write_through);
            img.set_write_barriers(barriers);
            let data = vec![1u8; 4096];
            let t = Instant::now();
            for i in 0..2000u64 {
                // Scattered over 16384 clusters: every write allocates.
                write(&img, (i * 7919 % 16384) * 65536, &data);
            }
            img.flush_metadata().unwrap();
            rates.push(2000.0 / t.elapsed().as_secs_f64());
            img.close().unwrap();
        }
        rates.sort_by(|a, b| a.total_cmp(b));
        let mode = if write_through {
            "every commit"
        } else {
            "at flush (default)"
        };
        println!(
            "| {mode} | {} | {:.0} (median of 3) |",
            if barriers { "on" } else { "off" },
            rates[1]
        );
    }
}
