//! The JSON bodies of the dirty-bitmap requests (`vm.disk-bitmap-*`,
//! `vm.disk-transaction`), with the field names scripts rely on
//! (docs/api.md). Parsed by serde on the API thread; the control loop
//! runs them (`crate::control::disk_bitmaps`).

use serde::{Deserialize, Serialize};

/// `vm.disk-bitmap-add`: a new bitmap of disk `id`. `granularity`
/// defaults to 64 KiB; `persistent` (qcow2 only) stores it in the image
/// at close; `disabled` adds it not recording.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct BitmapAddBody {
    pub id: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub granularity: Option<u64>,
    #[serde(default)]
    pub persistent: bool,
    #[serde(default)]
    pub disabled: bool,
}

/// `vm.disk-bitmap-remove`, `-clear`, `-enable`, `-disable`.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct BitmapBody {
    pub id: String,
    pub name: String,
}

/// `vm.disk-bitmap-merge`: every granule dirty in one of `sources` (of
/// the same disk) becomes dirty in `name`.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct BitmapMergeBody {
    pub id: String,
    pub name: String,
    pub sources: Vec<String>,
}

/// One action of `vm.disk-transaction`: `{"type": ..., "data": {...}}`,
/// the data being the body of the request of the same name.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(tag = "type", content = "data", rename_all = "kebab-case")]
pub enum TransactionAction {
    BitmapAdd(BitmapAddBody),
    BitmapRemove(BitmapBody),
    BitmapClear(BitmapBody),
    BitmapEnable(BitmapBody),
    BitmapDisable(BitmapBody),
    BitmapMerge(BitmapMergeBody),
}

impl TransactionAction {
    /// The disk the action is on.
    pub fn disk_id(&self) -> &str {
        match self {
            TransactionAction::BitmapAdd(b) => &b.id,
            TransactionAction::BitmapRemove(b)
            | TransactionAction::BitmapClear(b)
            | TransactionAction::BitmapEnable(b)
            | TransactionAction::BitmapDisable(b) => &b.id,
            TransactionAction::BitmapMerge(b) => &b.id,
        }
    }

    /// The action's `type`.
    pub fn kind(&self) -> &'static str {
        match self {
            TransactionAction::BitmapAdd(_) => "bitmap-add",
            TransactionAction::BitmapRemove(_) => "bitmap-remove",
            TransactionAction::BitmapClear(_) => "bitmap-clear",
            TransactionAction::BitmapEnable(_) => "bitmap-enable",
            TransactionAction::BitmapDisable(_) => "bitmap-disable",
            TransactionAction::BitmapMerge(_) => "bitmap-merge",
        }
    }
}

/// `vm.disk-transaction`: the actions, applied in order at one instant
/// on every disk they name, all or none.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct TransactionBody {
    pub actions: Vec<TransactionAction>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_parse_by_type_and_data() {
        let t: TransactionBody = serde_json::from_str(
            r#"{"actions":[
                {"type":"bitmap-add","data":{"id":"a","name":"b1"}},
                {"type":"bitmap-merge","data":{"id":"a","name":"b1","sources":["b0"]}},
                {"type":"bitmap-clear","data":{"id":"c","name":"b0"}}]}"#,
        )
        .unwrap();
        assert_eq!(t.actions.len(), 3);
        match &t.actions[0] {
            TransactionAction::BitmapAdd(b) => {
                assert_eq!(
                    (b.granularity, b.persistent, b.disabled),
                    (None, false, false)
                )
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(t.actions[1].kind(), "bitmap-merge");
        assert_eq!(t.actions[2].disk_id(), "c");
        let bad = serde_json::from_str::<TransactionBody>(
            r#"{"actions":[{"type":"bitmap-frob","data":{"id":"a","name":"b"}}]}"#,
        );
        assert!(bad.is_err());
    }
}
