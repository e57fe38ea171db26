//! Dirty bitmaps of running disks: `vm.disk-bitmap-add`, `-remove`,
//! `-clear`, `-enable`, `-disable`, `-merge` and `vm.disk-transaction`.
//!
//! Each request runs as a transaction of one or more actions
//! ([`TransactionAction`]) at one instant: the disks they name are paused
//! together ([`Control::with_disks_paused`]), the actions change each
//! disk's bitmaps in order (`block::live`), and the queues resume with
//! the new set of recording bitmaps. When an action is refused, the
//! bitmaps of every disk go back to what they were before the first
//! one, and the answer names the action. Bitmap errors become status
//! codes here: unknown bitmap 404, a name taken 409, an inconsistent
//! bitmap used 409, a bad name, granularity or persistence 400.

use std::sync::Arc;

use block::live::{LiveError, LiveState, DEFAULT_GRANULARITY};

use super::Control;
use crate::api::bitmap_types::{TransactionAction, TransactionBody};
use crate::api::ApiResponse;

/// The status of a refused bitmap action.
pub(super) fn status_of(e: &LiveError) -> u16 {
    match e {
        LiveError::NotFound(_) => 404,
        LiveError::Exists(_) | LiveError::Inconsistent(_) => 409,
        LiveError::BadGranularity(_) | LiveError::BadName | LiveError::NotPersistable { .. } => 400,
    }
}

/// Runs one action on a disk's bitmaps (its queues are paused).
pub(super) fn apply(live: &LiveState, action: &TransactionAction) -> Result<(), LiveError> {
    let mut bitmaps = live.bitmaps();
    match action {
        TransactionAction::BitmapAdd(b) => bitmaps.add(
            &b.name,
            b.granularity.unwrap_or(DEFAULT_GRANULARITY),
            b.persistent,
            b.disabled,
        ),
        TransactionAction::BitmapRemove(b) => bitmaps.remove(&b.name).map(drop),
        TransactionAction::BitmapClear(b) => bitmaps.clear(&b.name),
        TransactionAction::BitmapEnable(b) => bitmaps.enable(&b.name),
        TransactionAction::BitmapDisable(b) => bitmaps.disable(&b.name),
        TransactionAction::BitmapMerge(b) => bitmaps.merge(&b.name, &b.sources),
    }
}

impl Control {
    /// One `vm.disk-bitmap-*` request (`what` is its name).
    pub(crate) fn disk_bitmap(&self, what: &str, action: TransactionAction) -> ApiResponse {
        self.bitmap_actions(what, &[action])
    }

    pub(crate) fn disk_transaction(&self, body: TransactionBody) -> ApiResponse {
        self.bitmap_actions("vm.disk-transaction", &body.actions)
    }

    fn bitmap_actions(&self, what: &str, actions: &[TransactionAction]) -> ApiResponse {
        let mut ids: Vec<&str> = Vec::new();
        for a in actions {
            if !ids.contains(&a.disk_id()) {
                ids.push(a.disk_id());
            }
        }
        if ids.is_empty() {
            return ApiResponse::no_content();
        }
        let result = self.with_disks_paused(&ids, what, |devices| {
            let lives: Vec<Arc<LiveState>> =
                devices.iter().map(|d| d.disk().live().clone()).collect();
            // One action undoes nothing: a refused one changed nothing.
            let saved: Vec<_> = if actions.len() > 1 {
                lives.iter().map(|l| l.bitmaps().checkpoint()).collect()
            } else {
                Vec::new()
            };
            for (i, action) in actions.iter().enumerate() {
                let disk = ids
                    .iter()
                    .position(|id| *id == action.disk_id())
                    .expect("every action's disk is listed");
                if let Err(e) = apply(&lives[disk], action) {
                    for (live, checkpoint) in lives.iter().zip(saved) {
                        live.bitmaps().restore(checkpoint);
                    }
                    let context = if actions.len() > 1 {
                        format!(
                            "{what}: action {i} ({} on disk '{}') failed; no action was applied",
                            action.kind(),
                            action.disk_id()
                        )
                    } else {
                        format!("{what}: disk '{}'", action.disk_id())
                    };
                    return Err(ApiResponse::from_error_in(
                        status_of(&e),
                        Some(&context),
                        &e,
                    ));
                }
            }
            Ok(())
        });
        match result {
            Ok(()) => {
                for a in actions {
                    log::info!("disk {}: dirty bitmap {}", a.disk_id(), a.kind());
                }
                ApiResponse::no_content()
            }
            Err(answer) => answer,
        }
    }

    /// The bitmaps of a running disk, as `vm.disk-info` shows them.
    pub(super) fn bitmaps_json(live: &LiveState) -> serde_json::Value {
        let infos = live.bitmaps().infos();
        serde_json::Value::from(infos.iter().map(|b| b.to_json()).collect::<Vec<_>>())
    }
}
