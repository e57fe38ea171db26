//! The rules between image keys, one implementation for every way a
//! disk is described: the `key=value` lists of `--disk`, `--image` and
//! ch-img ([`super::take_image_options`]) and the VMM's JSON disk config
//! (`vm.create`, `vm.add-disk`).
//!
//! - `direct` and `cache`: `cache` decides O_DIRECT, `direct=on` alone
//!   means `cache=none`, and a `direct` that disagrees with `cache` is
//!   refused naming both ([`CacheKeys::mode`]);
//! - `engine=aio` needs O_DIRECT, as QEMU's `aio=native` needs
//!   `cache.direct=on` ([`CacheKeys::check_aio`]);
//! - `reconnect_delay` is seconds up to [`MAX_RECONNECT_DELAY`], on NBD
//!   paths only ([`check_reconnect_delay`]).
//!
//! Enters as the values given (before any default); leaves as the
//! decision or why not, a [`KeyConflict`] or a reason, which the caller
//! wraps in its own error type naming its option or field. It names no
//! type of `options/mod.rs` (which uses it), only the cache modes.

use super::cache::CacheMode;

/// Longest `reconnect_delay` accepted (an hour).
pub const MAX_RECONNECT_DELAY: u64 = 3600;

/// Two keys that each parse but cannot be used together.
#[derive(Debug, PartialEq, Eq)]
pub struct KeyConflict {
    /// The first key, as `key=value`.
    pub first: String,
    /// The second key (or what stands for it, a default), as `key=value`.
    pub second: String,
    pub reason: String,
}

/// `direct` and `cache` as given (`None`: not given).
#[derive(Clone, Copy, Debug, Default)]
pub struct CacheKeys {
    pub direct: Option<bool>,
    pub cache: Option<CacheMode>,
}

fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

impl CacheKeys {
    /// The cache mode the keys ask for (writeback when neither is given).
    pub fn mode(&self) -> Result<CacheMode, KeyConflict> {
        match (self.direct, self.cache) {
            (Some(d), Some(c)) if d != c.direct() => Err(KeyConflict {
                first: format!("direct={}", on_off(d)),
                second: format!("cache={c}"),
                reason: format!(
                    "cache={c} opens the image {} O_DIRECT; drop one of the two",
                    if c.direct() { "with" } else { "without" }
                ),
            }),
            (_, Some(c)) => Ok(c),
            (Some(true), None) => Ok(CacheMode::None),
            _ => Ok(CacheMode::default()),
        }
    }

    /// The rule for `engine=aio`: refused when the keys open the image
    /// without O_DIRECT, naming the key (or the default) that does.
    pub fn check_aio(&self) -> Result<(), KeyConflict> {
        if self.mode().is_ok_and(|m| m.direct()) {
            return Ok(());
        }
        let buffered = match (self.direct, self.cache) {
            (_, Some(c)) => format!("cache={c}"),
            (Some(_), None) => "direct=off".to_string(),
            (None, None) => "cache=writeback (the default)".to_string(),
        };
        Err(KeyConflict {
            first: "engine=aio".into(),
            second: buffered,
            reason: "Linux AIO needs O_DIRECT (as QEMU's aio=native): use cache=none or cache=directsync".into(),
        })
    }
}

/// Why `reconnect_delay` cannot be `delay` seconds for an image whose
/// path is an NBD export (`nbd`, `super::is_nbd_path`) or not: out of
/// range, or not an NBD export.
pub fn check_reconnect_delay(delay: u64, nbd: bool) -> Result<u64, String> {
    if delay > MAX_RECONNECT_DELAY {
        return Err(reconnect_delay_range());
    }
    if !nbd {
        return Err("only NBD exports (nbd:// or nbd+unix:// paths) reconnect".into());
    }
    Ok(delay)
}

/// The values `reconnect_delay` takes, for a value out of range or not a
/// number.
pub fn reconnect_delay_range() -> String {
    format!("expected seconds from 0 to {MAX_RECONNECT_DELAY}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(direct: Option<bool>, cache: Option<CacheMode>) -> CacheKeys {
        CacheKeys { direct, cache }
    }

    #[test]
    fn cache_decides_and_direct_on_alone_means_none() {
        assert_eq!(keys(None, None).mode(), Ok(CacheMode::Writeback));
        assert_eq!(keys(Some(true), None).mode(), Ok(CacheMode::None));
        assert_eq!(keys(Some(false), None).mode(), Ok(CacheMode::Writeback));
        for c in [
            CacheMode::None,
            CacheMode::Writeback,
            CacheMode::Writethrough,
            CacheMode::Directsync,
            CacheMode::Unsafe,
        ] {
            assert_eq!(keys(None, Some(c)).mode(), Ok(c));
            assert_eq!(keys(Some(c.direct()), Some(c)).mode(), Ok(c));
            let e = keys(Some(!c.direct()), Some(c)).mode().unwrap_err();
            assert_eq!(e.second, format!("cache={c}"));
            assert!(e.first.starts_with("direct="), "{e:?}");
        }
    }

    #[test]
    fn aio_names_what_makes_the_image_buffered() {
        for (k, second) in [
            (keys(None, None), "cache=writeback (the default)"),
            (keys(Some(false), None), "direct=off"),
            (keys(None, Some(CacheMode::Unsafe)), "cache=unsafe"),
        ] {
            let e = k.check_aio().unwrap_err();
            assert_eq!(
                (e.first.as_str(), e.second.as_str()),
                ("engine=aio", second)
            );
        }
        assert!(keys(Some(true), None).check_aio().is_ok());
        assert!(keys(None, Some(CacheMode::Directsync)).check_aio().is_ok());
    }

    #[test]
    fn reconnect_delay_is_for_nbd_paths_up_to_an_hour() {
        assert_eq!(check_reconnect_delay(5, true), Ok(5));
        assert_eq!(check_reconnect_delay(3600, true), Ok(3600));
        for nbd in [true, false] {
            let e = check_reconnect_delay(3601, nbd).unwrap_err();
            assert!(e.contains("0 to 3600"), "{e}");
        }
        let e = check_reconnect_delay(5, false).unwrap_err();
        assert!(e.contains("only NBD"), "{e}");
    }
}
