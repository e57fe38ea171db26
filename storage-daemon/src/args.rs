//! The command line: `--image` (the `--disk` keys that apply to an image,
//! parsed by `block::options`), one or more `--export type=...` (each
//! export parses its own keys, see [`crate::export`]), `-v`, `--help`,
//! `--version`.

use block::options::take_image_options;
use block::DiskOptions;
use ch_util::kv::{KvError, KvList};
use thiserror::Error;

use crate::export::nbd::NbdConfig;
use crate::export::ExportConfig;

pub const USAGE: &str = "\
Usage: ch-storage-daemon --image path=IMG[,KEY=VALUE...] --export type=TYPE,KEY=VALUE... [-v]

Exports one disk image (raw or qcow2) until SIGTERM or SIGINT, then drains
every request, flushes and closes the image clean.

--image keys (as cloud-hypervisor's --disk):
  path=IMG                 the image file (required), or an NBD export:
                           nbd://HOST[:PORT]/NAME, nbd+unix:///NAME?socket=PATH
  reconnect_delay=N        NBD: seconds requests wait for the server to come
                           back (default 0: they fail at once)
  readonly=on|off          open read-only (default off)
  direct=on|off            O_DIRECT on every file of the image (default off)
  cache=none|writeback|writethrough|directsync|unsafe   QEMU's cache modes
  image_type=auto|raw|qcow2
  engine=auto|io_uring|aio|threads|sync   (aio needs cache=none|directsync)

--export type=fuse keys:
  mountpoint=FILE          an existing regular file that becomes the image's view
  writable=on|off          allow writes (default off)
  growable=on|off          writes past the end grow the image (default off)
  allow_other=on|off|auto  let other users access the file (default auto)
  io_uring=on|off          FUSE-over-io_uring (default off)
  num_queues=N             FUSE queues, each a thread (default 1)
  poll_max_us=N            spin up to N us for the next event before sleeping,
                           adapting to how often it pays off (default 0 = off)

--export type=vhost-user-blk keys:
  socket=PATH              the vhost-user socket to listen on (must not exist)
  num_queues=N             virtqueues (default 1)
  queue_size=N             maximum virtqueue size (default 128)
  writable=on|off          allow writes (default off)
  logical_block_size=N     512 or more, a power of two (default 512)
  serial=S                 the GET_ID answer (up to 20 characters)

--export type=nbd keys:
  addr=unix:PATH|tcp:HOST:PORT   where to listen (a unix socket must not exist;
                           the TCP port defaults to 10809)
  name=NAME                the export name (default: empty, the default export)
  description=TEXT         what NBD_OPT_LIST and NBD_INFO_DESCRIPTION show
  writable=on|off          allow writes (default off)
  max_connections=N        clients at once, 0 for no limit (default 0);
                           multi-conn is advertised unless N is 1
  bitmap=NAME              offer the image's persistent dirty bitmap NAME as
                           the qemu:dirty-bitmap:NAME meta context (needs
                           --image ...,readonly=on)

Other options:
  -v                       more logging (repeat for more)
  -h, --help               this text
  -V, --version            the version
";

/// Everything the daemon needs to run.
#[derive(Debug)]
pub struct DaemonConfig {
    pub image: DiskOptions,
    pub exports: Vec<ExportConfig>,
    pub verbosity: u8,
}

#[derive(Debug)]
pub enum Command {
    Run(DaemonConfig),
    Help,
    Version,
}

#[derive(Debug, Error)]
pub enum ArgsError {
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error("unknown argument '{0}' (see --help)")]
    UnknownArgument(String),
    #[error("{0} needs a value")]
    MissingValue(String),
    #[error("--image is required")]
    MissingImage,
    #[error("--image given twice (one image per daemon)")]
    RepeatedImage,
    #[error("at least one --export is required")]
    MissingExport,
    #[error("--export type=nbd,bitmap={0} needs --image ...,readonly=on: a read-write open makes the image's persistent bitmaps invalid (this daemon does not record writes in them)")]
    BitmapNeedsReadOnly(String),
}

pub fn parse_args(argv: &[String]) -> Result<Command, ArgsError> {
    let mut image = None;
    let mut exports = Vec::new();
    let mut verbosity = 0u8;
    let mut it = argv.iter();
    while let Some(arg) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| ArgsError::MissingValue(arg.clone()))
        };
        match arg.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "-V" | "--version" => return Ok(Command::Version),
            "-v" => verbosity = verbosity.saturating_add(1),
            "--image" => {
                if image.is_some() {
                    return Err(ArgsError::RepeatedImage);
                }
                let v = value()?;
                let mut kv = KvList::parse("--image", &v)?;
                let options = take_image_options(&mut kv)?;
                kv.finish()?;
                image = Some(options);
            }
            "--export" => {
                let v = value()?;
                let mut kv = KvList::parse("--export", &v)?;
                exports.push(ExportConfig::from_kv(&mut kv)?);
                kv.finish()?;
            }
            _ => return Err(ArgsError::UnknownArgument(arg.clone())),
        }
    }
    let image = image.ok_or(ArgsError::MissingImage)?;
    if exports.is_empty() {
        return Err(ArgsError::MissingExport);
    }
    // Refused before the open, which would already drop the bitmaps.
    for e in &exports {
        if let ExportConfig::Nbd(NbdConfig {
            bitmap: Some(name), ..
        }) = e
        {
            if !image.readonly {
                return Err(ArgsError::BitmapNeedsReadOnly(name.clone()));
            }
        }
    }
    Ok(Command::Run(DaemonConfig {
        image,
        exports,
        verbosity,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Command, ArgsError> {
        parse_args(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn image_and_export_are_required() {
        assert!(matches!(run(&[]), Err(ArgsError::MissingImage)));
        assert!(matches!(
            run(&["--image", "path=a.raw"]),
            Err(ArgsError::MissingExport)
        ));
        assert!(matches!(
            run(&["--image", "path=a", "--image", "path=b"]),
            Err(ArgsError::RepeatedImage)
        ));
        assert!(matches!(run(&["--image"]), Err(ArgsError::MissingValue(_))));
        assert!(matches!(
            run(&["--bogus"]),
            Err(ArgsError::UnknownArgument(_))
        ));
    }

    #[test]
    fn image_keys_are_the_disk_keys() {
        let err = run(&["--image", "path=a.raw,num_queues=2"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--image") && err.contains("num_queues"),
            "{err}"
        );
    }

    #[test]
    fn a_bitmap_export_needs_a_read_only_image() {
        let export = "type=nbd,addr=unix:s,bitmap=b0";
        let err = run(&["--image", "path=a.qcow2", "--export", export]).unwrap_err();
        assert!(
            matches!(&err, ArgsError::BitmapNeedsReadOnly(n) if n == "b0"),
            "{err}"
        );
        assert!(matches!(
            run(&["--image", "path=a.qcow2,readonly=on", "--export", export]),
            Ok(Command::Run(_))
        ));
        let err = run(&[
            "--image",
            "path=a,readonly=on",
            "--export",
            "type=nbd,addr=unix:s,bitmap=",
        ])
        .unwrap_err()
        .to_string();
        assert!(err.contains("bitmap"), "{err}");
    }

    #[test]
    fn export_needs_a_known_type() {
        for (arg, needle) in [
            ("mountpoint=/x", "type"),
            ("type=nbd", "addr"),
            ("type=nbd,addr=udp:x", "unix:PATH or tcp:HOST:PORT"),
            ("type=nbd,addr=tcp:h:1,writable=maybe", "writable"),
            ("type=nfs", "nbd"),
        ] {
            let err = run(&["--image", "path=a.raw", "--export", arg])
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{arg}: {err}");
        }
    }
}
