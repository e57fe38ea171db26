//! The image keys every binary shares (`--disk`, `ch-storage-daemon
//! --image`): [`take_image_options`] reads them from a `key=value` list
//! (`ch_util::kv`) into a [`DiskOptions`], by the rules between them that
//! the VMM's JSON disk config follows too ([`super::rules`]); each binary
//! then takes its own keys from the same list. `image_type=` takes
//! `auto` or a registered format's name (`formats::registry`).

use super::cache::CacheMode;
use super::disk_options::DiskOptions;
use super::rules::{self, CacheKeys, KeyConflict};
use crate::formats::registry::FORMATS;
use block_engines::nbd::is_nbd_path;
use block_engines::EngineKind;
use ch_util::kv::{parse_on_off, KvError, KvList};

/// Takes the image keys shared by `--disk` and `--image` from `kv`:
/// `path` (required), `readonly`, `direct`, `cache`, `image_type`,
/// `engine` and `reconnect_delay` (NBD paths only). Other keys stay in
/// `kv` for the caller.
///
/// Refused, by the rules every way in shares ([`rules`]): a `direct`
/// that disagrees with `cache` (naming both), `engine=aio` without
/// O_DIRECT (QEMU's aio=native needs cache.direct=on), a
/// `reconnect_delay` out of range or on a path that is not NBD.
pub fn take_image_options(kv: &mut KvList) -> Result<DiskOptions, KvError> {
    let option = kv.option();
    let conflict = |c: KeyConflict| KvError::Conflict {
        option,
        first: c.first,
        second: c.second,
        reason: c.reason,
    };
    let path = kv.take_required("path")?;
    if path.is_empty() {
        return Err(KvError::BadValue {
            option,
            key: "path".into(),
            value: path,
            reason: "empty path".into(),
        });
    }
    let mut options = DiskOptions::new(path);
    if let Some(v) = kv.take_parsed("readonly", parse_on_off)? {
        options.readonly = v;
    }
    let keys = CacheKeys {
        direct: kv.take_parsed("direct", parse_on_off)?,
        cache: kv.take_parsed("cache", |s| s.parse::<CacheMode>())?,
    };
    options.cache = keys.mode().map_err(conflict)?;
    options.direct = options.cache.direct();
    if let Some(v) = kv.take_parsed("image_type", |s| FORMATS.parse_image_type(s))? {
        options.image_type = v;
    }
    if let Some(v) = kv.take_parsed("engine", |s| s.parse::<EngineKind>())? {
        options.engine = v;
    }
    let nbd = is_nbd_path(&options.path);
    if let Some(v) = kv.take_parsed("reconnect_delay", |s| {
        let delay = s
            .parse::<u64>()
            .map_err(|_| rules::reconnect_delay_range())?;
        rules::check_reconnect_delay(delay, nbd)
    })? {
        options.reconnect_delay = v;
    }
    if options.engine == EngineKind::Aio {
        keys.check_aio().map_err(conflict)?;
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::ImageType;
    use std::path::PathBuf;

    #[test]
    fn image_keys_leave_the_rest() {
        let mut kv = KvList::parse(
            "--image",
            "path=/a.qcow2,readonly=on,direct=on,image_type=qcow2,engine=sync,num_queues=2",
        )
        .unwrap();
        let o = take_image_options(&mut kv).unwrap();
        assert_eq!(o.path, PathBuf::from("/a.qcow2"));
        assert!(o.readonly && o.direct && o.lock);
        assert_eq!(
            (o.image_type, o.engine),
            (ImageType::Format("qcow2"), EngineKind::Sync)
        );
        assert_eq!(kv.take("num_queues").unwrap().as_deref(), Some("2"));
        kv.finish().unwrap();
    }

    fn parse(s: &str) -> Result<DiskOptions, KvError> {
        let mut kv = KvList::parse("--disk", s)?;
        let o = take_image_options(&mut kv)?;
        kv.finish()?;
        Ok(o)
    }

    #[test]
    fn cache_modes_set_direct() {
        for (mode, direct) in [
            ("none", true),
            ("writeback", false),
            ("writethrough", false),
            ("directsync", true),
            ("unsafe", false),
        ] {
            let o = parse(&format!("path=/a,cache={mode}")).unwrap();
            assert_eq!(o.cache.as_str(), mode);
            assert_eq!(o.direct, direct, "{mode}");
        }
        let o = parse("path=/a,direct=on").unwrap();
        assert_eq!((o.direct, o.cache), (true, CacheMode::None));
        let o = parse("path=/a,direct=off,cache=writethrough").unwrap();
        assert_eq!((o.direct, o.cache), (false, CacheMode::Writethrough));
        let o = parse("path=/a").unwrap();
        assert_eq!((o.direct, o.cache), (false, CacheMode::Writeback));
    }

    #[test]
    fn a_direct_that_disagrees_with_cache_names_both() {
        for s in [
            "path=/a,direct=on,cache=writeback",
            "path=/a,direct=off,cache=none",
        ] {
            let err = parse(s).unwrap_err();
            assert!(matches!(err, KvError::Conflict { .. }), "{err}");
            let msg = err.to_string();
            assert!(msg.contains("direct=") && msg.contains("cache="), "{msg}");
        }
    }

    #[test]
    fn unknown_cache_mode_names_the_key_and_the_values() {
        let msg = parse("path=/a,cache=nocache").unwrap_err().to_string();
        for word in [
            "cache",
            "nocache",
            "none",
            "writeback",
            "writethrough",
            "directsync",
            "unsafe",
        ] {
            assert!(msg.contains(word), "{msg}");
        }
        let msg = parse("path=/a,engine=native").unwrap_err().to_string();
        for word in [
            "engine", "native", "auto", "io_uring", "aio", "threads", "sync",
        ] {
            assert!(msg.contains(word), "{msg}");
        }
    }

    #[test]
    fn aio_needs_o_direct() {
        for (s, names) in [
            ("path=/a,engine=aio", "cache=writeback (the default)"),
            (
                "path=/a,engine=aio,cache=writethrough",
                "cache=writethrough",
            ),
            ("path=/a,engine=aio,cache=unsafe", "cache=unsafe"),
            ("path=/a,engine=aio,direct=off", "direct=off"),
        ] {
            let msg = parse(s).unwrap_err().to_string();
            assert!(msg.contains("engine=aio") && msg.contains(names), "{msg}");
        }
        for s in [
            "path=/a,engine=aio,cache=none",
            "path=/a,engine=aio,cache=directsync",
            "path=/a,engine=aio,direct=on",
        ] {
            let o = parse(s).unwrap();
            assert!(o.direct && o.engine == EngineKind::Aio);
        }
    }

    #[test]
    fn path_is_required_and_not_empty() {
        let mut kv = KvList::parse("--image", "readonly=on").unwrap();
        assert!(matches!(
            take_image_options(&mut kv),
            Err(KvError::MissingKey { key: "path", .. })
        ));
        let mut kv = KvList::parse("--image", "path=").unwrap();
        assert!(take_image_options(&mut kv).is_err());
    }
}
