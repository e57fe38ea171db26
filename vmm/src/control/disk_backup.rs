//! Point-in-time backups of running disks: `vm.disk-backup-begin` and
//! `vm.disk-backup-end` (docs/backup.md, docs/live-operations.md).
//!
//! Begin: the `nbd-export` thread ([`crate::nbd_exports`]) binds the
//! export's address (one that cannot be used refuses the backup before
//! anything changed); the scratch qcow2 image is created (empty, the
//! disk's size, no backing file) and opened; at one instant (the queues
//! of the disk and of every disk the request's bitmap actions name
//! paused, [`Control::with_disks_paused`]) the named dirty bitmap is
//! frozen, the actions are applied (all or none) and the
//! copy-before-write filter is installed (`block::live`); then the
//! export thread serves the view, read-only, with the project's NBD
//! server, and the answer names its URI. From then on the guest's first
//! write to each granule copies its old data to the scratch image on the
//! queue's thread.
//!
//! End: the server stops (on the export thread), the filter is removed
//! at an instant, the scratch image is closed and deleted; the answer
//! says whether the view stayed whole (a copy that failed, say a full
//! scratch file, broke it: the guest's writes went on, the view's reads
//! failed).
//!
//! While a backup runs its disk refuses a second backup, a resize,
//! removal and an external snapshot (409): each would change what the
//! view stands on. A VM that stops ends its backups first.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use block::create::{create_image, CreateOptions};
use block::live::{CopyBeforeWrite, LiveState, PointInTimeView};
use block::{Disk, DiskOptions, EngineKind, ImageType};
use nbd_server::{ExportConfig, ListenAddr, NbdServer, ViewSource};

use super::backup_record::Backup;
use super::{disk_bitmaps, status, Control};
use crate::api::backup_types::{BackupBeginAnswer, BackupBeginBody, BackupEndAnswer};
use crate::api::ApiResponse;
use crate::events::emit;

const BEGIN: &str = "vm.disk-backup-begin";
const END: &str = "vm.disk-backup-end";

impl Control {
    /// Whether disk `id` has a backup running (the answer to give).
    pub(super) fn refuse_if_backing_up(&self, id: &str, what: &str) -> Result<(), ApiResponse> {
        if self.backups.iter().any(|b| b.id == id) {
            return Err(ApiResponse::error(
                409,
                &[&format!(
                    "{what}: disk '{id}' has a backup running (end it with vm.disk-backup-end)"
                )],
            ));
        }
        Ok(())
    }

    pub(crate) fn disk_backup_begin(&mut self, body: BackupBeginBody) -> ApiResponse {
        match self.begin_backup(&body) {
            Ok(uri) => {
                log::info!("disk {}: backup begun, served at {uri}", body.id);
                emit("disk", "backup-begun", &[("id", &body.id), ("uri", &uri)]);
                ApiResponse::json(&BackupBeginAnswer { uri })
            }
            Err(r) => r,
        }
    }

    fn begin_backup(&mut self, body: &BackupBeginBody) -> Result<String, ApiResponse> {
        let id = body.id.as_str();
        self.local_disk(id, BEGIN)?;
        self.refuse_if_backing_up(id, BEGIN)?;
        // A mirror's complete would switch the disk away from the image
        // the view reads.
        if let Some(why) = self.jobs.busy(id) {
            return Err(ApiResponse::error(409, &[BEGIN, &why]));
        }
        let addr = ListenAddr::parse(&body.addr).map_err(|e| {
            ApiResponse::error(400, &[BEGIN, &format!("addr '{}': {e}", body.addr)])
        })?;
        let scratch_path = PathBuf::from(&body.scratch);
        if scratch_path.as_os_str().is_empty() {
            return Err(ApiResponse::error(400, &[BEGIN, "scratch: give a path"]));
        }
        if std::fs::symlink_metadata(&scratch_path).is_ok() {
            return Err(ApiResponse::error(
                409,
                &[
                    BEGIN,
                    &format!(
                        "scratch {} exists; give a path for a new file",
                        scratch_path.display()
                    ),
                ],
            ));
        }
        let size = {
            let d = self.local_disk(id, BEGIN)?;
            let dev = d.lock_device().expect("local_disk checked");
            dev.disk().size()
        };
        // The address first: one that cannot be used refuses the backup
        // before anything changed (clients that connect early wait in the
        // backlog until the export is served, after the instant).
        let config = ExportConfig {
            addr,
            name: body.name.clone().unwrap_or_else(|| id.to_string()),
            description: Some(format!("disk '{id}' at the backup's instant")),
            writable: false,
            max_connections: 0,
        };
        let bound = match crate::nbd_exports::run(move || NbdServer::bind(&config)) {
            Some(Ok(b)) => b,
            Some(Err(e)) => return Err(ApiResponse::error(400, &[BEGIN, &e.to_string()])),
            None => {
                return Err(ApiResponse::error(
                    500,
                    &[BEGIN, "the nbd-export thread is not running"],
                ))
            }
        };
        let scratch = create_scratch(&scratch_path, size).inspect_err(|_| {
            let _ = std::fs::remove_file(&scratch_path);
        })?;
        let undo_scratch = |scratch: Disk| {
            drop(scratch);
            if let Err(e) = std::fs::remove_file(&scratch_path) {
                log::warn!("cannot remove scratch {}: {e}", scratch_path.display());
            }
        };
        // The instant: the bitmap frozen, the actions applied and the
        // filter installed while no guest request of any disk they name
        // is in flight.
        let mut ids: Vec<&str> = vec![id];
        for a in &body.actions {
            if !ids.contains(&a.disk_id()) {
                ids.push(a.disk_id());
            }
        }
        let installed = self.with_disks_paused(&ids, BEGIN, |devices| {
            let disk = devices[0].disk().clone();
            let frozen = freeze(&disk, id, body.bitmap.as_deref())?;
            let lives: Vec<Arc<LiveState>> =
                devices.iter().map(|d| d.disk().live().clone()).collect();
            let saved: Vec<_> = lives.iter().map(|l| l.bitmaps().checkpoint()).collect();
            let undo = |saved: Vec<_>| {
                for (live, checkpoint) in lives.iter().zip(saved) {
                    live.bitmaps().restore(checkpoint);
                }
            };
            for (i, action) in body.actions.iter().enumerate() {
                let k = ids
                    .iter()
                    .position(|d| *d == action.disk_id())
                    .expect("every action's disk is listed");
                if let Err(e) = disk_bitmaps::apply(&lives[k], action) {
                    undo(saved);
                    let context = format!(
                        "{BEGIN}: action {i} ({} on disk '{}') failed; no backup began",
                        action.kind(),
                        action.disk_id()
                    );
                    return Err(ApiResponse::from_error_in(
                        disk_bitmaps::status_of(&e),
                        Some(&context),
                        &e,
                    ));
                }
            }
            let cbw = match CopyBeforeWrite::new(&disk, &scratch) {
                Ok(c) => Arc::new(c),
                Err(e) => {
                    undo(saved);
                    return Err(ApiResponse::from_error_in(
                        status::of_block(&e),
                        Some(BEGIN),
                        &e,
                    ));
                }
            };
            disk.live().set_cbw(Some(cbw.clone()));
            Ok((cbw, frozen))
        });
        let (cbw, frozen) = match installed {
            Ok(v) => v,
            Err(r) => {
                undo_scratch(scratch);
                return Err(r);
            }
        };
        let source = Arc::new(ViewSource::new(Arc::new(PointInTimeView::new(
            cbw.clone(),
            frozen,
        ))));
        let server = match crate::nbd_exports::run(move || bound.serve(source)) {
            Some(Ok(s)) => s,
            failed => {
                // Only a thread that cannot start fails here; the
                // actions stay applied.
                self.remove_filter(id);
                undo_scratch(scratch);
                let why = match failed {
                    Some(Err(e)) => e.to_string(),
                    _ => "the nbd-export thread is not running".to_string(),
                };
                log::error!(
                    "disk {id}: the backup's export did not start ({why}); its bitmap actions stay applied"
                );
                return Err(ApiResponse::error(500, &[BEGIN, &why]));
            }
        };
        let uri = server.uri();
        log::info!("disk {id}: {}", server.describe());
        self.backups.push(Backup {
            id: id.to_string(),
            server: Some(server),
            cbw,
            scratch,
            scratch_path,
            uri: uri.clone(),
        });
        Ok(uri)
    }

    /// Removes disk `id`'s copy-before-write filter at an instant.
    fn remove_filter(&self, id: &str) {
        let removed = self.with_disks_paused(&[id], END, |devices| {
            devices[0].disk().live().set_cbw(None);
            Ok(())
        });
        if removed.is_err() {
            // The queues could not be paused: remove it anyway (requests
            // in flight finish under the filter, which stays valid).
            if let Some(d) = self.disks().and_then(|d| d.find(id)) {
                if let Some(dev) = d.lock_device() {
                    dev.disk().live().set_cbw(None);
                }
            }
        }
    }

    pub(crate) fn disk_backup_end(&mut self, id: &str) -> ApiResponse {
        if let Err(r) = self.machine(END) {
            return r;
        }
        let Some(i) = self.backups.iter().position(|b| b.id == id) else {
            return ApiResponse::error(
                404,
                &[&format!("{END}: disk '{id}' has no backup running")],
            );
        };
        let answer = self.end_backup(i);
        ApiResponse::json(&answer)
    }

    /// Ends backup `i`: the export stopped, the filter removed, the
    /// scratch image deleted.
    fn end_backup(&mut self, i: usize) -> BackupEndAnswer {
        let mut b = self.backups.remove(i);
        if let Some(server) = b.server.take() {
            if crate::nbd_exports::run(move || server.stop()).is_none() {
                log::error!("disk {}: the nbd-export thread is gone", b.id);
            }
        }
        self.remove_filter(&b.id);
        let error = b.cbw.broken().map(str::to_string);
        let copied_bytes = b.cbw.copied_bytes();
        let Backup {
            id,
            cbw,
            scratch,
            scratch_path,
            ..
        } = b;
        drop(cbw);
        drop(scratch);
        remove_scratch(&scratch_path);
        let status = if error.is_some() {
            "failed"
        } else {
            "completed"
        };
        match &error {
            Some(e) => log::error!("disk {id}: backup ended failed: {e}"),
            None => log::info!("disk {id}: backup ended ({copied_bytes} bytes copied)"),
        }
        emit("disk", "backup-ended", &[("id", &id), ("status", status)]);
        BackupEndAnswer {
            status: status.to_string(),
            error,
            copied_bytes,
        }
    }

    /// What `vm.disk-info` shows of disk `id`'s backup, if one runs:
    /// `uri`, `scratch`, `copied_bytes`, `broken` (and `error` when it is).
    pub(super) fn backup_json(&self, id: &str) -> Option<serde_json::Value> {
        let b = self.backups.iter().find(|b| b.id == id)?;
        let mut v = serde_json::json!({
            "uri": b.uri,
            "scratch": b.scratch_path.display().to_string(),
            "copied_bytes": b.cbw.copied_bytes(),
            "broken": b.cbw.broken().is_some(),
        });
        if let Some(e) = b.cbw.broken() {
            v["error"] = serde_json::Value::from(e);
        }
        Some(v)
    }

    /// Ends every backup (the VM is stopping).
    pub(super) fn end_backups(&mut self) {
        while !self.backups.is_empty() {
            self.end_backup(0);
        }
    }
}

/// The frozen copy of `disk`'s bitmap `name` (its queues paused).
fn freeze(
    disk: &Disk,
    id: &str,
    name: Option<&str>,
) -> Result<Option<(String, Arc<block::live::DirtyBitmap>)>, ApiResponse> {
    let Some(name) = name else {
        return Ok(None);
    };
    let bitmaps = disk.live().bitmaps();
    let b = bitmaps.find(name).ok_or_else(|| {
        ApiResponse::error(
            404,
            &[&format!(
                "{BEGIN}: disk '{id}' has no dirty bitmap named '{name}'"
            )],
        )
    })?;
    if b.inconsistent {
        return Err(ApiResponse::error(
            409,
            &[&format!(
                "{BEGIN}: dirty bitmap '{name}' of disk '{id}' is inconsistent (its image was not closed cleanly while it recorded); it cannot be used"
            )],
        ));
    }
    Ok(Some((name.to_string(), Arc::new(b.bitmap.frozen()))))
}

/// Creates and opens the empty scratch image.
fn create_scratch(path: &Path, size: u64) -> Result<Disk, ApiResponse> {
    let fail = |e: block::BlockError| {
        ApiResponse::from_error_in(
            status::of_block(&e),
            Some(&format!("{BEGIN}: scratch {}", path.display())),
            &e,
        )
    };
    create_image(&CreateOptions {
        path: path.to_path_buf(),
        format: ImageType::Format("qcow2"),
        size,
        ..Default::default()
    })
    .map_err(fail)?;
    let mut options = DiskOptions::new(path);
    options.engine = EngineKind::Sync;
    Disk::open(&options).map_err(fail)
}

fn remove_scratch(path: &Path) {
    if let Err(e) = std::fs::remove_file(path) {
        log::warn!("cannot remove scratch {}: {e}", path.display());
    }
}
