//! The event monitor (`--event-monitor path=FILE|fd=N`), in Cloud
//! Hypervisor's format: each event is a pretty-printed JSON object,
//! then a blank line:
//!
//! ```text
//! {
//!   "timestamp": {
//!     "secs": 1,
//!     "nanos": 277091907
//!   },
//!   "source": "vm",
//!   "event": "booted",
//!   "properties": null
//! }
//! ```
//!
//! `timestamp` is the time since the monitor started; `properties` is
//! `null` or an object of strings. Any thread emits with one call,
//! [`emit`] (a no-op without `--event-monitor`); the event is formatted
//! there and queued, and one `event-monitor` thread (its own seccomp
//! kind: it only writes) writes the queue out in order, so a slow
//! reader of a pipe never blocks a vCPU or the control loop.
//! [`finish`] writes what is queued before the process exits.
//!
//! Which events exist is listed in docs/vmm.md ("Event monitor"):
//! upstream's names for what this VMM does, plus `disk` events of its
//! own for live disk work.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

struct Monitor {
    start: Instant,
    /// `None` once [`finish`] ran.
    queue: Mutex<Option<Sender<String>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

static MONITOR: OnceLock<Monitor> = OnceLock::new();

#[derive(Serialize)]
struct Timestamp {
    secs: u64,
    nanos: u32,
}

#[derive(Serialize)]
struct Event<'a> {
    timestamp: Timestamp,
    source: &'a str,
    event: &'a str,
    properties: Option<BTreeMap<&'a str, &'a str>>,
}

/// One event as the monitor writes it (without the blank line after).
fn format(elapsed: Duration, source: &str, event: &str, properties: &[(&str, &str)]) -> String {
    let e = Event {
        timestamp: Timestamp {
            secs: elapsed.as_secs(),
            nanos: elapsed.subsec_nanos(),
        },
        source,
        event,
        properties: (!properties.is_empty()).then(|| properties.iter().copied().collect()),
    };
    // Strings and integers only: serializing cannot fail.
    serde_json::to_string_pretty(&e).unwrap_or_default()
}

/// Reports `event` from `source` with `properties` (each a string).
pub fn emit(source: &str, event: &str, properties: &[(&str, &str)]) {
    let Some(m) = MONITOR.get() else { return };
    let text = format(m.start.elapsed(), source, event, properties);
    if let Some(q) = m
        .queue
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
    {
        let _ = q.send(text);
    }
}

/// Starts the monitor: events go to `out` from a thread that first runs
/// `confine` (the caller installs its seccomp filter there). Call once,
/// before anything emits.
pub fn start(
    mut out: File,
    confine: impl FnOnce() -> Result<(), String> + Send + 'static,
) -> std::io::Result<()> {
    let (tx, rx) = channel::<String>();
    let writer = std::thread::Builder::new()
        .name("event-monitor".into())
        .spawn(move || {
            if let Err(e) = confine() {
                log::error!("event monitor: {e}; no events are written");
                return;
            }
            let mut failed = false;
            for text in rx {
                let written = out
                    .write_all(text.as_bytes())
                    .and_then(|()| out.write_all(b"\n\n"));
                if let Err(e) = written {
                    if !failed {
                        log::warn!("event monitor: writing an event failed: {e}");
                    }
                    failed = true;
                }
            }
        })?;
    let monitor = Monitor {
        start: Instant::now(),
        queue: Mutex::new(Some(tx)),
        writer: Mutex::new(Some(writer)),
    };
    if MONITOR.set(monitor).is_err() {
        log::warn!("event monitor started twice; the second is ignored");
    }
    Ok(())
}

/// Writes out what is queued (waiting up to `limit` for a slow reader)
/// and stops the monitor; later events are dropped.
pub fn finish(limit: Duration) {
    let Some(m) = MONITOR.get() else { return };
    drop(
        m.queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take(),
    );
    let Some(writer) = m
        .writer
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
    else {
        return;
    };
    let end = Instant::now() + limit;
    while !writer.is_finished() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(5));
    }
    if writer.is_finished() {
        let _ = writer.join();
    } else {
        log::warn!("event monitor: the reader did not take the last events within {limit:?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstreams_format() {
        let text = format(Duration::new(1, 277_091_907), "vm", "booted", &[]);
        assert_eq!(
            text,
            "{\n  \"timestamp\": {\n    \"secs\": 1,\n    \"nanos\": 277091907\n  },\n  \
             \"source\": \"vm\",\n  \"event\": \"booted\",\n  \"properties\": null\n}"
        );
        let text = format(
            Duration::from_millis(5),
            "vm",
            "device-removed",
            &[("id", "data"), ("bdf", "0000:00:02.0")],
        );
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            v["properties"],
            serde_json::json!({"id": "data", "bdf": "0000:00:02.0"})
        );
        assert_eq!(v["timestamp"]["nanos"], 5_000_000);
    }
}
