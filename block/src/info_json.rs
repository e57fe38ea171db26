//! `ch-img info --output=json` as data: an image's [`ImageInfo`] in
//! qemu-img 7.2's JSON keys (and, where the JSON library keeps insertion
//! order, its key order). `ch-img info` prints it; the VMM's
//! `vm.disk-info` answers with it for a running disk, backing chain
//! included ([`chain_json`]).

use std::path::Path;

use serde_json::{json, Map, Value};

use crate::error::BlockError;
use crate::formats::qcow2::bitmaps::bitmap_directory::BitmapEntry;
use crate::formats::qcow2::on_disk::snapshot_table::SnapshotInfo;
use crate::formats::registry::FORMATS;
use crate::formats::ImageInfo;
use crate::options::{DiskOptions, EngineKind, ImageType};

/// The bytes the file at `path` occupies on its file system (none for
/// an NBD export, as qemu-img shows it).
pub fn allocated_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    if block_engines::nbd::is_nbd_path(path) {
        return None;
    }
    std::fs::metadata(path).ok().map(|m| m.blocks() * 512)
}

/// `info --backing-chain --output=json` for an open image at `path`
/// whose facts are `top`: its entry, then one per backing file, each
/// opened read-only (a shared lock, as qemu-img takes) by its full name
/// and format.
pub fn chain_json(path: &Path, top: ImageInfo) -> Result<Vec<Value>, BlockError> {
    let mut out = Vec::new();
    let mut layer = Some((path.to_path_buf(), top));
    // Opening the top image bounded the chain's depth and refused cycles;
    // the cap only guards against a chain rewritten since.
    for _ in 0..64 {
        let Some((path, info)) = layer.take() else {
            break;
        };
        let shown = path.display().to_string();
        out.push(json_info(&shown, &info, allocated_bytes(&path)));
        if let Some(backing) = &info.full_backing_filename {
            let mut o = DiskOptions::new(backing);
            o.readonly = true;
            o.engine = EngineKind::Sync;
            o.image_type = (info.backing_filename_format.as_deref())
                .and_then(|name| FORMATS.image_type(name))
                .unwrap_or(ImageType::Auto);
            let image = crate::formats::registry::open_image_tools(&o)?;
            layer = Some((backing.into(), image.info()));
        }
    }
    Ok(out)
}

/// The JSON object, keys in qemu-img 7.2's order; `filename` is the path
/// as QEMU names it ([`block_engines::nbd::qemu_filename`]: an NBD URI in its
/// normal form), `dirty-flag` only for formats that have one (not an
/// NBD export).
pub fn json_info(path: &str, info: &ImageInfo, actual: Option<u64>) -> Value {
    let mut m = Map::new();
    if let Some(f) = &info.backing_filename_format {
        m.insert("backing-filename-format".into(), json!(f));
    }
    if !info.snapshots.is_empty() {
        let list = info.snapshots.iter().map(snapshot_json).collect();
        m.insert("snapshots".into(), Value::Array(list));
    }
    m.insert("virtual-size".into(), json!(info.virtual_size));
    m.insert(
        "filename".into(),
        json!(block_engines::nbd::qemu_filename(path)),
    );
    if let Some(c) = info.cluster_size {
        m.insert("cluster-size".into(), json!(c));
    }
    m.insert("format".into(), json!(info.format));
    if let Some(a) = actual {
        m.insert("actual-size".into(), json!(a));
    }
    if info.format == "qcow2" {
        let mut data = Map::new();
        if let Some(c) = &info.compat {
            data.insert("compat".into(), json!(c));
        }
        if info.compat.as_deref() != Some("0.10") {
            if let Some(c) = info.compression_type {
                data.insert("compression-type".into(), json!(c));
            }
            if let Some(l) = info.lazy_refcounts {
                data.insert("lazy-refcounts".into(), json!(l));
            }
            if !info.bitmaps.is_empty() {
                let list = info.bitmaps.iter().map(bitmap_json).collect();
                data.insert("bitmaps".into(), Value::Array(list));
            }
        } else if let Some(c) = info.compression_type {
            data.insert("compression-type".into(), json!(c));
        }
        if let Some(r) = info.refcount_bits {
            data.insert("refcount-bits".into(), json!(r));
        }
        if info.compat.as_deref() != Some("0.10") {
            if let Some(d) = &info.data_file {
                data.insert("data-file".into(), json!(d));
                data.insert("data-file-raw".into(), json!(data_file_raw(path)));
            }
            if let Some(c) = info.corrupt {
                data.insert("corrupt".into(), json!(c));
            }
            if let Some(e) = info.extended_l2 {
                data.insert("extended-l2".into(), json!(e));
            }
        }
        m.insert(
            "format-specific".into(),
            json!({ "type": "qcow2", "data": data }),
        );
    }
    if let Some(f) = &info.full_backing_filename {
        m.insert("full-backing-filename".into(), json!(f));
    }
    if let Some(f) = &info.backing_filename {
        m.insert("backing-filename".into(), json!(f));
    }
    if let Some(dirty) = info.dirty {
        m.insert("dirty-flag".into(), json!(dirty));
    }
    Value::Object(m)
}

/// The qcow2 autoclear bit "data file is raw" (bit 1 of the header's
/// autoclear_features at byte 88). Read here because
/// [`ImageInfo`] does not carry it (yet).
pub fn data_file_raw(path: &str) -> bool {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; 8];
    std::fs::File::open(path)
        .and_then(|f| f.read_exact_at(&mut b, 88))
        .map(|()| u64::from_be_bytes(b) & 2 != 0)
        .unwrap_or(false)
}

/// One persistent bitmap in `--output=json` (qemu-img's keys and order).
pub fn bitmap_json(b: &BitmapEntry) -> Value {
    json!({
        "flags": b.flag_names(),
        "name": b.name,
        "granularity": 1u64.checked_shl(u32::from(b.granularity_bits)).unwrap_or(0),
    })
}

/// One entry of `info --output=json`'s "snapshots", keys in qemu-img 7.2's
/// order.
pub fn snapshot_json(sn: &SnapshotInfo) -> Value {
    let mut m = Map::new();
    if let Some(c) = sn.icount {
        m.insert("icount".into(), json!(c));
    }
    m.insert(
        "vm-clock-nsec".into(),
        json!(sn.vm_clock_nsec % 1_000_000_000),
    );
    m.insert("name".into(), json!(sn.name));
    m.insert("date-sec".into(), json!(sn.date_sec));
    m.insert("date-nsec".into(), json!(sn.date_nsec));
    m.insert(
        "vm-clock-sec".into(),
        json!(sn.vm_clock_nsec / 1_000_000_000),
    );
    m.insert("id".into(), json!(sn.id));
    m.insert("vm-state-size".into(), json!(sn.vm_state_size));
    Value::Object(m)
}
