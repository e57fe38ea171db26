//! `--cpus boot=N[,max=N][,model=NAME][,hide=[FEATURE,...]]`: the number of vCPUs
//! and the CPU model the guest sees. Enters as the option string, leaves
//! as a [`CpusConfig`].
//!
//! `model=host` (the default) shows the guest KVM's supported CPUID;
//! `model=x86-64-v1` only the x86-64 baseline; `hide=` removes features
//! (Linux's `/proc/cpuinfo` names) on top. The names are checked here
//! against the hypervisor crate's table (`hypervisor::cpu_model`), so a
//! typo is refused before anything starts. Why a model: docs/vmm.md.

use super::ConfigError;
use block::options::kv::KvList;
use hypervisor::{BaseModel, CpuModel, Feature};

/// The MP table and our APIC id space keep this small.
pub const MAX_VCPUS: u8 = 64;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpusConfig {
    pub boot: u8,
    pub model: CpuModel,
}

impl Default for CpusConfig {
    fn default() -> Self {
        CpusConfig {
            boot: 1,
            model: CpuModel::default(),
        }
    }
}

pub fn parse_cpus(s: &str) -> Result<CpusConfig, ConfigError> {
    let mut kv = KvList::parse("--cpus", s)?;
    let boot = kv
        .take_parsed("boot", |v| match v.parse::<u8>() {
            Ok(n) if (1..=MAX_VCPUS).contains(&n) => Ok(n),
            _ => Err(format!("expected a number from 1 to {MAX_VCPUS}")),
        })?
        .unwrap_or(1);
    // Upstream's `max` (CPU hotplug's ceiling): there is no CPU hotplug,
    // so only `max` equal to `boot` is taken.
    kv.take_parsed("max", |v| match v.parse::<u8>() {
        Ok(n) if n == boot => Ok(n),
        _ => Err(format!(
            "expected {boot}, the boot count (there is no CPU hotplug)"
        )),
    })?;
    let base = kv
        .take_parsed("model", |v| {
            BaseModel::by_name(v).ok_or_else(|| format!("expected one of {}", BaseModel::NAMES))
        })?
        .unwrap_or_default();
    let hidden = kv.take_parsed("hide", parse_features)?.unwrap_or_default();
    kv.finish()?;
    Ok(CpusConfig {
        boot,
        model: CpuModel { base, hidden },
    })
}

/// `FEATURE` or `[FEATURE,FEATURE,...]`.
fn parse_features(v: &str) -> Result<Vec<Feature>, String> {
    let list = v
        .strip_prefix('[')
        .and_then(|l| l.strip_suffix(']'))
        .unwrap_or(v);
    let mut features = Vec::new();
    for name in list.split(',') {
        let feature = Feature::by_name(name).ok_or_else(|| {
            format!("unknown CPU feature '{name}' (the names are listed in docs/vmm.md)")
        })?;
        if !features.contains(&feature) {
            features.push(feature);
        }
    }
    Ok(features)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_count() {
        assert_eq!(parse_cpus("boot=4").unwrap().boot, 4);
        assert!(parse_cpus("boot=0")
            .unwrap_err()
            .to_string()
            .contains("boot"));
        assert!(parse_cpus("boot=65").is_err());
        assert!(parse_cpus("max=4").unwrap_err().to_string().contains("max"));
        assert_eq!(parse_cpus("boot=4,max=4").unwrap().boot, 4);
        assert!(parse_cpus("boot=2,max=4")
            .unwrap_err()
            .to_string()
            .contains("hotplug"));
    }

    #[test]
    fn model_and_hidden_features() {
        let c = parse_cpus("boot=2").unwrap();
        assert_eq!(c.model, CpuModel::default(), "host passthrough by default");
        let c = parse_cpus("boot=2,model=x86-64-v1,hide=[xsave,popcnt,xsave]").unwrap();
        assert_eq!(c.model.base, BaseModel::X86_64V1);
        let names: Vec<_> = c.model.hidden.iter().map(|f| f.name).collect();
        assert_eq!(names, ["xsave", "popcnt"]);
        let c = parse_cpus("hide=cx16").unwrap();
        assert_eq!((c.boot, c.model.hidden.len()), (1, 1));
        let c = parse_cpus("boot=2,hide=[kvm_pv_send_ipi,kvm_pv_unhalt]").unwrap();
        assert_eq!(c.model.base, BaseModel::Host);
        assert_eq!(c.model.hidden.len(), 2);
    }

    #[test]
    fn bad_model_or_feature_names_the_key() {
        let err = parse_cpus("model=qemu99").unwrap_err().to_string();
        assert!(err.contains("model") && err.contains("x86-64-v1"), "{err}");
        let err = parse_cpus("hide=[xsave,sse5]").unwrap_err().to_string();
        assert!(err.contains("hide") && err.contains("sse5"), "{err}");
        assert!(parse_cpus("hide=").is_err());
        assert!(parse_cpus("hide=[]").is_err());
    }
}
