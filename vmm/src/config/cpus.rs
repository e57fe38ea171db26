//! `--cpus boot=N`: the number of vCPUs. Enters as the option string,
//! leaves as a count from 1 to [`MAX_VCPUS`].

use super::ConfigError;
use block::options::kv::KvList;

/// The MP table and our APIC id space keep this small.
pub const MAX_VCPUS: u8 = 64;

pub fn parse_cpus(s: &str) -> Result<u8, ConfigError> {
    let mut kv = KvList::parse("--cpus", s)?;
    let boot = kv
        .take_parsed("boot", |v| match v.parse::<u8>() {
            Ok(n) if (1..=MAX_VCPUS).contains(&n) => Ok(n),
            _ => Err(format!("expected a number from 1 to {MAX_VCPUS}")),
        })?
        .unwrap_or(1);
    kv.finish()?;
    Ok(boot)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_count() {
        assert_eq!(parse_cpus("boot=4").unwrap(), 4);
        assert!(parse_cpus("boot=0")
            .unwrap_err()
            .to_string()
            .contains("boot"));
        assert!(parse_cpus("boot=65").is_err());
        assert!(parse_cpus("max=4").unwrap_err().to_string().contains("max"));
    }
}
