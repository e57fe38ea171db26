//! `--memory size=SIZE[,shared=on|off]`: guest RAM. Enters as the option
//! string, leaves as the `memory` part of a
//! [`VmConfig`](super::vm_config::VmConfig) ([`MemoryConfig`]): a byte
//! count that is a multiple of 2 MiB, at least [`MIN_MEMORY`]
//! ([`check_size`], the one check, also `vm.create`'s), and whether RAM
//! lives in a memfd mapped shared (needed by vhost-user disks, whose
//! backend maps guest RAM too).

use super::error::ConfigError;
use super::vm_config::{MemoryConfig, DEFAULT_MEMORY};
use ch_util::kv::{parse_on_off, KvList};
use ch_util::size::parse_size;

pub const MIN_MEMORY: u64 = 32 << 20;
/// The host decides in the end; this only stops absurd values early.
pub const MAX_MEMORY: u64 = 1 << 40;

/// `n` bytes of guest RAM, if this VMM can give them.
pub fn check_size(n: u64) -> Result<u64, String> {
    if !(MIN_MEMORY..=MAX_MEMORY).contains(&n) {
        return Err("expected a size from 32M to 1T".into());
    }
    if !n.is_multiple_of(2 << 20) {
        return Err("expected a multiple of 2M".into());
    }
    Ok(n)
}

pub fn parse_memory(s: &str) -> Result<MemoryConfig, ConfigError> {
    let mut kv = KvList::parse("--memory", s)?;
    let size = kv
        .take_parsed("size", |v| {
            check_size(parse_size(v).map_err(|e| e.to_string())?)
        })?
        .unwrap_or(DEFAULT_MEMORY);
    let shared = kv.take_parsed("shared", parse_on_off)?.unwrap_or(false);
    kv.finish()?;
    Ok(MemoryConfig {
        size,
        shared,
        ..MemoryConfig::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_memory("size=1G").unwrap().size, 1 << 30);
        assert_eq!(parse_memory("size=64M").unwrap().size, 64 << 20);
        let e = parse_memory("size=1M").unwrap_err().to_string();
        assert!(e.contains("size") && e.contains("1M"), "{e}");
        assert!(parse_memory("size=33M").is_err());
        assert!(parse_memory("hotplug=1G").is_err());
    }

    #[test]
    fn shared() {
        assert!(!parse_memory("size=64M").unwrap().shared);
        assert!(parse_memory("size=64M,shared=on").unwrap().shared);
        assert!(parse_memory("shared=true").unwrap().shared);
        assert!(!parse_memory("size=64M,shared=off").unwrap().shared);
        let e = parse_memory("shared=maybe").unwrap_err().to_string();
        assert!(e.contains("shared") && e.contains("maybe"), "{e}");
    }
}
