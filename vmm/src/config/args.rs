//! The command line, in Cloud Hypervisor's form: clap, as upstream uses
//! it, with upstream's flags and syntax (`--cpus boot=N`, `--memory
//! size=`, `--disk KEY=VALUE,...` repeatable or with several values,
//! `-v` counted, ...). Each option's value goes to its group's parser
//! ([`super::disk`], [`super::cpus`], ...). Upstream's flags this VMM does
//! not implement are known to the parser (hidden from `--help`) so that
//! each is refused by name, in one line, instead of being taken for a
//! typo or ignored ([`UNSUPPORTED`]).
//!
//! The VM's options (`--kernel`, `--cpus`, `--memory`, `--disk`, ...)
//! become a [`VmConfig`], checked by the function that checks
//! `vm.create`'s ([`VmConfig::resolve`]); without them, `--api-socket`
//! alone starts a VMM that waits for `vm.create`. As upstream, VM
//! options without `--kernel` are a usage error.
//!
//! Enters as the process arguments (without argv[0]); leaves as a
//! [`Command`].

use std::path::PathBuf;

use clap::{Arg, ArgAction, ArgMatches};

use super::api_socket::{parse_api_socket, parse_event_monitor};
use super::cpus::parse_cpus;
use super::disk::parse_disk;
use super::error::ConfigError;
use super::memory::parse_memory;
use super::run_config::{RunConfig, SeccompMode};
use super::serial::parse_serial;
use super::vm_config::{ConsoleConfig, ConsoleMode, PayloadConfig, VmConfig};
use ch_util::kv::KvError;

/// What the user asked for.
#[derive(Debug)]
pub enum Command {
    Run(Box<RunConfig>),
    Help,
    Version,
}

/// Upstream's flags that this VMM does not implement, each with why.
pub const UNSUPPORTED: &[(&str, &str)] = &[
    ("balloon", "there is no virtio-balloon device"),
    ("debug-console", "there is no debug console (port 0xe9)"),
    ("device", "there is no VFIO device assignment"),
    ("firmware", "only --kernel (PVH ELF or bzImage) boots"),
    ("fs", "there is no virtio-fs device"),
    (
        "generic-vhost-user",
        "only vhost-user block disks (--disk vhost_user=on)",
    ),
    ("landlock", "there is no Landlock sandbox (seccomp only)"),
    (
        "landlock-rules",
        "there is no Landlock sandbox (seccomp only)",
    ),
    ("log-format", "log lines have one fixed format"),
    ("memory-zone", "guest RAM is one region (--memory)"),
    ("net", "there is no network device (virtio-blk disks only)"),
    ("no-shutdown", "a guest power-off always ends the VMM"),
    ("numa", "there is no NUMA topology"),
    ("pci-segment", "there is one PCI segment"),
    ("platform", "there are no platform options"),
    ("pmem", "there is no virtio-pmem device"),
    ("pvpanic", "there is no pvpanic device"),
    (
        "rate-limit-group",
        "throttling is per disk (--disk bw_*/ops_* keys)",
    ),
    ("restore", "there are no VM snapshots"),
    ("rng", "there is no virtio-rng device"),
    ("rtc", "there is no virtio-rtc device"),
    ("tpm", "there is no TPM device"),
    ("user-device", "there are no vfio-user devices"),
    ("vdpa", "there are no vDPA devices"),
    ("vsock", "there is no virtio-vsock device"),
    ("watchdog", "there is no virtio-watchdog device"),
];

const DISK_HELP: &str = "Disk parameters (repeatable)
\"path=<disk_image_path>|nbd://<host>[:<port>]/<export>|nbd+unix:///<export>?socket=<socket_path>,\
readonly=on|off,direct=on|off,num_queues=<number_of_queues>,queue_size=<size_of_each_queue>,\
vhost_user=on|off,socket=<vhost_user_socket_path>,bw_size=<bytes>,bw_one_time_burst=<bytes>,\
bw_refill_time=<ms>,ops_size=<io_ops>,ops_one_time_burst=<io_ops>,ops_refill_time=<ms>,\
id=<device_id>,queue_affinity=<list_of_queue_indices_with_their_associated_cpuset>,\
serial=<serial_number>,backing_files=on|off,image_type=<auto|raw|qcow2>,\
lock_granularity=byte-range,cache=none|writeback|writethrough|directsync|unsafe,\
engine=auto|io_uring|aio|threads|sync,poll_us=<0..1000>,reconnect_delay=<seconds>\"
(engine=aio needs cache=none|directsync; iommu=off, pci_segment=0, sparse=on; docs/disk-options.md)";

/// The parser: our flags with help, upstream's others hidden.
pub fn cli() -> clap::Command {
    let value =
        |name: &'static str, help: &'static str| Arg::new(name).long(name).help(help).num_args(1);
    // An option that describes the VM: it needs the payload, as in
    // upstream's clap group.
    let vm_value = |name: &'static str, help: &'static str| value(name, help).requires("kernel");
    let mut cmd = clap::Command::new("cloud-hypervisor")
        .version(concat!("v", env!("CARGO_PKG_VERSION")))
        .about("Launch a VM under KVM with virtio-blk disks over raw and qcow2 images.")
        .next_line_help(true)
        .arg(value(
            "api-socket",
            "HTTP API socket (UNIX domain socket): path=<path> or fd=<fd>. \
             Alone, it starts a VMM that waits for vm.create",
        ))
        .arg(vm_value("cmdline", "Kernel command line").allow_hyphen_values(true))
        .arg(vm_value(
            "console",
            "Virtio console: \"off|null\" (there is no virtio console; use --serial)",
        ))
        .arg(vm_value(
            "cpus",
            "boot=<boot_vcpus>,max=<max_vcpus, equal to boot>,model=host|x86-64-v1,\
             hide=[<feature>,...] [default: boot=1]",
        ))
        .arg(
            Arg::new("disk")
                .long("disk")
                .help(DISK_HELP)
                .requires("kernel")
                .num_args(1..)
                .action(ArgAction::Append),
        )
        .arg(value(
            "event-monitor",
            "Path to report events on: path=<path> or fd=<fd>",
        ))
        .arg(vm_value("initramfs", "Path to initramfs image"))
        .arg(value(
            "kernel",
            "Path to the kernel to load: an ELF vmlinux with a PVH note, or a bzImage",
        ))
        .arg(value(
            "log-file",
            "Log file. Standard error is used if not specified",
        ))
        .arg(vm_value(
            "memory",
            "Memory parameters \"size=<guest_memory_size>,shared=on|off\" [default: size=512M]",
        ))
        .arg(value(
            "seccomp",
            "[default: true] [possible values: true, false, log]",
        ))
        .arg(vm_value(
            "serial",
            "Control serial port: \"off|null|tty|file=<path>\" [default: tty]",
        ))
        .arg(
            Arg::new("v")
                .short('v')
                .long("verbose")
                .help("Sets the level of debugging output")
                .action(ArgAction::Count),
        );
    for (name, _) in UNSUPPORTED {
        cmd = cmd.arg(
            Arg::new(*name)
                .long(*name)
                .num_args(0..)
                .action(ArgAction::Append)
                .allow_hyphen_values(false)
                .hide(true),
        );
    }
    cmd
}

/// `--help`'s text.
pub fn help() -> String {
    cli().render_help().to_string()
}

/// `--version`'s text.
pub fn version() -> String {
    cli().render_version().trim_end().to_string()
}

fn one(m: &ArgMatches, name: &str) -> Option<String> {
    m.get_one::<String>(name).cloned()
}

fn seccomp_mode(v: &str) -> Result<SeccompMode, ConfigError> {
    match v {
        "true" | "on" => Ok(SeccompMode::Enforce),
        "false" | "off" => Ok(SeccompMode::Off),
        "log" => Ok(SeccompMode::Log),
        _ => Err(KvError::BadValue {
            option: "--seccomp",
            key: "mode".into(),
            value: v.into(),
            reason: "expected true, false or log".into(),
        }
        .into()),
    }
}

pub fn parse_args(args: &[String]) -> Result<Command, ConfigError> {
    let argv = std::iter::once("cloud-hypervisor".to_string()).chain(args.iter().cloned());
    let m = match cli().try_get_matches_from(argv) {
        Ok(m) => m,
        Err(e) => {
            return match e.kind() {
                clap::error::ErrorKind::DisplayHelp => Ok(Command::Help),
                clap::error::ErrorKind::DisplayVersion => Ok(Command::Version),
                _ => Err(ConfigError::Usage(e.render().to_string())),
            }
        }
    };
    if let Some((flag, why)) = UNSUPPORTED.iter().find(|(n, _)| m.contains_id(n)) {
        return Err(ConfigError::Unsupported { flag, why });
    }
    let console = one(&m, "console")
        .map(|c| match c.as_str() {
            "off" => Ok(ConsoleConfig::mode(ConsoleMode::Off)),
            "null" => Ok(ConsoleConfig::mode(ConsoleMode::Null)),
            _ => Err(KvError::BadValue {
                option: "--console",
                key: "mode".into(),
                value: c,
                reason: "there is no virtio console here: only off or null (use --serial)".into(),
            }),
        })
        .transpose()?;
    let api_socket = one(&m, "api-socket")
        .map(|v| parse_api_socket(&v))
        .transpose()?;
    let event_monitor = one(&m, "event-monitor")
        .map(|v| parse_event_monitor(&v))
        .transpose()?;
    let seccomp = one(&m, "seccomp").map(|v| seccomp_mode(&v)).transpose()?;
    let vm = vm_config(&m, console)?;
    if vm.is_none() && api_socket.is_none() {
        return Err(ConfigError::MissingKernel);
    }
    Ok(Command::Run(Box::new(RunConfig {
        vm,
        seccomp: seccomp.unwrap_or_default(),
        verbosity: m.get_count("v"),
        api_socket,
        event_monitor,
        log_file: one(&m, "log-file").map(PathBuf::from),
    })))
}

/// The options that describe a VM.
const VM_OPTIONS: &[&str] = &[
    "kernel",
    "initramfs",
    "cmdline",
    "cpus",
    "memory",
    "disk",
    "serial",
    "console",
];

/// The VM the options describe, checked; `None` when none is (a VMM
/// for the API to fill).
fn vm_config(
    m: &ArgMatches,
    console: Option<ConsoleConfig>,
) -> Result<Option<VmConfig>, ConfigError> {
    if !VM_OPTIONS.iter().any(|n| m.contains_id(n)) {
        return Ok(None);
    }
    // clap refuses them without --kernel (`requires`), as upstream's
    // group does.
    let kernel = one(m, "kernel").ok_or(ConfigError::MissingKernel)?;
    let mut disks = Vec::new();
    for v in m.get_many::<String>("disk").into_iter().flatten() {
        let disk = parse_disk(v)?;
        // Each disk is checked on its own first, so its error names the
        // --disk it came from.
        disk.resolve()?;
        disks.push(disk);
    }
    let mut vm = VmConfig {
        cpus: one(m, "cpus")
            .map(|v| parse_cpus(&v))
            .transpose()?
            .unwrap_or_default(),
        memory: one(m, "memory")
            .map(|v| parse_memory(&v))
            .transpose()?
            .unwrap_or_default(),
        payload: Some(PayloadConfig {
            kernel: Some(kernel),
            cmdline: one(m, "cmdline"),
            initramfs: one(m, "initramfs"),
            ..PayloadConfig::default()
        }),
        disks: (!disks.is_empty()).then_some(disks),
        // Ours: the terminal (upstream's default is null).
        serial: one(m, "serial")
            .map(|v| parse_serial(&v))
            .transpose()?
            .unwrap_or_else(|| ConsoleConfig::mode(ConsoleMode::Tty)),
        console,
        ..VmConfig::default()
    };
    vm.resolve()?;
    Ok(Some(vm))
}

#[cfg(test)]
mod tests {
    use super::super::{ApiSocketConfig, BootConfig, SerialMode};
    use super::*;

    fn args(s: &[&str]) -> Vec<String> {
        s.iter().map(|a| a.to_string()).collect()
    }

    fn run_config(s: &[&str]) -> Result<RunConfig, ConfigError> {
        match parse_args(&args(s))? {
            Command::Run(c) => Ok(*c),
            other => panic!("expected a run config, got {other:?}"),
        }
    }

    /// The VM the command line describes, as it boots.
    fn run(s: &[&str]) -> Result<BootConfig, ConfigError> {
        let mut vm = run_config(s)?.vm.expect("a VM on the command line");
        Ok(vm.resolve().expect("checked at parse"))
    }

    #[test]
    fn full_command_line() {
        let c = run(&[
            "--kernel",
            "vmlinux",
            "--cmdline",
            "console=ttyS0",
            "--cpus",
            "boot=2",
            "--memory",
            "size=1G",
            "--disk",
            "path=a.qcow2,num_queues=4",
            "--disk=path=b.raw",
            "--serial",
            "off",
        ])
        .unwrap();
        assert_eq!(c.kernel, PathBuf::from("vmlinux"));
        assert_eq!(c.cmdline, "console=ttyS0");
        assert_eq!((c.cpus, c.memory), (2, 1 << 30));
        assert_eq!(c.disks.len(), 2);
        assert_eq!(c.disks[0].num_queues, 4);
        assert_eq!(c.disks[0].id.as_deref(), Some("_disk0"));
        assert_eq!(c.disks[1].id.as_deref(), Some("_disk1"));
        assert_eq!(c.serial, SerialMode::Off);
        let r = run_config(&["--kernel", "k", "--seccomp", "log", "-vv", "-v"]).unwrap();
        assert_eq!(r.api_socket, None);
        assert_eq!(r.seccomp, SeccompMode::Log);
        assert_eq!(r.verbosity, 3);
    }

    #[test]
    fn the_api_socket_alone_starts_a_vmm_without_a_vm() {
        let r = run_config(&["--api-socket", "path=/tmp/x.sock", "-v"]).unwrap();
        assert!(r.vm.is_none());
        assert_eq!(
            r.api_socket,
            Some(ApiSocketConfig::Path("/tmp/x.sock".into()))
        );
        let r = run_config(&["--api-socket", "/tmp/x.sock", "--event-monitor", "fd=5"]).unwrap();
        assert_eq!(
            r.event_monitor,
            Some(super::super::EventMonitorConfig::Fd(5))
        );
        // A VM's options need the kernel, as upstream's group does.
        for opts in [
            &["--disk", "path=a"][..],
            &["--cpus", "boot=2"],
            &["--memory", "size=64M"],
            &["--serial", "off"],
            &["--cmdline", "x"],
        ] {
            let mut a = vec!["--api-socket", "path=/tmp/x.sock"];
            a.extend_from_slice(opts);
            match run_config(&a) {
                Err(ConfigError::Usage(text)) => assert!(text.contains("--kernel"), "{text}"),
                other => panic!("{a:?}: {other:?}"),
            }
        }
        // The VM's config is the API's type, with upstream's keys.
        let vm = run_config(&["--kernel", "k", "--cpus", "boot=2", "--disk", "path=a"])
            .unwrap()
            .vm
            .unwrap();
        let v = serde_json::to_value(&vm).unwrap();
        assert_eq!(v["payload"]["kernel"], "k");
        assert_eq!(v["cpus"]["boot_vcpus"], 2);
        assert_eq!(v["disks"][0]["path"], "a");
        assert_eq!(v["serial"]["mode"], "Tty");
    }

    #[test]
    fn vhost_user_disks() {
        let c = run(&[
            "--kernel",
            "k",
            "--memory",
            "size=64M,shared=on",
            "--disk",
            "path=a.raw,id=a",
            "--disk",
            "vhost_user=on,socket=/s,num_queues=2,id=b",
        ])
        .unwrap();
        assert!(c.shared_memory);
        assert_eq!(c.disks.len(), 1);
        assert_eq!(c.vhost_user_disks.len(), 1);
        assert_eq!(c.vhost_user_disks[0].num_queues, 2);
        // Shared memory is required, naming both keys.
        let e = run(&["--kernel", "k", "--disk", "vhost_user=on,socket=/s"]).unwrap_err();
        assert_eq!(
            e,
            ConfigError::Vm(super::super::VmConfigError::VhostUserNeedsSharedMemory)
        );
        let msg = e.to_string();
        assert!(
            msg.contains("vhost_user") && msg.contains("shared=on"),
            "{msg}"
        );
        assert!(run(&[
            "--kernel",
            "k",
            "--memory",
            "shared=off",
            "--disk",
            "vhost_user=on,socket=/s"
        ])
        .is_err());
        // Ids are unique across both kinds of disk.
        assert!(matches!(
            run(&[
                "--kernel",
                "k",
                "--memory",
                "shared=on",
                "--disk",
                "path=a,id=x",
                "--disk",
                "vhost_user=on,socket=/s,id=x"
            ]),
            Err(ConfigError::Vm(
                super::super::VmConfigError::DuplicateDiskId(_)
            ))
        ));
    }

    #[test]
    fn default_disk_ids_skip_the_ones_given() {
        let c = run(&[
            "--kernel",
            "k",
            "--disk",
            "path=a",
            "--disk",
            "path=b,id=_disk0",
            "--disk",
            "path=c",
            "--api-socket",
            "path=/tmp/x.sock",
        ])
        .unwrap();
        let ids: Vec<_> = c.disks.iter().map(|d| d.id.clone().unwrap()).collect();
        assert_eq!(ids, ["_disk1", "_disk0", "_disk2"]);
    }

    #[test]
    fn help_version_and_errors() {
        assert!(matches!(parse_args(&args(&["--help"])), Ok(Command::Help)));
        assert!(matches!(
            parse_args(&args(&["--version"])),
            Ok(Command::Version)
        ));
        assert_eq!(run_config(&[]).unwrap_err(), ConfigError::MissingKernel);
        for bad in [
            &["--kernel", "k", "--bogus"][..],
            &["--kernel"],
            &["--kernel", "k", "--kernel", "j"],
        ] {
            assert!(matches!(run(bad), Err(ConfigError::Usage(_))), "{bad:?}");
        }
        let e = run(&["--kernel", "k", "--seccomp", "maybe"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("maybe"), "{e}");
        assert!(matches!(
            run(&[
                "--kernel",
                "k",
                "--disk",
                "path=a,id=x",
                "--disk",
                "path=b,id=x"
            ]),
            Err(ConfigError::Vm(
                super::super::VmConfigError::DuplicateDiskId(_)
            ))
        ));
    }

    #[test]
    fn upstream_syntax() {
        // Several values after one --disk, as upstream's clap takes them.
        let c = run(&[
            "--kernel",
            "k",
            "--disk",
            "path=a",
            "path=b",
            "--disk",
            "path=c,image_type=raw",
            "--console",
            "off",
            "--cpus",
            "boot=2,max=2",
            "--log-file",
            "/tmp/l",
            "--cmdline",
            "-x console=ttyS0",
        ])
        .unwrap();
        assert_eq!(c.disks.len(), 3);
        assert_eq!(c.cpus, 2);
        assert_eq!(c.cmdline, "-x console=ttyS0");
        let e = run(&["--kernel", "k", "--console", "tty"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--console") && e.contains("tty"), "{e}");
        let e = run(&["--kernel", "k", "--cpus", "boot=2,max=4"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("max"), "{e}");
    }

    #[test]
    fn upstream_flags_we_lack_are_refused_by_name() {
        for (flag, _) in UNSUPPORTED {
            for tail in [&[][..], &["x=1"][..]] {
                let mut a = vec!["--kernel", "k"];
                let long = format!("--{flag}");
                a.push(&long);
                a.extend_from_slice(tail);
                match run(&a) {
                    Err(e @ ConfigError::Unsupported { .. }) => {
                        let msg = e.to_string();
                        assert!(msg.contains(&long) && !msg.contains('\n'), "{msg}")
                    }
                    other => panic!("{a:?}: {other:?}"),
                }
            }
        }
        let help = help();
        assert!(
            !help.contains("--net"),
            "unsupported flags stay out of --help"
        );
        assert!(help.contains("--disk") && help.contains("--api-socket"));
        assert_eq!(
            version(),
            concat!("cloud-hypervisor v", env!("CARGO_PKG_VERSION"))
        );
    }
}
