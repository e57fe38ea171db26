//! The client side of the API, for `ch-remote`: the command line (Cloud
//! Hypervisor's verbs and their arguments) turned into one HTTP request,
//! sent over the Unix socket, and the answer read back (httparse again).
//!
//! Enters as `ch-remote`'s arguments; leaves as the response's status
//! and body, or an error that says what went wrong.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::json;
use thiserror::Error;

use super::types::disk_config_json;
use crate::config::disk::parse_disk;
use crate::config::size::parse_size;

/// Longer than the server waits for the control loop.
const TIMEOUT: Duration = Duration::from_secs(130);
/// Largest answer read (counters and info of many disks fit easily).
const MAX_ANSWER: usize = 4 << 20;

pub const USAGE: &str = "\
Usage: ch-remote --api-socket PATH COMMAND [ARGS]
       ch-remote --version | -V

Commands (Cloud Hypervisor's REST API, docs/api.md):
  ping                               vmm.ping: the VMM's version
  shutdown-vmm                       vmm.shutdown: end the VMM
  info                               vm.info: the configuration and state
  counters                           vm.counters: I/O counters per disk
  pause | resume                     vm.pause / vm.resume
  shutdown                           vm.shutdown: stop the VM, keep the VMM
  reboot                             vm.reboot (not supported: says why)
  resize-disk --disk ID --size SIZE [--shrink]
                                     vm.resize-disk (SIZE in bytes, K/M/G/T);
                                       a smaller size needs --shrink
  add-disk DISK                      vm.add-disk; DISK in --disk syntax
                                       (path=PATH,num_queues=N,id=NAME,...)
  remove-device ID                   vm.remove-device
  snapshot-disk --disk ID --name N   vm.snapshot-disk: internal qcow2 snapshot
  disk-info ID                       vm.disk-info: ch-img info of the image
";

#[derive(Debug, Error)]
pub enum ClientError {
    #[error("{0}")]
    Usage(String),
    #[error("cannot connect to {path}")]
    Connect {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("talking to the VMM failed")]
    Io(#[source] std::io::Error),
    #[error("the VMM's answer is not HTTP: {0}")]
    BadAnswer(String),
}

/// One request to send.
#[derive(Debug, PartialEq, Eq)]
pub struct Call {
    pub method: &'static str,
    pub endpoint: &'static str,
    pub body: Option<String>,
}

/// The answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: String,
}

fn usage(msg: impl Into<String>) -> ClientError {
    ClientError::Usage(msg.into())
}

/// `--name VALUE` (or `--name=VALUE`) among `args`.
fn flag<'a>(args: &'a [String], name: &str) -> Result<&'a str, ClientError> {
    let long = format!("--{name}");
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if *a == long {
            return it
                .next()
                .map(String::as_str)
                .ok_or_else(|| usage(format!("{long} needs a value")));
        }
        if let Some(v) = a.strip_prefix(&format!("{long}=")) {
            return Ok(v);
        }
    }
    Err(usage(format!("{long} is required")))
}

fn one(args: &[String], what: &str) -> Result<String, ClientError> {
    match args {
        [v] => Ok(v.clone()),
        _ => Err(usage(format!("expected one argument: {what}"))),
    }
}

/// The request a command line stands for (without `--api-socket`).
pub fn call_for(command: &str, args: &[String]) -> Result<Call, ClientError> {
    let simple = |method, endpoint| {
        if args.is_empty() {
            Ok(Call {
                method,
                endpoint,
                body: None,
            })
        } else {
            Err(usage(format!("{command} takes no arguments")))
        }
    };
    match command {
        "ping" => simple("GET", "vmm.ping"),
        "shutdown-vmm" => simple("PUT", "vmm.shutdown"),
        "info" => simple("GET", "vm.info"),
        "counters" => simple("GET", "vm.counters"),
        "pause" => simple("PUT", "vm.pause"),
        "resume" => simple("PUT", "vm.resume"),
        "shutdown" => simple("PUT", "vm.shutdown"),
        "reboot" => simple("PUT", "vm.reboot"),
        "resize-disk" => {
            let id = flag(args, "disk")?;
            let size = parse_size(flag(args, "size")?).map_err(usage)?;
            let mut body = json!({"id": id, "desired_size": size});
            if args.iter().any(|a| a == "--shrink") {
                body["shrink"] = json!(true);
            }
            Ok(Call {
                method: "PUT",
                endpoint: "vm.resize-disk",
                body: Some(body.to_string()),
            })
        }
        "add-disk" => {
            let spec = one(args, "the disk, in --disk syntax")?;
            let config = parse_disk(&spec).map_err(|e| usage(e.to_string()))?;
            Ok(Call {
                method: "PUT",
                endpoint: "vm.add-disk",
                body: Some(disk_config_json(&config).to_string()),
            })
        }
        "remove-device" => Ok(Call {
            method: "PUT",
            endpoint: "vm.remove-device",
            body: Some(json!({"id": one(args, "the device id")?}).to_string()),
        }),
        "snapshot-disk" => Ok(Call {
            method: "PUT",
            endpoint: "vm.snapshot-disk",
            body: Some(json!({"id": flag(args, "disk")?, "name": flag(args, "name")?}).to_string()),
        }),
        "disk-info" => Ok(Call {
            method: "PUT",
            endpoint: "vm.disk-info",
            body: Some(json!({"id": one(args, "the disk id")?}).to_string()),
        }),
        other => Err(usage(format!("unknown command '{other}' (see --help)"))),
    }
}

/// Sends `call` to the API socket at `socket` and reads the answer.
pub fn send(socket: &Path, call: &Call) -> Result<Answer, ClientError> {
    let mut s = UnixStream::connect(socket).map_err(|source| ClientError::Connect {
        path: socket.display().to_string(),
        source,
    })?;
    s.set_read_timeout(Some(TIMEOUT)).map_err(ClientError::Io)?;
    s.set_write_timeout(Some(TIMEOUT))
        .map_err(ClientError::Io)?;
    let body = call.body.as_deref().unwrap_or("");
    let mut req = format!(
        "{} /api/v1/{} HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n",
        call.method, call.endpoint
    );
    if call.body.is_some() {
        req.push_str("Content-Type: application/json\r\n");
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes()).map_err(ClientError::Io)?;
    // The server closes after its answer: read to the end.
    let mut raw = Vec::new();
    s.take(MAX_ANSWER as u64)
        .read_to_end(&mut raw)
        .map_err(ClientError::Io)?;
    parse_answer(&raw)
}

fn parse_answer(raw: &[u8]) -> Result<Answer, ClientError> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let head = match resp.parse(raw) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            return Err(ClientError::BadAnswer("the answer ends early".into()))
        }
        Err(e) => return Err(ClientError::BadAnswer(e.to_string())),
    };
    let status = resp
        .code
        .ok_or_else(|| ClientError::BadAnswer("no status".into()))?;
    Ok(Answer {
        status,
        body: String::from_utf8_lossy(&raw[head..]).into_owned(),
    })
}

/// An error answer's body (a JSON list of messages) as one line.
pub fn error_text(body: &str) -> String {
    match serde_json::from_str::<Vec<String>>(body) {
        Ok(list) => list
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join(": "),
        Err(_) => body.trim().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &[&str]) -> Vec<String> {
        s.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn commands_become_requests() {
        let c = call_for("resize-disk", &args(&["--disk", "_disk0", "--size=32M"])).unwrap();
        assert_eq!((c.method, c.endpoint), ("PUT", "vm.resize-disk"));
        let v: serde_json::Value = serde_json::from_str(c.body.as_deref().unwrap()).unwrap();
        assert_eq!(v["desired_size"], 32 << 20);
        assert_eq!(v.get("shrink"), None);
        let c = call_for(
            "resize-disk",
            &args(&["--shrink", "--disk", "_disk0", "--size", "8M"]),
        )
        .unwrap();
        let v: serde_json::Value = serde_json::from_str(c.body.as_deref().unwrap()).unwrap();
        assert_eq!(
            (v["desired_size"].as_u64(), v["shrink"].as_bool()),
            (Some(8 << 20), Some(true))
        );
        let c = call_for("add-disk", &args(&["path=/a.qcow2,num_queues=2,id=d"])).unwrap();
        let v: serde_json::Value = serde_json::from_str(c.body.as_deref().unwrap()).unwrap();
        assert_eq!(
            (v["path"].as_str(), v["num_queues"].as_u64()),
            (Some("/a.qcow2"), Some(2))
        );
        assert_eq!(call_for("ping", &[]).unwrap().endpoint, "vmm.ping");
        for (cmd, a, word) in [
            ("ping", &["x"][..], "no arguments"),
            ("resize-disk", &["--disk", "a"][..], "--size"),
            ("resize-disk", &["--disk", "a", "--size", "1X"][..], "size"),
            ("add-disk", &["num_queues=2"][..], "path"),
            ("remove-device", &[][..], "device id"),
            ("frobnicate", &[][..], "unknown command"),
        ] {
            let e = call_for(cmd, &args(a)).unwrap_err().to_string();
            assert!(e.contains(word), "{cmd} {a:?}: {e}");
        }
    }

    #[test]
    fn answers_and_error_bodies() {
        let a = parse_answer(b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\n[\"a\",\"b\"]")
            .unwrap();
        assert_eq!(a.status, 404);
        assert_eq!(error_text(&a.body), "a: b");
        assert!(parse_answer(b"HTTP/1.1 20").is_err());
        assert!(parse_answer(b"garbage\r\n\r\n").is_err());
    }
}
