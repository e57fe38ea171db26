//! `VmConfig` as upstream's clients send it: what deserializes, what
//! `vm.create` refuses by name, and what `resolve` makes of it.

use super::*;
use crate::config::vm_config_error::VmConfigError;
use crate::config::SerialMode;

/// What upstream's `vm.info` shows for a VM created with a kernel, two
/// vCPUs, 128 MiB and one disk (its defaults included).
const UPSTREAMS_OWN: &str = r#"{"cpus":{"boot_vcpus":2,"max_vcpus":2,"kvm_hyperv":false,
    "max_phys_bits":46,"features":{"amx":false},"nested":true,"core_scheduling":"Vm",
    "profile":"Host"},"memory":{"size":134217728,"mergeable":false,"hotplug_method":"Acpi",
    "shared":false,"hugepages":false,"prefault":false,"reserve":false,"thp":true},
    "payload":{"kernel":"/k/guest.elf","cmdline":"disks=1"},"disks":[{"id":"disk0",
    "pci_segment":0,"path":"/d/d.qcow2","readonly":false,"direct":false,"num_queues":2,
    "queue_size":128,"vhost_user":false,"disable_io_uring":false,"disable_aio":false,
    "backing_files":false,"sparse":true,"image_type":"Unknown","lock_granularity":"ByteRange"}],
    "rng":{"pci_segment":0,"src":"/dev/urandom"},"serial":{"file":"/s/serial.log",
    "mode":"File"},"console":{"mode":"Off","pci_segment":0},"debug_console":{"mode":"Off",
    "iobase":233},"pvpanic":false,"iommu":false,"watchdog":false,"landlock_enable":false}"#;

fn parse(s: &str) -> VmConfig {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("{s}: {e}"))
}

#[test]
fn upstreams_exported_config_is_taken_and_boots_as_asked() {
    let mut c = parse(UPSTREAMS_OWN);
    c.refuse_unimplemented().unwrap();
    let b = c.resolve().unwrap();
    assert_eq!(b.kernel.to_str(), Some("/k/guest.elf"));
    assert_eq!(
        (b.cpus, b.memory, b.cmdline.as_str()),
        (2, 128 << 20, "disks=1")
    );
    assert_eq!(b.disks.len(), 1);
    assert_eq!(b.disks[0].num_queues, 2);
    assert_eq!(b.serial, SerialMode::File("/s/serial.log".into()));
}

#[test]
fn defaults_are_upstreams() {
    let mut c = parse(r#"{"payload":{"kernel":"/k"}}"#);
    let b = c.resolve().unwrap();
    assert_eq!((b.cpus, b.memory), (1, 512 << 20));
    // Upstream's default serial port is none; no console either.
    assert_eq!(b.serial, SerialMode::Off);
    assert!(c.console.is_none());
    assert!(b.disks.is_empty());
}

#[test]
fn parts_this_vmm_lacks_are_refused_by_name() {
    for (body, field) in [
        (r#"{"net":[{"tap":"t0"}]}"#, "net"),
        (r#"{"fs":[{"tag":"x","socket":"/s"}]}"#, "fs"),
        (r#"{"vsock":{"cid":3,"socket":"/v"}}"#, "vsock"),
        (r#"{"pmem":[{"file":"/p"}]}"#, "pmem"),
        (r#"{"rng":{"src":"/dev/hwrng"}}"#, "rng"),
        (r#"{"balloon":{"size":0,"deflate_on_oom":true}}"#, "balloon"),
        (r#"{"devices":[{"path":"/sys/bus/pci/x"}]}"#, "devices"),
        (r#"{"iommu":true}"#, "iommu"),
        (r#"{"watchdog":true}"#, "watchdog"),
        (
            r#"{"memory":{"size":1073741824,"hugepages":true}}"#,
            "memory.hugepages",
        ),
        (
            r#"{"memory":{"size":1073741824,"hotplug_size":1073741824}}"#,
            "memory.hotplug_size",
        ),
        (
            r#"{"cpus":{"boot_vcpus":1,"max_vcpus":1,"kvm_hyperv":true}}"#,
            "cpus.kvm_hyperv",
        ),
        (
            r#"{"cpus":{"boot_vcpus":1,"max_vcpus":1,"features":{"amx":true}}}"#,
            "cpus.features",
        ),
        (r#"{"payload":{"firmware":"/fw"}}"#, "payload.firmware"),
        (r#"{"debug_console":{"mode":"Tty"}}"#, "debug_console"),
    ] {
        let e = parse(body).refuse_unimplemented().unwrap_err();
        assert_eq!(e.field, field, "{body}");
        assert!(e.to_string().contains(field), "{e}");
    }
    // Empty parts ask for nothing.
    for body in [
        r#"{"net":[],"fs":null,"pmem":[],"vsock":null,"numa":null}"#,
        r#"{"rng":{"src":"/dev/urandom"},"balloon":null,"devices":[]}"#,
    ] {
        parse(body).refuse_unimplemented().unwrap();
    }
}

#[test]
fn wrong_types_and_unknown_values_do_not_deserialize() {
    for body in [
        r#"{"cpus":{"boot_vcpus":"two"}}"#,
        r#"{"memory":{"size":-1}}"#,
        r#"{"payload":{"kernel":7}}"#,
        r#"{"disks":{"path":"/x"}}"#,
        r#"{"serial":{"mode":"Fancy"}}"#,
        r#"{"iommu":"no"}"#,
    ] {
        assert!(serde_json::from_str::<VmConfig>(body).is_err(), "{body}");
    }
}

#[test]
fn values_are_checked_at_resolve_with_the_field_named() {
    for (body, field) in [
        (r#"{}"#, "payload.kernel"),
        (r#"{"payload":{"cmdline":"x"}}"#, "payload.kernel"),
        (
            r#"{"payload":{"kernel":"/k"},"cpus":{"boot_vcpus":0}}"#,
            "cpus.boot_vcpus",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"cpus":{"boot_vcpus":2,"max_vcpus":4}}"#,
            "cpus.max_vcpus",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"cpus":{"boot_vcpus":1,"model":"z80"}}"#,
            "cpus.model",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"memory":{"size":1}}"#,
            "memory.size",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"serial":{"mode":"Pty"}}"#,
            "serial.mode",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"serial":{"mode":"File"}}"#,
            "serial.mode",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"console":{"mode":"Tty"}}"#,
            "console.mode",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"disks":[{"path":"/a","num_queues":0}]}"#,
            "num_queues",
        ),
        (
            r#"{"payload":{"kernel":"/k"},"disks":[{"num_queues":1}]}"#,
            "path",
        ),
    ] {
        let e = parse(body).resolve().unwrap_err().to_string();
        assert!(e.contains(field), "{body}: {e}");
    }
    let e = parse(
        r#"{"payload":{"kernel":"/k"},"disks":[{"path":"/a","id":"x"},{"path":"/b","id":"x"}]}"#,
    )
    .resolve()
    .unwrap_err();
    assert_eq!(e, VmConfigError::DuplicateDiskId("x".into()));
    let e =
        parse(r#"{"payload":{"kernel":"/k"},"disks":[{"vhost_user":true,"vhost_socket":"/s"}]}"#)
            .resolve()
            .unwrap_err();
    assert_eq!(e, VmConfigError::VhostUserNeedsSharedMemory);
}

#[test]
fn disks_get_default_ids_written_back() {
    let mut c = parse(
        r#"{"payload":{"kernel":"/k"},"memory":{"size":67108864,"shared":true},
        "disks":[{"vhost_user":true,"vhost_socket":"/s"},{"path":"/a"},{"path":"/b","id":"_disk0"}]}"#,
    );
    let b = c.resolve().unwrap();
    let ids: Vec<_> = c
        .disks
        .as_ref()
        .unwrap()
        .iter()
        .map(|d| d.id.clone().unwrap())
        .collect();
    // In-VMM disks first (skipping the taken _disk0), then vhost-user.
    assert_eq!(ids, ["_disk2", "_disk1", "_disk0"]);
    assert_eq!(b.disks[0].id.as_deref(), Some("_disk1"));
    assert_eq!(b.vhost_user_disks[0].id.as_deref(), Some("_disk2"));
}

#[test]
fn serializes_back_with_upstreams_keys() {
    let c = parse(r#"{"payload":{"kernel":"/k","cmdline":"c"},"cpus":{"boot_vcpus":2}}"#);
    let v = serde_json::to_value(&c).unwrap();
    assert_eq!(
        v["payload"],
        serde_json::json!({"kernel": "/k", "cmdline": "c"})
    );
    assert_eq!(v["cpus"]["boot_vcpus"], 2);
    assert_eq!(v["memory"]["size"], 512 << 20);
    assert_eq!(v["serial"]["mode"], "Null");
    for (k, want) in [("iommu", false), ("pvpanic", false), ("watchdog", false)] {
        assert_eq!(v[k], want, "{k}");
    }
    assert!(v.get("net").is_none() && v.get("console").is_none());
    let back: VmConfig = serde_json::from_value(v).unwrap();
    assert_eq!(back, c);
}
