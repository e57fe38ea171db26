//! `--memory size=SIZE`: guest RAM. Enters as the option string, leaves as
//! a byte count that is a multiple of 2 MiB, at least [`MIN_MEMORY`].

use super::size::parse_size;
use super::ConfigError;
use block::options::kv::KvList;

pub const MIN_MEMORY: u64 = 32 << 20;
/// The host decides in the end; this only stops absurd values early.
pub const MAX_MEMORY: u64 = 1 << 40;

pub fn parse_memory(s: &str) -> Result<u64, ConfigError> {
    let mut kv = KvList::parse("--memory", s)?;
    let size = kv
        .take_parsed("size", |v| {
            let n = parse_size(v)?;
            if !(MIN_MEMORY..=MAX_MEMORY).contains(&n) {
                return Err("expected a size from 32M to 1T".into());
            }
            if n % (2 << 20) != 0 {
                return Err("expected a multiple of 2M".into());
            }
            Ok(n)
        })?
        .unwrap_or(512 << 20);
    kv.finish()?;
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_memory("size=1G").unwrap(), 1 << 30);
        assert_eq!(parse_memory("size=64M").unwrap(), 64 << 20);
        let e = parse_memory("size=1M").unwrap_err().to_string();
        assert!(e.contains("size") && e.contains("1M"), "{e}");
        assert!(parse_memory("size=33M").is_err());
        assert!(parse_memory("hotplug=1G").is_err());
    }
}
