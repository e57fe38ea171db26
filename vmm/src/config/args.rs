//! Walks argv: each `--option VALUE` (or `--option=VALUE`) goes to its
//! group's parser. Enters as the process arguments (without argv[0]);
//! leaves as a [`Command`].

use std::path::PathBuf;

use super::api_socket::{parse_api_socket, ApiSocketConfig};
use super::cpus::{parse_cpus, CpusConfig};
use super::disk::parse_disk;
use super::memory::{parse_memory, MemoryConfig};
use super::serial::{parse_serial, SerialMode};
use super::vhost_user_disk::{is_vhost_user, parse_vhost_user_disk};
use super::{ConfigError, SeccompMode, VmConfig};
use block::options::kv::KvError;

/// What the user asked for.
#[derive(Debug)]
pub enum Command {
    Run(Box<VmConfig>),
    Help,
    Version,
}

pub const USAGE: &str = "\
Usage: cloud-hypervisor --kernel PATH [OPTIONS]

Boots a guest kernel under KVM with virtio-blk disks (virtio-pci, MSI-X).

Options:
  --kernel PATH          ELF vmlinux with a PVH note, or a bzImage
  --initramfs PATH       initial ramdisk
  --cmdline STRING       kernel command line
  --cpus boot=N[,model=host|x86-64-v1][,hide=[FEATURE,...]]
                         number of vCPUs (default 1); the CPU model: KVM's
                           CPUID (host, default) or the x86-64 baseline,
                           minus the hidden features (/proc/cpuinfo names)
  --memory size=SIZE[,shared=on|off]
                         guest RAM, K/M/G suffixes (default 512M);
                           shared=on puts it in a memfd mapped shared
                           (needed by vhost_user disks)
  --disk KEY=VALUE,...   a virtio-blk disk (repeatable); keys:
                           path=PATH|nbd://HOST[:PORT]/NAME|
                           nbd+unix:///NAME?socket=SOCK (required),
                           reconnect_delay=SECONDS (NBD), readonly=on|off,
                           direct=on|off, cache=none|writeback|writethrough|
                           directsync|unsafe, num_queues=N, queue_size=N,
                           image_type=auto|raw|qcow2,
                           engine=auto|io_uring|aio|threads|sync (aio needs
                           cache=none|directsync), id=NAME, serial=STRING,
                           bw_size=BYTES, bw_one_time_burst=BYTES,
                           bw_refill_time=MS, ops_size=N,
                           ops_one_time_burst=N, ops_refill_time=MS,
                           queue_affinity=[QUEUE@[CPUS],...],
                           poll_us=0..1000 (docs/disk-options.md)
  --disk vhost_user=on,socket=PATH[,num_queues=N][,queue_size=N][,id=NAME]
                         a virtio-blk disk served by a vhost-user backend
                           (e.g. ch-storage-daemon); needs --memory
                           shared=on; the image keys belong to the backend
  --api-socket path=PATH|fd=N
                         serve the HTTP API (Cloud Hypervisor's REST API,
                           docs/api.md) on a Unix socket; ch-remote is its
                           client
  --serial MODE          tty (default), file=PATH or off
  --seccomp MODE         true (default), false or log
  -v                     more logging (repeatable)
  --version              print the version
  --help                 print this help
";

pub fn parse_args(args: &[String]) -> Result<Command, ConfigError> {
    let mut kernel: Option<PathBuf> = None;
    let mut initramfs: Option<PathBuf> = None;
    let mut cmdline: Option<String> = None;
    let mut cpus: Option<CpusConfig> = None;
    let mut memory: Option<MemoryConfig> = None;
    let mut serial: Option<SerialMode> = None;
    let mut seccomp: Option<SeccompMode> = None;
    let mut api_socket: Option<ApiSocketConfig> = None;
    let mut disks = Vec::new();
    let mut vhost_user_disks = Vec::new();
    let mut verbosity: u8 = 0;

    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        match name {
            "--help" | "-h" => return Ok(Command::Help),
            "--version" | "-V" => return Ok(Command::Version),
            "-v" | "--verbose" => {
                verbosity = verbosity.saturating_add(1);
                continue;
            }
            s if s.starts_with("-v") && s[1..].bytes().all(|b| b == b'v') => {
                let n = u8::try_from(s.len() - 1).unwrap_or(u8::MAX);
                verbosity = verbosity.saturating_add(n);
                continue;
            }
            _ => {}
        }
        let value = |it: &mut std::slice::Iter<'_, String>| -> Result<String, ConfigError> {
            match inline.clone() {
                Some(v) => Ok(v),
                None => it
                    .next()
                    .cloned()
                    .ok_or_else(|| ConfigError::MissingArgumentValue(name.to_string())),
            }
        };
        fn once<T>(slot: &mut Option<T>, name: &str, v: T) -> Result<(), ConfigError> {
            if slot.is_some() {
                return Err(ConfigError::RepeatedArgument(name.to_string()));
            }
            *slot = Some(v);
            Ok(())
        }
        match name {
            "--kernel" => once(&mut kernel, name, PathBuf::from(value(&mut it)?))?,
            "--initramfs" => once(&mut initramfs, name, PathBuf::from(value(&mut it)?))?,
            "--cmdline" => once(&mut cmdline, name, value(&mut it)?)?,
            "--cpus" => once(&mut cpus, name, parse_cpus(&value(&mut it)?)?)?,
            "--memory" => once(&mut memory, name, parse_memory(&value(&mut it)?)?)?,
            "--serial" => once(&mut serial, name, parse_serial(&value(&mut it)?)?)?,
            "--api-socket" => once(&mut api_socket, name, parse_api_socket(&value(&mut it)?)?)?,
            "--seccomp" => {
                let v = value(&mut it)?;
                let mode = match v.as_str() {
                    "true" | "on" => SeccompMode::Enforce,
                    "false" | "off" => SeccompMode::Off,
                    "log" => SeccompMode::Log,
                    _ => {
                        return Err(KvError::BadValue {
                            option: "--seccomp",
                            key: "mode".into(),
                            value: v,
                            reason: "expected true, false or log".into(),
                        }
                        .into())
                    }
                };
                once(&mut seccomp, name, mode)?
            }
            "--disk" => {
                let v = value(&mut it)?;
                if is_vhost_user(&v)? {
                    vhost_user_disks.push(parse_vhost_user_disk(&v)?);
                } else {
                    disks.push(parse_disk(&v)?);
                }
            }
            _ => return Err(ConfigError::UnknownArgument(arg.clone())),
        }
    }
    let kernel = kernel.ok_or(ConfigError::MissingKernel)?;
    let memory = memory.unwrap_or_default();
    if !vhost_user_disks.is_empty() && !memory.shared {
        return Err(ConfigError::VhostUserNeedsSharedMemory);
    }
    let mut ids: Vec<&str> = disks
        .iter()
        .filter_map(|d| d.id.as_deref())
        .chain(vhost_user_disks.iter().filter_map(|d| d.id.as_deref()))
        .collect();
    ids.sort_unstable();
    if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
        return Err(ConfigError::DuplicateDiskId(w[0].to_string()));
    }
    // Disks without an id get Cloud Hypervisor's default ones, in PCI
    // order (in-VMM disks first), skipping ids the user took.
    let taken: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
    let taken: Vec<&str> = taken.iter().map(String::as_str).collect();
    let mut next = 0;
    for id in disks
        .iter_mut()
        .map(|d| &mut d.id)
        .chain(vhost_user_disks.iter_mut().map(|d| &mut d.id))
    {
        if id.is_none() {
            *id = Some(super::next_free_disk_id(&mut next, &taken));
        }
    }
    let cpus = cpus.unwrap_or_default();
    Ok(Command::Run(Box::new(VmConfig {
        kernel,
        initramfs,
        cmdline: cmdline.unwrap_or_default(),
        cpus: cpus.boot,
        cpu_model: cpus.model,
        memory: memory.size,
        shared_memory: memory.shared,
        disks,
        vhost_user_disks,
        serial: serial.unwrap_or(SerialMode::Tty),
        seccomp: seccomp.unwrap_or_default(),
        verbosity,
        api_socket,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &[&str]) -> Vec<String> {
        s.iter().map(|a| a.to_string()).collect()
    }

    fn run(s: &[&str]) -> Result<VmConfig, ConfigError> {
        match parse_args(&args(s))? {
            Command::Run(c) => Ok(*c),
            other => panic!("expected a run config, got {other:?}"),
        }
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
            "--seccomp",
            "log",
            "-vv",
            "-v",
        ])
        .unwrap();
        assert_eq!(c.kernel, PathBuf::from("vmlinux"));
        assert_eq!(c.cmdline, "console=ttyS0");
        assert_eq!((c.cpus, c.memory), (2, 1 << 30));
        assert_eq!(c.disks.len(), 2);
        assert_eq!(c.disks[0].num_queues, 4);
        assert_eq!(c.disks[0].id.as_deref(), Some("_disk0"));
        assert_eq!(c.disks[1].id.as_deref(), Some("_disk1"));
        assert_eq!(c.api_socket, None);
        assert_eq!(c.serial, SerialMode::Off);
        assert_eq!(c.seccomp, SeccompMode::Log);
        assert_eq!(c.verbosity, 3);
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
        assert_eq!(e, ConfigError::VhostUserNeedsSharedMemory);
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
            Err(ConfigError::DuplicateDiskId(_))
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
        assert_eq!(
            c.api_socket,
            Some(ApiSocketConfig::Path("/tmp/x.sock".into()))
        );
    }

    #[test]
    fn help_version_and_errors() {
        assert!(matches!(parse_args(&args(&["--help"])), Ok(Command::Help)));
        assert!(matches!(
            parse_args(&args(&["--version"])),
            Ok(Command::Version)
        ));
        assert_eq!(run(&[]).unwrap_err(), ConfigError::MissingKernel);
        assert!(matches!(
            run(&["--kernel", "k", "--bogus"]),
            Err(ConfigError::UnknownArgument(_))
        ));
        assert!(matches!(
            run(&["--kernel"]),
            Err(ConfigError::MissingArgumentValue(_))
        ));
        assert!(matches!(
            run(&["--kernel", "k", "--kernel", "j"]),
            Err(ConfigError::RepeatedArgument(_))
        ));
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
            Err(ConfigError::DuplicateDiskId(_))
        ));
    }
}
