//! The client side of the API, for `ch-remote`: the command line (Cloud
//! Hypervisor's verbs and their arguments, as upstream's `ch-remote`
//! takes them) turned into one HTTP request by the verb's row of the
//! endpoint table ([`super::endpoint::VerbArgs`]), sent over the Unix
//! socket, and the answer read back (httparse again).
//!
//! Enters as `ch-remote`'s arguments and the table; leaves as the
//! response's status and body, or an error that says what went wrong.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::{Map, Value};
use thiserror::Error;

use super::endpoint::{Endpoint, FlagKind, VerbArgs};
use crate::config::disk::parse_disk;
use ch_util::size::parse_size;

/// Longer than the server waits for the control loop.
const TIMEOUT: Duration = Duration::from_secs(130);
/// Largest answer read (counters and info of many disks fit easily).
const MAX_ANSWER: usize = 4 << 20;

/// `ch-remote --help`: every verb of `table`.
pub fn usage<C>(table: &[Endpoint<C>]) -> String {
    let mut out = String::from(
        "Usage: ch-remote --api-socket PATH COMMAND [ARGS]\n       \
         ch-remote --version | -V\n\n\
         Commands (Cloud Hypervisor's REST API, docs/api.md):\n",
    );
    let rows: Vec<(String, &Endpoint<C>, &str)> = table
        .iter()
        .filter_map(|e| {
            e.verb.as_ref().map(|v| {
                (
                    format!("{} {}", v.name, v.synopsis).trim_end().to_string(),
                    e,
                    v.help,
                )
            })
        })
        .collect();
    let width = rows.iter().map(|(s, _, _)| s.len()).max().unwrap_or(0);
    for (synopsis, e, help) in rows {
        out.push_str(&format!("  {synopsis:<width$}  {}: {help}\n", e.name));
    }
    out
}

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

fn usage_error(msg: impl Into<String>) -> ClientError {
    ClientError::Usage(msg.into())
}

/// `--name VALUE` (or `--name=VALUE`) among `args`, and how many
/// arguments it took (0 when absent).
fn flag<'a>(args: &'a [String], name: &str) -> Result<(Option<&'a str>, usize), ClientError> {
    let long = format!("--{name}");
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if *a == long {
            return it
                .next()
                .map(|v| (Some(v.as_str()), 2))
                .ok_or_else(|| usage_error(format!("{long} needs a value")));
        }
        if let Some(v) = a.strip_prefix(&format!("{long}=")) {
            return Ok((Some(v), 1));
        }
    }
    Ok((None, 0))
}

fn one<'a>(command: &str, args: &'a [String], what: &str) -> Result<&'a str, ClientError> {
    match args {
        [v] => Ok(v),
        _ => Err(usage_error(format!(
            "{command}: expected one argument: {what}"
        ))),
    }
}

/// The body `args` stand for, by the verb's argument kind.
fn body_for(command: &str, kind: VerbArgs, args: &[String]) -> Result<Option<String>, ClientError> {
    match kind {
        VerbArgs::None if args.is_empty() => Ok(None),
        VerbArgs::None => Err(usage_error(format!("{command} takes no arguments"))),
        VerbArgs::One { field, what } => {
            let v = one(command, args, what)?;
            let mut m = Map::new();
            m.insert(field.into(), Value::from(v));
            Ok(Some(Value::Object(m).to_string()))
        }
        VerbArgs::Flags(flags) => {
            let mut m = Map::new();
            let mut used = 0;
            for f in flags {
                let long = format!("--{}", f.flag);
                let value = if f.kind == FlagKind::Switch {
                    let n = args.iter().filter(|a| **a == long).count();
                    used += n;
                    (n > 0).then_some(Value::Bool(true))
                } else {
                    let (v, n) = flag(args, f.flag)?;
                    used += n;
                    match (v, f.kind) {
                        (None, FlagKind::OptionalSize | FlagKind::OptionalText) => None,
                        (None, _) => {
                            return Err(usage_error(format!("{command}: {long} is required")))
                        }
                        (Some(v), FlagKind::Size | FlagKind::OptionalSize) => Some(Value::from(
                            parse_size(v).map_err(|e| usage_error(format!("{long}: {e}")))?,
                        )),
                        (Some(v), FlagKind::List) => Some(Value::from(
                            v.split(',')
                                .filter(|s| !s.is_empty())
                                .map(Value::from)
                                .collect::<Vec<_>>(),
                        )),
                        (Some(v), _) => Some(Value::from(v)),
                    }
                };
                if let Some(v) = value {
                    m.insert(f.field.into(), v);
                }
            }
            if used != args.len() {
                return Err(usage_error(format!(
                    "{command}: unexpected arguments among {args:?}"
                )));
            }
            Ok(Some(Value::Object(m).to_string()))
        }
        VerbArgs::Disk => {
            let spec = one(command, args, "the disk, in --disk syntax")?;
            let config = parse_disk(spec).map_err(|e| usage_error(e.to_string()))?;
            config
                .resolve()
                .map_err(|e| usage_error(format!("--disk: {e}")))?;
            serde_json::to_string(&config)
                .map(Some)
                .map_err(|e| usage_error(e.to_string()))
        }
        VerbArgs::Records { flag, field, keys } => {
            if let [one] = args {
                if !one.starts_with("--") {
                    return body_for(command, VerbArgs::JsonFile, args);
                }
            }
            records_body(command, flag, field, keys, args).map(Some)
        }
        VerbArgs::JsonFile => {
            let path = match args {
                [] => "-",
                [p] => p.as_str(),
                _ => return Err(usage_error(format!("{command}: expected one file"))),
            };
            let mut text = String::new();
            let read = if path == "-" {
                std::io::stdin().read_to_string(&mut text)
            } else {
                std::fs::File::open(path).and_then(|mut f| f.read_to_string(&mut text))
            };
            read.map_err(|e| usage_error(format!("{command}: cannot read {path}: {e}")))?;
            Ok(Some(text))
        }
    }
}

/// `{"field": [{KEY: VALUE, ...}, ...]}` from `--flag KEY=VALUE,...`
/// repeated (see [`VerbArgs::Records`]).
fn records_body(
    command: &str,
    flag: &str,
    field: &str,
    keys: &[&str],
    args: &[String],
) -> Result<String, ClientError> {
    let long = format!("--{flag}");
    let mut list = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let spec = if *a == long {
            it.next()
                .ok_or_else(|| usage_error(format!("{command}: {long} needs a value")))?
                .as_str()
        } else if let Some(v) = a.strip_prefix(&format!("{long}=")) {
            v
        } else {
            return Err(usage_error(format!("{command}: unexpected argument '{a}'")));
        };
        let mut m = Map::new();
        for pair in spec.split(',') {
            let (k, v) = pair.split_once('=').ok_or_else(|| {
                usage_error(format!("{command}: {long}: '{pair}' is not KEY=VALUE"))
            })?;
            if !keys.contains(&k) {
                return Err(usage_error(format!(
                    "{command}: {long}: unknown key '{k}' (expected {})",
                    keys.join(", ")
                )));
            }
            if m.insert(k.into(), Value::from(v)).is_some() {
                return Err(usage_error(format!("{command}: {long}: '{k}' given twice")));
            }
        }
        if let Some(missing) = keys.iter().find(|k| !m.contains_key(**k)) {
            return Err(usage_error(format!(
                "{command}: {long}: '{missing}=' is required"
            )));
        }
        list.push(Value::Object(m));
    }
    if list.is_empty() {
        return Err(usage_error(format!("{command}: give {long} at least once")));
    }
    let mut body = Map::new();
    body.insert(field.into(), Value::Array(list));
    Ok(Value::Object(body).to_string())
}

/// The request `command` `args` stand for among `table`'s verbs.
pub fn call_for<C>(
    table: &[Endpoint<C>],
    command: &str,
    args: &[String],
) -> Result<Call, ClientError> {
    let (e, verb) = table
        .iter()
        .find_map(|e| {
            e.verb
                .as_ref()
                .filter(|v| v.name == command)
                .map(|v| (e, v))
        })
        .ok_or_else(|| usage_error(format!("unknown command '{command}' (see --help)")))?;
    Ok(Call {
        method: e.method.as_str(),
        endpoint: e.name,
        body: body_for(command, verb.args, args)?,
    })
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
    // Read until the head and `Content-Length` bytes of body are in: our
    // server closes after its answer, upstream's keeps the connection.
    let mut raw = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(answer) = complete_answer(&raw)? {
            return Ok(answer);
        }
        if raw.len() > MAX_ANSWER {
            return Err(ClientError::BadAnswer(format!(
                "the answer is over {MAX_ANSWER} bytes"
            )));
        }
        match s.read(&mut chunk) {
            Ok(0) => return parse_answer(&raw),
            Ok(n) => raw.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ClientError::Io(e)),
        }
    }
}

/// The answer in `raw`, once its head and body are complete.
fn complete_answer(raw: &[u8]) -> Result<Option<Answer>, ClientError> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let head = match resp.parse(raw) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(ClientError::BadAnswer(e.to_string())),
    };
    let status = resp
        .code
        .ok_or_else(|| ClientError::BadAnswer("no status".into()))?;
    let mut len = 0usize;
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let v = String::from_utf8_lossy(h.value);
            len = v
                .trim()
                .parse()
                .map_err(|_| ClientError::BadAnswer(format!("bad Content-Length '{v}'")))?;
        }
    }
    if raw.len() < head + len {
        return Ok(None);
    }
    Ok(Some(Answer {
        status,
        body: String::from_utf8_lossy(&raw[head..head + len]).into_owned(),
    }))
}

/// A whole answer (the connection ended after it).
fn parse_answer(raw: &[u8]) -> Result<Answer, ClientError> {
    complete_answer(raw)?.ok_or_else(|| ClientError::BadAnswer("the answer ends early".into()))
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
    use super::super::endpoint::{Flag, Method};
    use super::super::response::ApiResponse;
    use super::*;

    fn args(s: &[&str]) -> Vec<String> {
        s.iter().map(|a| a.to_string()).collect()
    }

    fn table() -> Vec<Endpoint<()>> {
        let ok = |_: &mut ()| ApiResponse::no_content();
        vec![
            Endpoint::new("vmm.ping", Method::Get, ok).verb("ping", VerbArgs::None, "", "ping"),
            Endpoint::new("vm.resize-disk", Method::Put, ok).verb(
                "resize-disk",
                VerbArgs::Flags(&[
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
                        flag: "force",
                        field: "force",
                        kind: FlagKind::Switch,
                    },
                ]),
                "--disk ID --size SIZE",
                "resize",
            ),
            Endpoint::new("vm.add-disk", Method::Put, ok).verb(
                "add-disk",
                VerbArgs::Disk,
                "DISK",
                "add",
            ),
            Endpoint::new("vm.remove-device", Method::Put, ok).verb(
                "remove-device",
                VerbArgs::One {
                    field: "id",
                    what: "the device id",
                },
                "ID",
                "remove",
            ),
        ]
    }

    fn body(c: &Call) -> serde_json::Value {
        serde_json::from_str(c.body.as_deref().unwrap()).unwrap()
    }

    #[test]
    fn commands_become_requests() {
        let t = table();
        let c = call_for(
            &t,
            "resize-disk",
            &args(&["--disk", "_disk0", "--size=32M"]),
        )
        .unwrap();
        assert_eq!((c.method, c.endpoint), ("PUT", "vm.resize-disk"));
        assert_eq!(
            body(&c),
            serde_json::json!({"id": "_disk0", "desired_size": 32 << 20})
        );
        let c = call_for(
            &t,
            "resize-disk",
            &args(&["--force", "--disk", "a", "--size", "1K"]),
        )
        .unwrap();
        assert_eq!(body(&c)["force"], true);
        let c = call_for(&t, "add-disk", &args(&["path=/a.qcow2,num_queues=2,id=d"])).unwrap();
        let v = body(&c);
        assert_eq!(
            (
                v["path"].as_str(),
                v["num_queues"].as_u64(),
                v["id"].as_str()
            ),
            (Some("/a.qcow2"), Some(2), Some("d"))
        );
        assert_eq!(v["image_type"], "Unknown", "upstream's field names: {v}");
        assert_eq!(call_for(&t, "ping", &[]).unwrap().endpoint, "vmm.ping");
        let c = call_for(&t, "remove-device", &args(&["d"])).unwrap();
        assert_eq!(body(&c), serde_json::json!({"id": "d"}));
        for (cmd, a, word) in [
            ("ping", &["x"][..], "no arguments"),
            ("resize-disk", &["--disk", "a"][..], "--size"),
            ("resize-disk", &["--disk", "a", "--size", "1X"][..], "size"),
            (
                "resize-disk",
                &["--disk", "a", "--size", "1", "x"][..],
                "unexpected",
            ),
            ("add-disk", &["num_queues=2"][..], "path"),
            ("add-disk", &["path=a,num_queues=0"][..], "num_queues"),
            ("remove-device", &[][..], "device id"),
            ("frobnicate", &[][..], "unknown command"),
        ] {
            let e = call_for(&t, cmd, &args(a)).unwrap_err().to_string();
            assert!(e.contains(word), "{cmd} {a:?}: {e}");
        }
        let u = usage(&t);
        assert!(
            u.contains("resize-disk --disk ID --size SIZE") && u.contains("vm.add-disk"),
            "{u}"
        );
    }

    #[test]
    fn repeated_records_become_one_list() {
        let ok = |_: &mut ()| ApiResponse::no_content();
        let t = vec![Endpoint::new("vm.group", Method::Put, ok).verb(
            "group",
            VerbArgs::Records {
                flag: "disk",
                field: "disks",
                keys: &["id", "overlay"],
            },
            "--disk id=ID,overlay=PATH ...",
            "group",
        )];
        let c = call_for(
            &t,
            "group",
            &args(&["--disk", "id=a,overlay=/x", "--disk=overlay=/y,id=b"]),
        )
        .unwrap();
        assert_eq!(
            body(&c),
            serde_json::json!({"disks": [{"id": "a", "overlay": "/x"},
                                         {"id": "b", "overlay": "/y"}]})
        );
        let file = std::env::temp_dir().join(format!("records-{}.json", std::process::id()));
        std::fs::write(&file, r#"{"disks":[]}"#).unwrap();
        let c = call_for(&t, "group", &args(&[file.to_str().unwrap()])).unwrap();
        assert_eq!(c.body.as_deref(), Some(r#"{"disks":[]}"#));
        std::fs::remove_file(&file).unwrap();
        for (a, word) in [
            (&[][..], "at least once"),
            (&["--disk", "id=a"][..], "'overlay=' is required"),
            (
                &["--disk", "id=a,overlay=/x,size=1"][..],
                "unknown key 'size'",
            ),
            (&["--disk", "id=a,id=b,overlay=/x"][..], "given twice"),
            (&["--disk", "id"][..], "not KEY=VALUE"),
            (&["--disk"][..], "needs a value"),
            (&["--disk", "id=a,overlay=/x", "x"][..], "unexpected"),
        ] {
            let e = call_for(&t, "group", &args(a)).unwrap_err().to_string();
            assert!(e.contains(word), "{a:?}: {e}");
        }
    }

    #[test]
    fn answers_and_error_bodies() {
        // Cloud Hypervisor's status line has no reason phrase.
        let a = parse_answer(b"HTTP/1.1 404 \r\nContent-Length: 9\r\n\r\n[\"a\",\"b\"]").unwrap();
        assert_eq!(a.status, 404);
        assert_eq!(error_text(&a.body), "a: b");
        let a = parse_answer(b"HTTP/1.1 204 No Content\r\n\r\n").unwrap();
        assert_eq!((a.status, a.body.as_str()), (204, ""));
        assert!(parse_answer(b"HTTP/1.1 20").is_err());
        assert!(parse_answer(b"garbage\r\n\r\n").is_err());
    }
}
