//! Command-line options of `blk-bench`, parsed by hand (no dependency).
//!
//! Data enters as `std::env::args()`; it leaves as a checked [`Options`].
//! Every error names the option that was wrong.

use std::path::PathBuf;

use block::formats::FORMATS;
use block::{EngineKind, ImageType};
use ch_util::size::parse_size;

pub const USAGE: &str = "\
blk-bench: drive the real virtio-blk device (worker threads, split virtqueues
in guest memory, eventfds) from a host-side driver and measure it.

Usage: blk-bench --image PATH [options]

  --image PATH           image to run against (required)
  --format F             auto|raw|qcow2 (default auto)
  --engine E             auto|io_uring|aio|threads|sync (default auto)
  --direct on|off        O_DIRECT on the image files (default on)
  --queues N             virtqueues, one driver thread each (default 1)
  --qd N                 requests kept in flight per queue (default 1)
  --bs BYTES             request size; k/m suffixes allowed (default 4k)
  --rw P                 randread|randwrite|read|write (default randread)
  --runtime SECS         run time (default 5)
  --io-size BYTES        stop after this many bytes per queue instead
  --think-us N           driver think time before each batch and after
                         each completion (default 0)
  --batch N              requests posted per batch in think mode
                         (default: qd)
  --queue-size N         virtqueue size (default 256)
  --poll-us N            ceiling of the device workers' adaptive spin
                         before they sleep (default 32, the device's
                         default; 0: off; at most 1000; --disk poll_us)
  --halt-poll-us N       driver spin for a pending interrupt before it
                         sleeps, as KVM halt-polls a halted vCPU (its
                         default halt_poll_ns is 200000; default 0: off;
                         at most 1000)
  --output json|table    result format (default table); --output=json works;
                         json also gives the kernel submit-call times
                         (submit_p50_us, submit_p99_us, submit_max_us);
                         both give CPU per request: the whole process,
                         less the drivers, and by thread kind (queue
                         workers, io-wq workers, drivers)
  --bitmap BYTES         add one enabled dirty bitmap of this granularity
                         (k/m suffixes) to the disk before the run: what
                         the write seam's marking costs (default: none)
  --compare-fio          run fio (io_uring, same --direct and pattern) and us
                         interleaved, --repeats times, and print medians,
                         CPU per request included: ours less the driver
                         threads (the guest's stand-in) against fio's
                         whole process (its io-wq workers included)
  --repeats N            repeats for --compare-fio (default 3)
  -h, --help             this text
";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    RandRead,
    RandWrite,
    Read,
    Write,
}

impl Pattern {
    pub fn is_write(self) -> bool {
        matches!(self, Pattern::RandWrite | Pattern::Write)
    }

    pub fn is_random(self) -> bool {
        matches!(self, Pattern::RandRead | Pattern::RandWrite)
    }

    pub fn fio_name(self) -> &'static str {
        match self {
            Pattern::RandRead => "randread",
            Pattern::RandWrite => "randwrite",
            Pattern::Read => "read",
            Pattern::Write => "write",
        }
    }
}

#[derive(Clone, Debug)]
pub struct Options {
    pub image: PathBuf,
    pub format: ImageType,
    pub engine: EngineKind,
    pub direct: bool,
    pub queues: u16,
    pub qd: u16,
    pub bs: u32,
    pub rw: Pattern,
    pub runtime_s: f64,
    pub io_size: Option<u64>,
    pub think_us: u64,
    pub batch: u16,
    pub queue_size: u16,
    pub poll_us: u32,
    pub halt_poll_us: u32,
    pub json: bool,
    pub compare_fio: bool,
    pub repeats: u32,
    /// Granularity of a dirty bitmap added before the run.
    pub bitmap: Option<u64>,
}

fn value<'a>(
    name: &str,
    inline: Option<&'a str>,
    it: &mut impl Iterator<Item = &'a String>,
) -> Result<&'a str, String> {
    match inline {
        Some(v) => Ok(v),
        None => it
            .next()
            .map(String::as_str)
            .ok_or_else(|| format!("{name} needs a value")),
    }
}

fn number<T: TryFrom<u64>>(name: &str, v: &str, min: u64) -> Result<T, String> {
    let n = parse_size(v).map_err(|_| format!("{name}: '{v}' is not a number"))?;
    if n < min {
        return Err(format!("{name}: must be at least {min}"));
    }
    T::try_from(n).map_err(|_| format!("{name}: {v} is too large"))
}

/// Parses the arguments after the program name. `Ok(None)` means --help.
pub fn parse(args: &[String]) -> Result<Option<Options>, String> {
    let mut o = Options {
        image: PathBuf::new(),
        format: ImageType::Auto,
        engine: EngineKind::Auto,
        direct: true,
        queues: 1,
        qd: 1,
        bs: 4096,
        rw: Pattern::RandRead,
        runtime_s: 5.0,
        io_size: None,
        think_us: 0,
        batch: 0,
        queue_size: 256,
        poll_us: virtio_devices::block::DEFAULT_POLL_US,
        halt_poll_us: 0,
        json: false,
        compare_fio: false,
        repeats: 3,
        bitmap: None,
    };
    let mut image = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v)),
            _ => (arg.as_str(), None),
        };
        match name {
            "-h" | "--help" => return Ok(None),
            "--image" => image = Some(PathBuf::from(value(name, inline, &mut it)?)),
            "--format" => {
                o.format = FORMATS
                    .parse_image_type(value(name, inline, &mut it)?)
                    .map_err(|e| format!("--format: {e}"))?
            }
            "--engine" => {
                o.engine = value(name, inline, &mut it)?
                    .parse()
                    .map_err(|e| format!("--engine: {e}"))?
            }
            "--direct" => {
                o.direct = match value(name, inline, &mut it)? {
                    "on" => true,
                    "off" => false,
                    v => return Err(format!("--direct: '{v}' (expected on or off)")),
                }
            }
            "--queues" => o.queues = number(name, value(name, inline, &mut it)?, 1)?,
            "--qd" => o.qd = number(name, value(name, inline, &mut it)?, 1)?,
            "--bs" => o.bs = number(name, value(name, inline, &mut it)?, 512)?,
            "--rw" => {
                o.rw = match value(name, inline, &mut it)? {
                    "randread" => Pattern::RandRead,
                    "randwrite" => Pattern::RandWrite,
                    "read" => Pattern::Read,
                    "write" => Pattern::Write,
                    v => {
                        return Err(format!(
                            "--rw: '{v}' (expected randread, randwrite, read or write)"
                        ))
                    }
                }
            }
            "--runtime" => {
                let v = value(name, inline, &mut it)?;
                o.runtime_s = v
                    .parse::<f64>()
                    .map_err(|_| format!("--runtime: '{v}' is not a number"))?;
                if !(o.runtime_s > 0.0 && o.runtime_s < 86400.0) {
                    return Err("--runtime: must be between 0 and 86400 seconds".into());
                }
            }
            "--io-size" => o.io_size = Some(number(name, value(name, inline, &mut it)?, 1)?),
            "--think-us" => o.think_us = number(name, value(name, inline, &mut it)?, 0)?,
            "--batch" => o.batch = number(name, value(name, inline, &mut it)?, 1)?,
            "--queue-size" => o.queue_size = number(name, value(name, inline, &mut it)?, 4)?,
            "--poll-us" | "--halt-poll-us" => {
                let us = number(name, value(name, inline, &mut it)?, 0)?;
                if us > 1000 {
                    return Err(format!("{name}: at most 1000"));
                }
                if name == "--poll-us" {
                    o.poll_us = us;
                } else {
                    o.halt_poll_us = us;
                }
            }
            "--output" => {
                o.json = match value(name, inline, &mut it)? {
                    "json" => true,
                    "table" => false,
                    v => return Err(format!("--output: '{v}' (expected json or table)")),
                }
            }
            "--bitmap" => o.bitmap = Some(number(name, value(name, inline, &mut it)?, 512)?),
            "--compare-fio" => o.compare_fio = true,
            "--repeats" => o.repeats = number(name, value(name, inline, &mut it)?, 1)?,
            other => return Err(format!("unknown option '{other}' (see --help)")),
        }
    }
    o.image = image.ok_or("--image is required")?;
    if !o.bs.is_multiple_of(512) {
        return Err("--bs: must be a multiple of 512".into());
    }
    if o.qd > 4096 || o.queues > 64 {
        return Err("--qd at most 4096 and --queues at most 64".into());
    }
    if !o.queue_size.is_power_of_two() {
        return Err("--queue-size: must be a power of two".into());
    }
    if o.batch == 0 {
        o.batch = o.qd;
    }
    o.batch = o.batch.min(o.qd);
    Ok(Some(o))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_sizes_and_options() {
        assert_eq!(number::<u32>("--bs", "128k", 1), Ok(128 << 10));
        assert_eq!(number::<u32>("--bs", "1M", 1), Ok(1 << 20));
        assert!(number::<u32>("--bs", "x", 1).is_err());
        let o = parse(&args(
            "--image a --qd 32 --bs=64k --rw read --output=json --queues 4 --poll-us 20 \
             --halt-poll-us=200",
        ))
        .unwrap()
        .unwrap();
        assert_eq!(
            (o.qd, o.bs, o.rw, o.json, o.queues, o.batch, o.poll_us),
            (32, 65536, Pattern::Read, true, 4, 32, 20)
        );
        assert_eq!(o.halt_poll_us, 200);
    }

    #[test]
    fn errors_name_the_option() {
        assert!(parse(&args("--image a --qd 0"))
            .unwrap_err()
            .contains("--qd"));
        assert!(parse(&args("--image a --bs 100"))
            .unwrap_err()
            .contains("--bs"));
        assert!(parse(&args("--image a --rw mixed"))
            .unwrap_err()
            .contains("--rw"));
        assert!(parse(&args("--image a --poll-us 1001"))
            .unwrap_err()
            .contains("--poll-us"));
        assert!(parse(&args("--image a --halt-poll-us 1001"))
            .unwrap_err()
            .contains("--halt-poll-us"));
        assert!(parse(&args("--qd 1")).unwrap_err().contains("--image"));
        assert!(parse(&args("--image a --bogus"))
            .unwrap_err()
            .contains("--bogus"));
        assert!(parse(&args("--help")).unwrap().is_none());
        let o = parse(&args("--image a --bitmap 64k")).unwrap().unwrap();
        assert_eq!(o.bitmap, Some(65536));
        assert!(parse(&args("--image a --bitmap 100"))
            .unwrap_err()
            .contains("--bitmap"));
    }
}
