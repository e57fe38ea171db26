//! Which row of the endpoint table a method and path stand for, and its
//! body checked ([`super::endpoint`]): the request becomes a job for the
//! control loop.
//!
//! An unknown path is 404, a known path with the wrong method 405, a
//! body that is not the JSON the endpoint takes 400; none of these reach
//! the control loop.

use super::endpoint::{Endpoint, Job};
use super::response::ApiResponse;

pub const API_ROOT: &str = "/api/v1/";

/// A request ready for the control loop.
pub struct Routed<C> {
    pub name: &'static str,
    pub job: Job<C>,
}

/// The job `method` `path` with `body` stands for in `table`.
pub fn route<C: 'static>(
    table: &[Endpoint<C>],
    method: &str,
    path: &str,
    body: &[u8],
) -> Result<Routed<C>, ApiResponse> {
    let Some(name) = path.strip_prefix(API_ROOT) else {
        return Err(ApiResponse::error(
            404,
            &[&format!(
                "no such path '{path}' (endpoints are under {API_ROOT})"
            )],
        ));
    };
    let Some(e) = table.iter().find(|e| e.name == name) else {
        return Err(ApiResponse::error(404, &[&format!("no endpoint '{name}'")]));
    };
    let want = e.method.as_str();
    if method != want {
        return Err(ApiResponse::error(
            405,
            &[&format!("{name} takes {want}, not {method}")],
        ));
    }
    Ok(Routed {
        name: e.name,
        job: e.prepare(body)?,
    })
}

#[cfg(test)]
mod tests {
    use super::super::endpoint::Method;
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize)]
    struct Sized {
        id: String,
        size: u64,
    }

    /// A table over a `Vec<String>` that records what ran.
    fn table() -> Vec<Endpoint<Vec<String>>> {
        vec![
            Endpoint::new("vm.info", Method::Get, |c| {
                c.push("info".into());
                ApiResponse::no_content()
            }),
            Endpoint::with_body("vm.resize", "Sized", |c, b: Sized| {
                c.push(format!("{} {}", b.id, b.size));
                ApiResponse::no_content()
            }),
        ]
    }

    fn run(method: &str, path: &str, body: &str) -> Result<Vec<String>, u16> {
        let t = table();
        let routed = route(&t, method, path, body.as_bytes()).map_err(|r| r.status)?;
        let mut ran = Vec::new();
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        (routed.job)(&mut ran, super::super::endpoint::Responder::new(tx));
        assert_eq!(rx.recv().unwrap().status, 204);
        Ok(ran)
    }

    #[test]
    fn paths_methods_and_bodies() {
        assert_eq!(run("GET", "/api/v1/vm.info", ""), Ok(vec!["info".into()]));
        assert_eq!(
            run("PUT", "/api/v1/vm.resize", r#"{"id":"a","size":7}"#),
            Ok(vec!["a 7".into()])
        );
        // Unknown fields are ignored, as Cloud Hypervisor ignores them.
        assert_eq!(
            run(
                "PUT",
                "/api/v1/vm.resize",
                r#"{"id":"a","bogus":1,"size":7}"#
            ),
            Ok(vec!["a 7".into()])
        );
        for (m, p, b, want) in [
            ("GET", "/api/v1/vm.nothing", "", 404),
            ("GET", "/v1/vm.info", "", 404),
            ("PUT", "/api/v1/vm.info", "", 405),
            ("GET", "/api/v1/vm.resize", "", 405),
            ("GET", "/api/v1/vm.info", "{}", 400),
            ("PUT", "/api/v1/vm.resize", "", 400),
            ("PUT", "/api/v1/vm.resize", "{", 400),
            ("PUT", "/api/v1/vm.resize", r#"{"id":"a"}"#, 400),
            ("PUT", "/api/v1/vm.resize", r#"{"id":"a","size":"1M"}"#, 400),
            ("PUT", "/api/v1/vm.resize", r#"{"id":"a","size":-1}"#, 400),
            ("PUT", "/api/v1/vm.resize", r#"{"id":"a","size":1} x"#, 400),
        ] {
            assert_eq!(run(m, p, b), Err(want), "{m} {p} {b}");
        }
        let e = route(
            &table(),
            "PUT",
            "/api/v1/vm.resize",
            br#"{"id":3,"size":1}"#,
        )
        .err()
        .unwrap();
        let text = e.body.unwrap();
        assert!(text.contains("id: invalid type"), "{text}");
    }
}
