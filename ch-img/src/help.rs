//! `ch-img --help`, `ch-img help COMMAND` and `ch-img COMMAND --help`:
//! each verb's synopsis and options, as qemu-img lists them.
//!
//! A verb name enters; its text leaves ([`verb_help`]), or the list of
//! verbs ([`USAGE`]).

pub const USAGE: &str = "usage: ch-img COMMAND [OPTIONS] ...
commands: create, info, check, convert, map, measure, compare, resize, bench, snapshot, rebase, commit
'ch-img help COMMAND' or 'ch-img COMMAND --help' shows a command's options;
docs/ch-img.md describes them.";

const CACHE: &str = "cache modes: none, writeback, writethrough, directsync, unsafe (off = none)";

/// The synopsis and options of `verb`, or `None` for an unknown verb.
pub fn verb_help(verb: &str) -> Option<String> {
    let (synopsis, options): (&str, &[&str]) = match verb {
        "create" => (
            "create [-q] [-f fmt] [-b backing_file -F backing_fmt] [-u] [-o options] filename [size]",
            &["-o  creation options (size, cluster_size, backing_file, backing_fmt, compat, refcount_bits, lazy_refcounts, extended_l2, compression_type, preallocation)"],
        ),
        "info" => (
            "info [-f fmt] [--output=human|json] [--backing-chain] [-U] filename",
            &[],
        ),
        "check" => (
            "check [-q] [-f fmt] [--output=human|json] [-r leaks|all] [-T src_cache] [-U] filename",
            &["-r  repair leaks, or all errors", "-T  cache mode the image is opened in", CACHE],
        ),
        "convert" => (
            "convert [-c] [-p] [-q] [-W] [-m num_workers] [-f fmt] [-t cache] [-T src_cache] [-O output_fmt] [-o options] [-S sparse_size] [-U] filename output_filename",
            &[
                "-c  compress every cluster (qcow2 output)",
                "-p  show progress; SIGUSR1 prints it once",
                "-m  workers reading and compressing concurrently, 1..16 (default 8)",
                "-W  write out of order (compressed clusters stay in order)",
                "-t  cache mode of the output (default unsafe)",
                "-T  cache mode of the source (default writeback)",
                "-S  zero blocks of this size are not written (default 4k)",
                "--compressed-cache=N  host clusters of compressed data kept before writing (default 64, 0: none)",
                CACHE,
            ],
        ),
        "map" => ("map [-f fmt] [--output=human|json] [-U] filename", &[]),
        "measure" => (
            "measure [--output=human|json] [-O output_fmt] [-o options] [--size N | [-f fmt] filename]",
            &[],
        ),
        "compare" => (
            "compare [-f fmt] [-F fmt] [-T src_cache] [-p] [-q] [-s] [-U] filename1 filename2",
            &["-s  strict: sizes and allocation must match too", "-T  cache mode both images are read in", CACHE],
        ),
        "resize" => ("resize [-f fmt] [-q] [--shrink] filename [+|-]size", &[]),
        "bench" => (
            "bench [-c count] [-d depth] [-f fmt] [--flush-interval=n] [--no-drain] [-i aio] [-n] [-o offset] [--pattern=p] [-q] [-s size] [-S step] [-t cache] [-w] [-U] filename",
            &["-t  cache mode (none and directsync use O_DIRECT)", CACHE],
        ),
        "snapshot" => ("snapshot [-l | -a snapshot | -c snapshot | -d snapshot] [-q] [-U] filename", &[]),
        "rebase" => (
            "rebase [-f fmt] [-t cache] [-T src_cache] [-p] [-q] [-u] [-U] -b backing_file [-F backing_fmt] filename",
            &[
                "-u  only change the header (unsafe mode)",
                "-p  show progress; SIGUSR1 prints it once",
                "-t  cache mode of the image (default writeback)",
                "-T  cache mode of the new backing file (default writeback)",
                CACHE,
            ],
        ),
        "commit" => (
            "commit [-q] [-f fmt] [-t cache] [-b base] [-d] [-p] filename",
            &[
                "-b  commit into this image of the backing chain (implies -d)",
                "-d  keep the image's data",
                "-p  show progress; SIGUSR1 prints it once",
                "-t  cache mode of the images (default writeback)",
                CACHE,
            ],
        ),
        _ => return None,
    };
    let mut text = format!("usage: ch-img {synopsis}\n");
    for line in options {
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

    #[test]
    fn every_listed_verb_has_help() {
        let list = USAGE
            .lines()
            .find_map(|l| l.strip_prefix("commands: "))
            .unwrap();
        for verb in list.split(", ") {
            let text = verb_help(verb).unwrap();
            assert!(text.starts_with(&format!("usage: ch-img {verb}")), "{text}");
        }
        assert!(verb_help("frobnicate").is_none());
    }
}
