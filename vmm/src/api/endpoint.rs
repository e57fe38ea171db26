//! What one API endpoint is, as a row of the endpoint table: its name
//! under `/api/v1/`, its method, the JSON body it takes (a serde type)
//! and its handler, plus, for `ch-remote`, the verb that calls it and how
//! the verb's arguments become the body. The table itself
//! (`crate::endpoints`) lists the rows; the server routes by it
//! ([`super::routes`]) and the client builds requests and its usage from
//! it ([`super::client`]), so an endpoint is one row and one handler.
//!
//! A row is generic over `C`, what handlers act on (the VMM's control
//! loop), so this module knows nothing of it. Parsing happens on the API
//! thread: [`Endpoint::prepare`] checks the body and returns a [`Job`],
//! a closure that holds the parsed body and calls the handler when the
//! control loop runs it. Unknown fields of a body are ignored, as Cloud
//! Hypervisor ignores them, and logged by name (`serde_ignored`); a
//! field of the wrong type is named by its path (`serde_path_to_error`).

use std::sync::mpsc::SyncSender;

use serde::de::DeserializeOwned;

use super::response::ApiResponse;

/// The HTTP methods the API uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Put,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Put => "PUT",
        }
    }
}

/// Where a request's answer goes (the connection thread waits on it).
pub struct Responder(SyncSender<ApiResponse>);

impl Responder {
    pub fn new(reply: SyncSender<ApiResponse>) -> Self {
        Responder(reply)
    }

    /// Answers; a client that left is not an error.
    pub fn send(self, response: ApiResponse) {
        let _ = self.0.send(response);
    }
}

/// A checked request, ready to run on `C`: it answers through the
/// responder, at once or later.
pub type Job<C> = Box<dyn FnOnce(&mut C, Responder) + Send>;

type Prepare<C> = Box<dyn Fn(&str, &[u8]) -> Result<Job<C>, ApiResponse> + Send + Sync>;

/// How a `ch-remote` verb's arguments become the request body.
#[derive(Clone, Copy, Debug)]
pub enum VerbArgs {
    /// No arguments, no body.
    None,
    /// One positional argument, the body's `field`: `{"field": ARG}`.
    One {
        field: &'static str,
        what: &'static str,
    },
    /// `--flag VALUE` options, each a field of the body.
    Flags(&'static [Flag]),
    /// A disk in `--disk` syntax, sent as a `DiskConfig`.
    Disk,
    /// A JSON file (`-` or nothing: standard input), sent as it is.
    JsonFile,
    /// `--flag KEY=VALUE,KEY=VALUE`, repeated: each one an object with
    /// every one of `keys` (strings), sent as the list
    /// `{"field": [...]}`; or one argument, a JSON file (`-`: standard
    /// input), sent as it is.
    Records {
        flag: &'static str,
        field: &'static str,
        keys: &'static [&'static str],
    },
}

/// One `--flag` of a verb.
#[derive(Clone, Copy, Debug)]
pub struct Flag {
    /// `--flag`'s name, without dashes.
    pub flag: &'static str,
    /// The body field it sets.
    pub field: &'static str,
    pub kind: FlagKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlagKind {
    /// A string, required.
    Text,
    /// A size in bytes (K/M/G/T suffixes), required.
    Size,
    /// No value: `true` when given.
    Switch,
    /// A size in bytes (K/M/G/T suffixes), left out of the body when
    /// not given.
    OptionalSize,
    /// A comma-separated list, sent as an array of strings; required.
    List,
    /// A string, left out of the body when not given.
    OptionalText,
}

/// `ch-remote`'s verb for an endpoint.
#[derive(Clone, Copy, Debug)]
pub struct Verb {
    pub name: &'static str,
    pub args: VerbArgs,
    /// The arguments as the usage shows them.
    pub synopsis: &'static str,
    pub help: &'static str,
}

/// One row of the endpoint table.
pub struct Endpoint<C> {
    pub name: &'static str,
    pub method: Method,
    /// The body's type as docs show it (`None`: no body).
    pub body: Option<&'static str>,
    pub verb: Option<Verb>,
    prepare: Prepare<C>,
}

/// `body` as a `B`; fields `B` does not have are logged and ignored.
pub fn parse_body<B: DeserializeOwned>(name: &str, body: &[u8]) -> Result<B, ApiResponse> {
    if body.is_empty() {
        return Err(ApiResponse::error(
            400,
            &[&format!("{name} needs a JSON body")],
        ));
    }
    let mut ignored = Vec::new();
    let mut de = serde_json::Deserializer::from_slice(body);
    let mut note = |path: serde_ignored::Path<'_>| ignored.push(path.to_string());
    let collecting = serde_ignored::Deserializer::new(&mut de, &mut note);
    let bad = |e: String| ApiResponse::error(400, &["cannot parse the request body", &e]);
    // A wrong type or a missing field is named by its path in the body.
    let parsed = serde_path_to_error::deserialize(collecting).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        bad(if path == "." {
            inner
        } else {
            format!("{path}: {inner}")
        })
    })?;
    de.end().map_err(|e| bad(e.to_string()))?;
    if !ignored.is_empty() {
        log::warn!(
            "api: {name}: ignored unknown field(s) {}",
            ignored.join(", ")
        );
    }
    Ok(parsed)
}

fn refuse_body(name: &str, body: &[u8]) -> Result<(), ApiResponse> {
    if body.is_empty() {
        Ok(())
    } else {
        Err(ApiResponse::error(400, &[&format!("{name} takes no body")]))
    }
}

impl<C: 'static> Endpoint<C> {
    fn row(
        name: &'static str,
        method: Method,
        body: Option<&'static str>,
        prepare: Prepare<C>,
    ) -> Self {
        Endpoint {
            name,
            method,
            body,
            verb: None,
            prepare,
        }
    }

    /// No body; `handler` answers at once.
    pub fn new(name: &'static str, method: Method, handler: fn(&mut C) -> ApiResponse) -> Self {
        Self::row(
            name,
            method,
            None,
            Box::new(move |name, body| {
                refuse_body(name, body)?;
                Ok(Box::new(move |c: &mut C, r: Responder| r.send(handler(c))))
            }),
        )
    }

    /// A `B` body (a PUT), parsed on the API thread; `job` makes the
    /// work of one request from it.
    fn parsed<B: DeserializeOwned + Send + 'static>(
        name: &'static str,
        body_name: &'static str,
        job: impl Fn(B) -> Job<C> + Send + Sync + 'static,
    ) -> Self {
        Self::row(
            name,
            Method::Put,
            Some(body_name),
            Box::new(move |name, body| Ok(job(parse_body(name, body)?))),
        )
    }

    /// A `B` body (a PUT); `handler` answers at once.
    pub fn with_body<B: DeserializeOwned + Send + 'static>(
        name: &'static str,
        body_name: &'static str,
        handler: fn(&mut C, B) -> ApiResponse,
    ) -> Self {
        Self::parsed(name, body_name, move |b: B| -> Job<C> {
            Box::new(move |c: &mut C, r: Responder| r.send(handler(c, b)))
        })
    }

    /// A `B` body (a PUT); `handler` keeps the responder and answers when
    /// its work is done.
    pub fn with_body_later<B: DeserializeOwned + Send + 'static>(
        name: &'static str,
        body_name: &'static str,
        handler: fn(&mut C, B, Responder),
    ) -> Self {
        Self::parsed(name, body_name, move |b: B| -> Job<C> {
            Box::new(move |c: &mut C, r: Responder| handler(c, b, r))
        })
    }

    /// `ch-remote VERB SYNOPSIS`: calls this endpoint.
    pub fn verb(
        mut self,
        name: &'static str,
        args: VerbArgs,
        synopsis: &'static str,
        help: &'static str,
    ) -> Self {
        self.verb = Some(Verb {
            name,
            args,
            synopsis,
            help,
        });
        self
    }

    /// Checks `body` and returns the job that runs the handler.
    pub fn prepare(&self, body: &[u8]) -> Result<Job<C>, ApiResponse> {
        (self.prepare)(self.name, body)
    }
}
