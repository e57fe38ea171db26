//! The NBD export: the image over the NBD protocol on a Unix or TCP
//! socket, qemu-storage-daemon's `--export type=nbd`. A thin front end:
//! [`NbdConfig::from_kv`] reads the `--export` keys, [`start`] serves the
//! daemon's image through the project's NBD server (the `nbd-server`
//! crate, which the VMM uses too) as a `nbd_server::DiskSource`, with the
//! image's persistent bitmap `bitmap=NAME` as the
//! `qemu:dirty-bitmap:NAME` context.

use std::sync::Arc;

use block::ExclusiveImage;
use ch_util::kv::{parse_on_off, KvError, KvList};
use nbd::wire::consts::MAX_STRING;
use nbd_server::{DiskSource, ExportConfig, ListenAddr, NbdServer, PersistentBitmap};

use super::running::{Export, ExportError};

/// `--export type=nbd,...`.
#[derive(Clone, Debug)]
pub struct NbdConfig {
    pub export: ExportConfig,
    /// A persistent bitmap of the image to offer as
    /// `qemu:dirty-bitmap:NAME`.
    pub bitmap: Option<String>,
}

impl NbdConfig {
    pub fn from_kv(kv: &mut KvList) -> Result<Self, KvError> {
        let option = kv.option();
        let addr = kv.take_required("addr")?;
        let bad = |key: &str, value: &str, reason: String| KvError::BadValue {
            option,
            key: key.into(),
            value: value.into(),
            reason,
        };
        let addr = ListenAddr::parse(&addr).map_err(|r| bad("addr", &addr, r))?;
        let name = kv.take("name")?.unwrap_or_default();
        if name.len() > MAX_STRING {
            return Err(bad("name", &name, "longer than 4096 bytes".into()));
        }
        let description = kv.take("description")?;
        if let Some(d) = &description {
            if d.len() > MAX_STRING {
                return Err(bad("description", d, "longer than 4096 bytes".into()));
            }
        }
        let bitmap = kv.take("bitmap")?;
        if bitmap.as_deref() == Some("") {
            return Err(bad("bitmap", "", "needs a bitmap name".into()));
        }
        Ok(NbdConfig {
            export: ExportConfig {
                addr,
                name,
                description,
                writable: kv.take_parsed("writable", parse_on_off)?.unwrap_or(false),
                max_connections: kv
                    .take_parsed("max_connections", |s| {
                        s.parse::<u32>()
                            .map_err(|_| "expected a number (0: no limit)".to_string())
                    })?
                    .unwrap_or(0),
            },
            bitmap,
        })
    }
}

/// A running NBD export.
struct NbdExport {
    server: NbdServer,
}

/// Serves `image` as `config` asks.
pub fn start(image: &ExclusiveImage, config: NbdConfig) -> Result<Box<dyn Export>, ExportError> {
    let mut source = DiskSource::new(image.disk());
    if let Some(name) = &config.bitmap {
        let bitmap = PersistentBitmap::load(image, name).map_err(|reason| ExportError::Nbd {
            addr: config.export.addr.to_string(),
            reason,
        })?;
        source = source.with_bitmap(name, Arc::new(bitmap));
    }
    let server =
        NbdServer::start(&config.export, Arc::new(source)).map_err(|e| ExportError::Nbd {
            addr: e.addr,
            reason: e.reason,
        })?;
    Ok(Box::new(NbdExport { server }))
}

impl Export for NbdExport {
    fn describe(&self) -> String {
        self.server.describe().to_string()
    }

    fn stop(self: Box<Self>) -> Result<(), ExportError> {
        self.server.stop();
        Ok(())
    }
}
