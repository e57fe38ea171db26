//! The endpoint table: every API endpoint this VMM serves, one row each
//! (name, method, body type, handler, and the `ch-remote` verb that
//! calls it). The API server routes by it (`crate::api::routes`) and
//! `ch-remote` builds its requests and usage from it
//! (`crate::api::client`); the handlers are the control loop's
//! (`crate::control`). A new endpoint is a row here and its handler.
//!
//! The rows follow Cloud Hypervisor's names and `ch-remote`'s verbs and
//! argument syntax; `vm.snapshot-disk` and `vm.disk-info` are ours
//! (docs/api.md has the table against upstream's).

use crate::api::backup_types::BackupBeginBody;
use crate::api::bitmap_types::{
    BitmapAddBody, BitmapBody, BitmapMergeBody, TransactionAction, TransactionBody,
};
use crate::api::endpoint::{Endpoint, Flag, FlagKind, Method, VerbArgs};
use crate::api::job_flags::{COMMIT_FLAGS, STREAM_FLAGS};
use crate::api::types::{
    DiskCommitBody, DiskMirrorBody, DiskStreamBody, IdBody, JobBody, ResizeDiskBody,
    SnapshotDiskBody, SnapshotExternalBody,
};
use crate::config::{DiskConfig, VmConfig};
use crate::control::Control;

const RESIZE_DISK_FLAGS: &[Flag] = &[
    Flag {
        flag: "disk",
        field: "id",
        kind: FlagKind::Text,
    },
    Flag {
        flag: "size",
        field: "desired_size",
        kind: FlagKind::Size,
    },
    Flag {
        flag: "shrink",
        field: "shrink",
        kind: FlagKind::Switch,
    },
];

const SNAPSHOT_DISK_FLAGS: &[Flag] = &[
    Flag {
        flag: "disk",
        field: "id",
        kind: FlagKind::Text,
    },
    Flag {
        flag: "name",
        field: "name",
        kind: FlagKind::Text,
    },
];

const DISK_FLAG: Flag = Flag {
    flag: "disk",
    field: "id",
    kind: FlagKind::Text,
};

const NAME_FLAG: Flag = Flag {
    flag: "name",
    field: "name",
    kind: FlagKind::Text,
};

const BITMAP_ADD_FLAGS: &[Flag] = &[
    DISK_FLAG,
    NAME_FLAG,
    Flag {
        flag: "granularity",
        field: "granularity",
        kind: FlagKind::OptionalSize,
    },
    Flag {
        flag: "persistent",
        field: "persistent",
        kind: FlagKind::Switch,
    },
    Flag {
        flag: "disabled",
        field: "disabled",
        kind: FlagKind::Switch,
    },
];

const BITMAP_FLAGS: &[Flag] = &[DISK_FLAG, NAME_FLAG];

const BITMAP_MERGE_FLAGS: &[Flag] = &[
    DISK_FLAG,
    NAME_FLAG,
    Flag {
        flag: "sources",
        field: "sources",
        kind: FlagKind::List,
    },
];

const BACKUP_BEGIN_FLAGS: &[Flag] = &[
    DISK_FLAG,
    Flag {
        flag: "addr",
        field: "addr",
        kind: FlagKind::Text,
    },
    Flag {
        flag: "scratch",
        field: "scratch",
        kind: FlagKind::Text,
    },
    Flag {
        flag: "name",
        field: "name",
        kind: FlagKind::OptionalText,
    },
    Flag {
        flag: "bitmap",
        field: "bitmap",
        kind: FlagKind::OptionalText,
    },
    Flag {
        flag: "actions",
        field: "actions",
        kind: FlagKind::OptionalJson,
    },
];

const MIRROR_FLAGS: &[Flag] = &[
    DISK_FLAG,
    Flag {
        flag: "target",
        field: "target",
        kind: FlagKind::Text,
    },
    Flag {
        flag: "format",
        field: "format",
        kind: FlagKind::OptionalText,
    },
    Flag {
        flag: "existing",
        field: "existing",
        kind: FlagKind::Switch,
    },
    Flag {
        flag: "sync",
        field: "sync",
        kind: FlagKind::OptionalText,
    },
    Flag {
        flag: "mode",
        field: "mode",
        kind: FlagKind::OptionalText,
    },
    Flag {
        flag: "speed",
        field: "speed",
        kind: FlagKind::OptionalSize,
    },
    Flag {
        flag: "granularity",
        field: "granularity",
        kind: FlagKind::OptionalSize,
    },
];

const JOB: VerbArgs = VerbArgs::One {
    field: "job",
    what: "the job id",
};

const ID: VerbArgs = VerbArgs::One {
    field: "id",
    what: "the device id",
};

type E = Endpoint<Control>;

/// Every endpoint, in the order `ch-remote --help` lists them.
pub fn table() -> Vec<E> {
    use Method::{Get, Put};
    vec![
        E::new("vmm.ping", Get, |c| c.ping()).verb(
            "ping",
            VerbArgs::None,
            "",
            "the VMM's version and features",
        ),
        E::new("vmm.shutdown", Put, |c| c.vmm_shutdown()).verb(
            "shutdown-vmm",
            VerbArgs::None,
            "",
            "stop the VM and end the VMM",
        ),
        E::with_body("vm.create", "VmConfig", |c, b: VmConfig| c.vm_create(b)).verb(
            "create",
            VerbArgs::JsonFile,
            "[FILE]",
            "store a VM's configuration (a VmConfig JSON file; - or none: stdin)",
        ),
        E::new("vm.boot", Put, |c| c.vm_boot()).verb(
            "boot",
            VerbArgs::None,
            "",
            "boot the created VM",
        ),
        E::new("vm.delete", Put, |c| c.vm_delete()).verb(
            "delete",
            VerbArgs::None,
            "",
            "shut the VM down if it runs, and drop its configuration",
        ),
        E::new("vm.info", Get, |c| c.info()).verb(
            "info",
            VerbArgs::None,
            "",
            "the configuration, state and device tree",
        ),
        E::new("vm.counters", Get, |c| c.counters()).verb(
            "counters",
            VerbArgs::None,
            "",
            "I/O counters per disk",
        ),
        E::new("vm.pause", Put, |c| c.pause()).verb(
            "pause",
            VerbArgs::None,
            "",
            "stop the vCPUs and drain the disks",
        ),
        E::new("vm.resume", Put, |c| c.resume()).verb(
            "resume",
            VerbArgs::None,
            "",
            "resume a paused VM",
        ),
        E::new("vm.shutdown", Put, |c| c.vm_shutdown()).verb(
            "shutdown",
            VerbArgs::None,
            "",
            "stop the VM, keep the VMM",
        ),
        E::new("vm.reboot", Put, |c| c.vm_reboot()).verb(
            "reboot",
            VerbArgs::None,
            "",
            "restart the VM (disks stay open)",
        ),
        E::new("vm.power-button", Put, |c| c.power_button()).verb(
            "power-button",
            VerbArgs::None,
            "",
            "press the ACPI power button",
        ),
        E::with_body("vm.resize-disk", "ResizeDisk", |c, b: ResizeDiskBody| {
            c.resize_disk(&b.id, b.desired_size, b.shrink)
        })
        .verb(
            "resize-disk",
            VerbArgs::Flags(RESIZE_DISK_FLAGS),
            "--disk ID --size SIZE [--shrink]",
            "SIZE in bytes, K/M/G/T suffixes; a smaller size needs --shrink",
        ),
        E::with_body("vm.add-disk", "DiskConfig", |c, d: DiskConfig| {
            c.add_disk(d)
        })
        .verb(
            "add-disk",
            VerbArgs::Disk,
            "DISK",
            "hot-add a disk; DISK in --disk syntax (path=PATH,num_queues=N,id=NAME,...)",
        ),
        E::with_body_later("vm.remove-device", "Id", |c, b: IdBody, r| {
            c.remove_device(b.id, r)
        })
        .verb("remove-device", ID, "ID", "unplug a disk"),
        E::with_body(
            "vm.snapshot-disk",
            "SnapshotDisk",
            |c, b: SnapshotDiskBody| c.snapshot_disk(&b.id, &b.name),
        )
        .verb(
            "snapshot-disk",
            VerbArgs::Flags(SNAPSHOT_DISK_FLAGS),
            "--disk ID --name NAME",
            "internal qcow2 snapshot of a running disk",
        ),
        E::with_body("vm.disk-info", "Id", |c, b: IdBody| c.disk_info(&b.id)).verb(
            "disk-info",
            VerbArgs::One {
                field: "id",
                what: "the disk id",
            },
            "ID",
            "ch-img info of a running disk's image, with its dirty bitmaps",
        ),
        // Dirty bitmaps of running disks (docs/backup.md).
        E::with_body("vm.disk-bitmap-add", "BitmapAdd", |c, b: BitmapAddBody| {
            c.disk_bitmap("vm.disk-bitmap-add", TransactionAction::BitmapAdd(b))
        })
        .verb(
            "disk-bitmap-add",
            VerbArgs::Flags(BITMAP_ADD_FLAGS),
            "--disk ID --name NAME [--granularity SIZE] [--persistent] [--disabled]",
            "a dirty bitmap on a running disk (granularity 64K by default)",
        ),
        E::with_body("vm.disk-bitmap-remove", "Bitmap", |c, b: BitmapBody| {
            c.disk_bitmap("vm.disk-bitmap-remove", TransactionAction::BitmapRemove(b))
        })
        .verb(
            "disk-bitmap-remove",
            VerbArgs::Flags(BITMAP_FLAGS),
            "--disk ID --name NAME",
            "drop a dirty bitmap (from the image too at close)",
        ),
        E::with_body("vm.disk-bitmap-clear", "Bitmap", |c, b: BitmapBody| {
            c.disk_bitmap("vm.disk-bitmap-clear", TransactionAction::BitmapClear(b))
        })
        .verb(
            "disk-bitmap-clear",
            VerbArgs::Flags(BITMAP_FLAGS),
            "--disk ID --name NAME",
            "make every granule of a dirty bitmap clean",
        ),
        E::with_body("vm.disk-bitmap-enable", "Bitmap", |c, b: BitmapBody| {
            c.disk_bitmap("vm.disk-bitmap-enable", TransactionAction::BitmapEnable(b))
        })
        .verb(
            "disk-bitmap-enable",
            VerbArgs::Flags(BITMAP_FLAGS),
            "--disk ID --name NAME",
            "a dirty bitmap records writes again",
        ),
        E::with_body("vm.disk-bitmap-disable", "Bitmap", |c, b: BitmapBody| {
            c.disk_bitmap(
                "vm.disk-bitmap-disable",
                TransactionAction::BitmapDisable(b),
            )
        })
        .verb(
            "disk-bitmap-disable",
            VerbArgs::Flags(BITMAP_FLAGS),
            "--disk ID --name NAME",
            "a dirty bitmap stops recording writes",
        ),
        E::with_body(
            "vm.disk-bitmap-merge",
            "BitmapMerge",
            |c, b: BitmapMergeBody| {
                c.disk_bitmap("vm.disk-bitmap-merge", TransactionAction::BitmapMerge(b))
            },
        )
        .verb(
            "disk-bitmap-merge",
            VerbArgs::Flags(BITMAP_MERGE_FLAGS),
            "--disk ID --name NAME --sources NAME[,NAME...]",
            "mark in a dirty bitmap what other bitmaps of the disk have dirty",
        ),
        E::with_body(
            "vm.disk-transaction",
            "DiskTransaction",
            |c, b: TransactionBody| c.disk_transaction(b),
        )
        .verb(
            "disk-transaction",
            VerbArgs::JsonFile,
            "[FILE]",
            "bitmap actions on several disks at one instant, all or none (JSON; - or none: stdin)",
        ),
        // Point-in-time backups of running disks (docs/backup.md).
        E::with_body(
            "vm.disk-backup-begin",
            "BackupBegin",
            |c, b: BackupBeginBody| c.disk_backup_begin(b),
        )
        .verb(
            "disk-backup-begin",
            VerbArgs::Flags(BACKUP_BEGIN_FLAGS),
            "--disk ID --addr unix:PATH|tcp:HOST:PORT --scratch PATH [--name NAME] [--bitmap NAME] [--actions JSON]",
            "serve a running disk as it is now, read-only over NBD (prints the URI)",
        ),
        E::with_body("vm.disk-backup-end", "Id", |c, b: IdBody| {
            c.disk_backup_end(&b.id)
        })
        .verb(
            "disk-backup-end",
            VerbArgs::Flags(&[DISK_FLAG]),
            "--disk ID",
            "stop a backup's export and drop its scratch image",
        ),
        // External snapshots (docs/block-jobs.md).
        E::with_body(
            "vm.disk-snapshot-external",
            "SnapshotExternal",
            |c, b: SnapshotExternalBody| c.disk_snapshot_external(b),
        )
        .verb(
            "disk-snapshot-external",
            VerbArgs::Records {
                flag: "disk",
                field: "disks",
                keys: &["id", "overlay"],
            },
            "--disk id=ID,overlay=PATH [--disk ...] | FILE",
            "new qcow2 overlays on running disks, switched to at one instant",
        ),
        // Block jobs (docs/block-jobs.md).
        E::with_body("vm.disk-mirror", "DiskMirror", |c, b: DiskMirrorBody| {
            c.disk_mirror(b)
        })
        .verb(
            "disk-mirror",
            VerbArgs::Flags(MIRROR_FLAGS),
            "--disk ID --target PATH|URI [--format qcow2|raw] [--existing] [--sync full|top] \
             [--mode background|write-blocking] [--speed BYTES/S] [--granularity SIZE] [--wait]",
            "copy a running disk to a target while it runs (a job; --wait: until ready)",
        ),
        E::with_body("vm.disk-stream", "DiskStream", |c, b: DiskStreamBody| {
            c.disk_stream(b)
        })
        .verb(
            "disk-stream",
            VerbArgs::Flags(STREAM_FLAGS),
            "--disk ID [--base FILE] [--speed BYTES/S] [--wait]",
            "copy a running disk's backing chain (down to a base) into its image (a job)",
        ),
        E::with_body("vm.disk-commit", "DiskCommit", |c, b: DiskCommitBody| {
            c.disk_commit(b)
        })
        .verb(
            "disk-commit",
            VerbArgs::Flags(COMMIT_FLAGS),
            "--disk ID [--top FILE] [--base FILE] [--speed BYTES/S] [--granularity SIZE] [--wait]",
            "merge a layer of a running disk's chain into its base (a job; the active one: until ready)",
        ),
        E::new("vm.disk-jobs", Get, |c| c.disk_jobs()).verb(
            "disk-jobs",
            VerbArgs::None,
            "",
            "the block jobs: id, type, disk, state, bytes done and total, rate, error",
        ),
        E::with_body("vm.disk-job-complete", "Job", |c, b: JobBody| {
            c.disk_job_complete(b)
        })
        .verb(
            "disk-job-complete",
            JOB,
            "JOB [--wait]",
            "switch a ready mirror's disk to its target",
        ),
        E::with_body("vm.disk-job-cancel", "Job", |c, b: JobBody| {
            c.disk_job_cancel(b)
        })
        .verb(
            "disk-job-cancel",
            JOB,
            "JOB [--wait]",
            "stop a job (at ready the target stays a consistent copy)",
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::client::call_for;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|a| a.to_string()).collect()
    }

    /// The JSON body ch-remote sends for `verb args`.
    fn body(verb: &str, args: &[&str]) -> serde_json::Value {
        let c = call_for(&table(), verb, &strings(args)).unwrap();
        serde_json::from_str(c.body.as_deref().unwrap()).unwrap()
    }

    /// Why ch-remote refuses `verb args`.
    fn refusal(verb: &str, args: &[&str]) -> String {
        call_for(&table(), verb, &strings(args))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn bitmap_verbs_build_their_bodies() {
        assert_eq!(
            body("disk-bitmap-add", &["--disk", "d", "--name", "b"]),
            serde_json::json!({"id": "d", "name": "b"})
        );
        assert_eq!(
            body(
                "disk-bitmap-add",
                &[
                    "--disk",
                    "d",
                    "--name",
                    "b",
                    "--granularity",
                    "1M",
                    "--persistent",
                    "--disabled"
                ]
            ),
            serde_json::json!({"id": "d", "name": "b", "granularity": 1 << 20,
                "persistent": true, "disabled": true})
        );
        assert_eq!(
            body(
                "disk-bitmap-merge",
                &["--disk", "d", "--name", "b", "--sources", "x,y"]
            ),
            serde_json::json!({"id": "d", "name": "b", "sources": ["x", "y"]})
        );
        let e = refusal("disk-bitmap-clear", &["--disk", "d"]);
        assert!(e.contains("--name"), "{e}");
    }

    #[test]
    fn backup_verbs_build_their_bodies() {
        assert_eq!(
            body(
                "disk-backup-begin",
                &[
                    "--disk",
                    "d",
                    "--addr",
                    "unix:/b.sock",
                    "--scratch",
                    "s.qcow2"
                ]
            ),
            serde_json::json!({"id": "d", "addr": "unix:/b.sock", "scratch": "s.qcow2"})
        );
        let actions = r#"[{"type":"bitmap-clear","data":{"id":"d","name":"b"}}]"#;
        assert_eq!(
            body(
                "disk-backup-begin",
                &[
                    "--disk",
                    "d",
                    "--addr",
                    "tcp:0:0",
                    "--scratch",
                    "s",
                    "--name",
                    "vda",
                    "--bitmap",
                    "b",
                    "--actions",
                    actions
                ]
            ),
            serde_json::json!({"id": "d", "addr": "tcp:0:0", "scratch": "s", "name": "vda",
                "bitmap": "b", "actions": [{"type": "bitmap-clear",
                "data": {"id": "d", "name": "b"}}]})
        );
        let e = refusal(
            "disk-backup-begin",
            &[
                "--disk",
                "d",
                "--addr",
                "unix:x",
                "--scratch",
                "s",
                "--actions",
                "[x",
            ],
        );
        assert!(e.contains("--actions: not JSON"), "{e}");
        assert_eq!(
            body("disk-backup-end", &["--disk", "d"]),
            serde_json::json!({"id": "d"})
        );
    }

    #[test]
    fn job_verbs_build_their_bodies() {
        assert_eq!(
            body("disk-mirror", &["--disk", "d", "--target", "/t.qcow2"]),
            serde_json::json!({"id": "d", "target": "/t.qcow2"})
        );
        assert_eq!(
            body(
                "disk-mirror",
                &[
                    "--disk",
                    "d",
                    "--target",
                    "t.raw",
                    "--format",
                    "raw",
                    "--existing",
                    "--sync",
                    "top",
                    "--mode",
                    "background",
                    "--speed",
                    "10M",
                    "--granularity",
                    "1M"
                ]
            ),
            serde_json::json!({"id": "d", "target": "t.raw", "format": "raw",
                "existing": true, "sync": "top", "mode": "background",
                "speed": 10 << 20, "granularity": 1 << 20})
        );
        assert_eq!(
            body("disk-job-complete", &["job-1"]),
            serde_json::json!({"job": "job-1"})
        );
        assert_eq!(
            body("disk-job-cancel", &["job-2"]),
            serde_json::json!({"job": "job-2"})
        );
        assert_eq!(
            body("disk-stream", &["--disk", "d", "--base", "b.qcow2"]),
            serde_json::json!({"id": "d", "base": "b.qcow2"})
        );
        assert_eq!(
            body(
                "disk-commit",
                &["--disk", "d", "--top", "t.qcow2", "--base", "b.qcow2", "--speed", "1M"]
            ),
            serde_json::json!({"id": "d", "top": "t.qcow2", "base": "b.qcow2", "speed": 1 << 20})
        );
        let jobs = call_for(&table(), "disk-jobs", &[]).unwrap();
        assert_eq!((jobs.method, jobs.body), ("GET", None));
        let e = refusal("disk-mirror", &["--disk", "d"]);
        assert!(e.contains("--target"), "{e}");
    }

    #[test]
    fn names_and_verbs_are_unique() {
        let t = table();
        for (i, e) in t.iter().enumerate() {
            assert!(
                t[i + 1..].iter().all(|o| o.name != e.name),
                "{} twice",
                e.name
            );
            let verb = e.verb.as_ref().expect("every endpoint has a verb").name;
            assert!(
                t[i + 1..]
                    .iter()
                    .all(|o| o.verb.as_ref().map(|v| v.name) != Some(verb)),
                "{verb} twice"
            );
        }
    }
}
