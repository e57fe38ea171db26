//! `--cpus boot=N[,max=N][,model=NAME][,hide=[FEATURE,...]]`: the number of vCPUs
//! and the CPU model the guest sees. Enters as the option string, leaves
//! as the `cpus` part of a [`VmConfig`](super::vm_config::VmConfig)
//! ([`CpusConfig`]); [`resolve_cpus`] is the one check of such a part,
//! for the command line and for `vm.create`'s body alike.
//!
//! `model=host` (the default) shows the guest KVM's supported CPUID;
//! `model=x86-64-v1` only the x86-64 baseline; `hide=` removes features
//! (Linux's `/proc/cpuinfo` names) on top. The names are checked against
//! the hypervisor crate's table (`hypervisor::cpu_model`), so a typo is
//! refused before anything starts. Why a model: docs/vmm.md.

use super::error::ConfigError;
use super::vm_config::CpusConfig;
use ch_util::kv::{KvError, KvList};
use hypervisor::{BaseModel, CpuModel, Feature};

/// The MP table and our APIC id space keep this small.
pub const MAX_VCPUS: u8 = 64;

/// Why a `cpus` part cannot be used: the field (`boot_vcpus`,
/// `max_vcpus`, `model`, `hide`), its value and the reason.
#[derive(Debug, PartialEq, Eq)]
pub struct CpusError {
    pub field: &'static str,
    pub value: String,
    pub reason: String,
}

/// The vCPU count and CPU model `c` asks for, checked.
pub fn resolve_cpus(c: &CpusConfig) -> Result<(u8, CpuModel), CpusError> {
    let boot = match u8::try_from(c.boot_vcpus) {
        Ok(n) if (1..=MAX_VCPUS).contains(&n) => n,
        _ => {
            return Err(CpusError {
                field: "boot_vcpus",
                value: c.boot_vcpus.to_string(),
                reason: format!("expected a number from 1 to {MAX_VCPUS}"),
            })
        }
    };
    // Upstream's `max` (CPU hotplug's ceiling): there is no CPU hotplug,
    // so only `max` equal to `boot` is taken.
    if let Some(max) = c.max_vcpus.filter(|&m| m != c.boot_vcpus) {
        return Err(CpusError {
            field: "max_vcpus",
            value: max.to_string(),
            reason: format!("expected {boot}, the boot count (there is no CPU hotplug)"),
        });
    }
    let base = match c.model.as_deref() {
        None => BaseModel::default(),
        Some(name) => BaseModel::by_name(name).ok_or_else(|| CpusError {
            field: "model",
            value: name.to_string(),
            reason: format!("expected one of {}", BaseModel::NAMES),
        })?,
    };
    let mut hidden: Vec<Feature> = Vec::new();
    for name in c.hide.iter().flatten() {
        let feature = Feature::by_name(name).ok_or_else(|| CpusError {
            field: "hide",
            value: name.clone(),
            reason: format!("unknown CPU feature '{name}' (the names are listed in docs/vmm.md)"),
        })?;
        if !hidden.contains(&feature) {
            hidden.push(feature);
        }
    }
    Ok((boot, CpuModel { base, hidden }))
}

pub fn parse_cpus(s: &str) -> Result<CpusConfig, ConfigError> {
    let mut kv = KvList::parse("--cpus", s)?;
    let number = |v: &str| {
        v.parse::<u32>()
            .map_err(|_| "expected a number".to_string())
    };
    let boot = kv.take_parsed("boot", number)?;
    let max = kv.take_parsed("max", number)?;
    let model = kv.take("model")?;
    let hide = kv.take_parsed("hide", parse_feature_list)?;
    kv.finish()?;
    let c = CpusConfig {
        boot_vcpus: boot.unwrap_or(1),
        max_vcpus: max,
        model,
        hide,
        ..CpusConfig::default()
    };
    if let Err(e) = resolve_cpus(&c) {
        let key = match e.field {
            "boot_vcpus" => "boot",
            "max_vcpus" => "max",
            other => other,
        };
        return Err(KvError::BadValue {
            option: "--cpus",
            key: key.into(),
            value: e.value,
            reason: e.reason,
        }
        .into());
    }
    Ok(c)
}

/// `FEATURE` or `[FEATURE,FEATURE,...]`, as names (checked by
/// [`resolve_cpus`]).
fn parse_feature_list(v: &str) -> Result<Vec<String>, String> {
    let list = v
        .strip_prefix('[')
        .and_then(|l| l.strip_suffix(']'))
        .unwrap_or(v);
    list.split(',')
        .map(|name| {
            if name.is_empty() {
                Err("expected CPU feature names".to_string())
            } else {
                Ok(name.to_string())
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolved(s: &str) -> (u8, CpuModel) {
        resolve_cpus(&parse_cpus(s).unwrap()).unwrap()
    }

    #[test]
    fn boot_count() {
        assert_eq!(resolved("boot=4").0, 4);
        assert!(parse_cpus("boot=0")
            .unwrap_err()
            .to_string()
            .contains("boot"));
        assert!(parse_cpus("boot=65").is_err());
        assert!(parse_cpus("max=4").unwrap_err().to_string().contains("max"));
        assert_eq!(resolved("boot=4,max=4").0, 4);
        assert!(parse_cpus("boot=2,max=4")
            .unwrap_err()
            .to_string()
            .contains("hotplug"));
    }

    #[test]
    fn model_and_hidden_features() {
        let c = resolved("boot=2").1;
        assert_eq!(c, CpuModel::default(), "host passthrough by default");
        let c = resolved("boot=2,model=x86-64-v1,hide=[xsave,popcnt,xsave]").1;
        assert_eq!(c.base, BaseModel::X86_64V1);
        let names: Vec<_> = c.hidden.iter().map(|f| f.name).collect();
        assert_eq!(names, ["xsave", "popcnt"]);
        let (boot, c) = resolved("hide=cx16");
        assert_eq!((boot, c.hidden.len()), (1, 1));
        let c = resolved("boot=2,hide=[kvm_pv_send_ipi,kvm_pv_unhalt]").1;
        assert_eq!(c.base, BaseModel::Host);
        assert_eq!(c.hidden.len(), 2);
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

    #[test]
    fn the_api_form_is_checked_the_same_way() {
        let c: CpusConfig = serde_json::from_str(r#"{"boot_vcpus":2,"max_vcpus":2}"#).unwrap();
        assert_eq!(resolve_cpus(&c).unwrap().0, 2);
        let c: CpusConfig = serde_json::from_str(r#"{"boot_vcpus":0}"#).unwrap();
        assert_eq!(resolve_cpus(&c).unwrap_err().field, "boot_vcpus");
        let c: CpusConfig = serde_json::from_str(r#"{"boot_vcpus":2,"max_vcpus":4}"#).unwrap();
        assert_eq!(resolve_cpus(&c).unwrap_err().field, "max_vcpus");
    }
}
