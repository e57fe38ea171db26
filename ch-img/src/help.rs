//! `ch-img --help`, `ch-img help COMMAND`, `ch-img COMMAND --help` and
//! `ch-img --version`: each verb's synopsis and every option it takes.
//!
//! A verb name enters; its text leaves ([`verb_help`]), or the list of
//! verbs ([`USAGE`]), or the version lines ([`VERSION`]). A unit test
//! holds each verb's text against the options its parser accepts
//! (`cmd::option_spec`), so an option cannot be added without its help.

pub const USAGE: &str = "usage: ch-img COMMAND [OPTIONS] ...
commands: amend, bench, bitmap, check, commit, compare, convert, create, dd, info, map, measure, rebase, resize, snapshot
'ch-img help COMMAND' or 'ch-img COMMAND --help' shows a command's options;
'ch-img --version' (-V) shows the version; docs/ch-img.md describes the commands.";

/// What `--version` and `-V` print: qemu-img's two lines, with our name.
pub const VERSION: &str = concat!(
    "ch-img version ",
    env!("CARGO_PKG_VERSION"),
    "\nCopyright (c) the cloud-hypervisor block-first VMM developers"
);

const CACHE: &str = "cache modes: none, writeback, writethrough, directsync, unsafe (off = none)";
const FORMAT: &str = "-f fmt  the image's format: raw or qcow2 (probed when not given)";
const QUIET: &str = "-q  quiet: print nothing but errors";
const SHARE: &str =
    "-U, --force-share  open without waiting for other users' locks (read-only verbs)";
const HELP: &str = "-h, --help  show this help";

/// The synopsis and option lines of `verb`, or `None` for an unknown verb.
fn verb_text(verb: &str) -> Option<(&'static str, &'static [&'static str])> {
    Some(match verb {
        "amend" => (
            "amend [-p] [-q] [-f fmt] [-t cache] [--force] -o options filename",
            &[
                "-o  options to change (comma separated; -o may repeat; -o help lists them): compat, lazy_refcounts, refcount_bits, backing_file, backing_fmt (unchanged only), data_file, data_file_raw, size",
                "-p  show progress",
                "-t  cache mode of the image (default writeback)",
                "--force  accepted, as qemu-img takes it (it only concerns encryption)",
                FORMAT,
                QUIET,
                CACHE,
            ],
        ),
        "bench" => (
            "bench [-c count] [-d depth] [-f fmt] [--flush-interval=n] [--no-drain] [-i aio] [-n] [-o offset] [--pattern=p] [-q] [-s size] [-S step] [-t cache] [-T src_cache] [-w] [-U] [--random] [--seed=n] [--rw-mix=read_percent] [--output=human|json] filename",
            &[
                "-c  requests to send (default 75000)",
                "-d  requests in flight (default 64)",
                "-s  bytes per request (default 4k)",
                "-S  step between offsets (default: the request size)",
                "-o  offset of the first request",
                "-w  write instead of read",
                "--pattern=BYTE  the byte writes carry (default 0xa5)",
                "--flush-interval=N  flush after every N writes",
                "--no-drain  keep requests in flight around each flush",
                "-i  engine: io_uring, native (= io_uring here), threads or sync",
                "-n  native AIO (needs -t none)",
                "-t  cache mode (none and directsync use O_DIRECT)",
                "-T  accepted and ignored",
                "--random  random offsets, aligned to the request size",
                "--seed=N  seed of --random (default 1)",
                "--rw-mix=P  each request is a read with probability P percent",
                "--output=human|json  report format",
                FORMAT,
                QUIET,
                SHARE,
                CACHE,
            ],
        ),
        "bitmap" => (
            "bitmap (--merge SOURCE | --add | --remove | --clear | --enable | --disable)... [-b source_file [-F source_fmt]] [-g granularity] [-f fmt] filename bitmap",
            &[
                "--add  add the persistent dirty bitmap (empty, enabled unless --disable follows)",
                "--remove  remove it",
                "--clear  clear every bit",
                "--enable  let QEMU record writes in it",
                "--disable  stop recording writes in it",
                "--merge SOURCE  set every bit that bitmap SOURCE has set",
                "-b  the file that holds --merge's SOURCE (default: the image)",
                "-F  the format of -b's file",
                "-g  granularity of --add (bytes per bit, a power of two from 512; default the cluster size)",
                "actions run in the order given",
                FORMAT,
            ],
        ),
        "check" => (
            "check [-q] [-f fmt] [--output=human|json] [-r leaks|all] [-T src_cache] [-U] filename",
            &[
                "-r  repair leaks, or all errors",
                "-T  cache mode the image is opened in",
                "--output=human|json  report format",
                FORMAT,
                QUIET,
                SHARE,
                CACHE,
            ],
        ),
        "commit" => (
            "commit [-q] [-f fmt] [-t cache] [-b base] [-r rate_limit] [-d] [-p] [-U] filename",
            &[
                "-b  commit into this image of the backing chain (implies -d)",
                "-d  keep the image's data",
                "-p  show progress; SIGUSR1 prints it once",
                "-t  cache mode of the images (default writeback)",
                "-r  rate limit: accepted and ignored",
                FORMAT,
                QUIET,
                SHARE,
                CACHE,
            ],
        ),
        "compare" => (
            "compare [-f fmt] [-F fmt] [-T src_cache] [-p] [-q] [-s] [-U] filename1 filename2",
            &[
                "-f  the first image's format",
                "-F  the second image's format (default: -f)",
                "-s  strict: sizes and allocation must match too",
                "-p  show progress",
                "-T  cache mode both images are read in",
                QUIET,
                SHARE,
                CACHE,
            ],
        ),
        "convert" => (
            "convert [-c] [-p] [-q] [-n] [-W] [-m num_workers] [-f fmt] [-t cache] [-T src_cache] [-O output_fmt] [-B backing_file [-F backing_fmt]] [-o options] [-l snapshot_param] [-S sparse_size] [-U] [--compressed-cache=N] filename [filename2 [...]] output_filename",
            &[
                "-O  output format: raw (default) or qcow2",
                "-o  creation options of the output (-o help lists them)",
                "-c  compress every cluster (qcow2 output)",
                "-p  show progress; SIGUSR1 prints it once",
                "-m  workers reading and compressing concurrently, 1..16 (default 8)",
                "-W  write out of order (compressed clusters stay in order)",
                "-t  cache mode of the output (default unsafe)",
                "-T  cache mode of the source (default writeback)",
                "-S  zero blocks of this size are not written (default 4k)",
                "-B  backing file of the output: only what differs from it is written",
                "-F  format of the -B backing file",
                "-n  skip creating the output (it must exist and be large enough)",
                "-l  read an internal snapshot of the source: NAME, snapshot.id=ID or snapshot.name=NAME",
                "--compressed-cache=N  host clusters of compressed data kept before writing (default 64, 0: none)",
                FORMAT,
                QUIET,
                SHARE,
                CACHE,
            ],
        ),
        "create" => (
            "create [-q] [-f fmt] [-b backing_file -F backing_fmt] [-u] [-o options] filename [size]",
            &[
                "-o  creation options (comma separated; -o may repeat; -o help lists them)",
                "-b  backing file, stored as given",
                "-F  backing file format",
                "-u  accepted, as qemu-img takes it",
                "-f fmt  the new image's format: raw (default) or qcow2",
                QUIET,
            ],
        ),
        "dd" => (
            "dd [-U] [-f fmt] [-O output_fmt] [bs=block_size] [count=blocks] [skip=blocks] if=input of=output",
            &[
                "bs=BYTES  read and write up to BYTES bytes at a time (default: 512)",
                "count=N  copy only N input blocks",
                "if=FILE  read from FILE",
                "of=FILE  write to FILE (created, or truncated)",
                "skip=N  skip N bs-sized blocks at the start of input",
                "-O  output format: raw (default) or qcow2",
                FORMAT,
                SHARE,
            ],
        ),
        "info" => (
            "info [-f fmt] [--output=human|json] [--backing-chain] [-q] [-U] filename",
            &[
                "--output=human|json  report format",
                "--backing-chain  report every image of the backing chain",
                FORMAT,
                "-q  accepted, as qemu-img takes it",
                SHARE,
            ],
        ),
        "map" => (
            "map [-f fmt] [--start-offset=offset] [--max-length=len] [--output=human|json] [-q] [-U] filename",
            &[
                "--start-offset=OFFSET  start there (default 0)",
                "--max-length=LEN  map at most LEN bytes",
                "--output=human|json  report format",
                FORMAT,
                "-q  accepted, as qemu-img takes it",
                SHARE,
            ],
        ),
        "measure" => (
            "measure [--output=human|json] [-O output_fmt] [-o options] [--size N | [-f fmt] filename] [-l snapshot] [-s snapshot] [-U]",
            &[
                "--size N  measure a new image of N bytes",
                "-O  output format: raw (default) or qcow2",
                "-o  creation options of the output",
                "--output=human|json  report format",
                "-l, -s  internal snapshot: not supported",
                FORMAT,
                SHARE,
            ],
        ),
        "rebase" => (
            "rebase [-f fmt] [-t cache] [-T src_cache] [-p] [-q] [-u] [-c] [-U] -b backing_file [-F backing_fmt] filename",
            &[
                "-b  the new backing file (\"\" for none)",
                "-F  the new backing file's format",
                "-u  only change the header (unsafe mode)",
                "-p  show progress; SIGUSR1 prints it once",
                "-t  cache mode of the image (default writeback)",
                "-T  cache mode of the new backing file (default writeback)",
                "-c  not supported (nor by qemu-img 7.2)",
                FORMAT,
                QUIET,
                SHARE,
                CACHE,
            ],
        ),
        "resize" => (
            "resize [-f fmt] [--preallocation=prealloc] [-q] [--shrink] filename [+ | -]size",
            &[
                "--preallocation=MODE  how the grown area is allocated: off, metadata (qcow2), falloc, full",
                "--shrink  allow making the image smaller",
                FORMAT,
                QUIET,
            ],
        ),
        "snapshot" => (
            "snapshot [-f fmt] [-l | -a snapshot | -c snapshot | -d snapshot] [-q] [-U] filename",
            &[
                "-l  list the internal snapshots",
                "-a  apply a snapshot (revert the disk to it)",
                "-c  create a snapshot",
                "-d  delete a snapshot",
                FORMAT,
                QUIET,
                SHARE,
            ],
        ),
        _ => return None,
    })
}

/// The synopsis and options of `verb`, or `None` for an unknown verb.
pub fn verb_help(verb: &str) -> Option<String> {
    let (synopsis, options) = verb_text(verb)?;
    let mut text = format!("usage: ch-img {synopsis}\n");
    for line in options.iter().chain(std::iter::once(&HELP)) {
        text.push_str("  ");
        text.push_str(line);
        text.push('\n');
    }
    Some(text)
}

/// Whether a verb's words ask for its help (before any `--`).
pub fn asks_for_help(args: &[String]) -> bool {
    args.iter()
        .take_while(|a| *a != "--")
        .any(|a| a == "--help" || a == "-h")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verbs() -> Vec<&'static str> {
        USAGE
            .lines()
            .find_map(|l| l.strip_prefix("commands: "))
            .unwrap()
            .split(", ")
            .collect()
    }

    #[test]
    fn every_listed_verb_has_help() {
        for verb in verbs() {
            let text = verb_help(verb).unwrap();
            assert!(text.starts_with(&format!("usage: ch-img {verb}")), "{text}");
        }
        assert!(verb_help("frobnicate").is_none());
    }

    /// Whether `text` names option `opt` ("-f", "--output") as a word of
    /// its own (not inside a longer option).
    fn names(text: &str, opt: &str) -> bool {
        text.match_indices(opt).any(|(at, _)| {
            let before = text[..at].chars().next_back();
            let after = text[at + opt.len()..].chars().next();
            !before.is_some_and(|c| c == '-' || c.is_alphanumeric())
                && !after.is_some_and(|c| c == '-' || c.is_alphanumeric())
        })
    }

    /// Every option a verb's parser accepts is in its help: the synopsis
    /// line and the option lines both.
    #[test]
    fn help_lists_every_option_the_parser_takes() {
        for verb in verbs() {
            let spec = crate::cmd::option_spec(verb)
                .unwrap_or_else(|| panic!("{verb} has no option spec"));
            let text = verb_help(verb).unwrap();
            let (synopsis, lines) = text.split_once('\n').unwrap();
            let shorts = spec
                .short_with_value
                .chars()
                .chain(spec.short_flags.chars());
            let mut wanted: Vec<String> = shorts.map(|c| format!("-{c}")).collect();
            wanted.extend(
                spec.long_with_value
                    .iter()
                    .chain(spec.long_flags)
                    .map(|l| format!("--{l}")),
            );
            for opt in wanted {
                assert!(
                    names(lines, &opt),
                    "ch-img {verb} --help does not explain {opt}:\n{text}"
                );
                let in_synopsis =
                    names(synopsis, &opt) || ["-h", "--force-share"].contains(&opt.as_str());
                assert!(in_synopsis, "ch-img {verb}'s synopsis lacks {opt}:\n{text}");
            }
        }
    }

    #[test]
    fn names_matches_whole_options_only() {
        assert!(names("[-f fmt]", "-f"));
        assert!(!names("--force", "-f"));
        assert!(!names("-fx", "-f"));
        assert!(names("--no-drain  keep", "--no-drain"));
        assert!(!names("--no-drain", "--no"));
    }
}
