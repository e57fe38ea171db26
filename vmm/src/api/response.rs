//! What the API answers: an HTTP status and an optional JSON body; an
//! error's body is the error chain as a JSON array of strings, outermost
//! first, the shape Cloud Hypervisor's client prints.

use serde::Serialize;

/// An HTTP status and an optional JSON body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiResponse {
    pub status: u16,
    pub body: Option<String>,
}

impl ApiResponse {
    pub fn no_content() -> Self {
        ApiResponse {
            status: 204,
            body: None,
        }
    }

    /// 200 with an empty body (upstream's answer to `vmm.shutdown`).
    pub fn ok_empty() -> Self {
        ApiResponse {
            status: 200,
            body: None,
        }
    }

    /// 200 with `value` as the JSON body.
    pub fn json(value: &impl Serialize) -> Self {
        match serde_json::to_string(value) {
            Ok(body) => ApiResponse {
                status: 200,
                body: Some(body),
            },
            Err(e) => Self::error(500, &["cannot encode the answer", &e.to_string()]),
        }
    }

    /// An error: `status` and, as Cloud Hypervisor does, the error chain
    /// as a JSON array of strings (outermost first).
    pub fn error(status: u16, chain: &[&str]) -> Self {
        ApiResponse {
            status,
            body: Some(serde_json::to_string(chain).unwrap_or_else(|_| "[]".into())),
        }
    }

    /// An error from an error value and its sources.
    pub fn from_error(status: u16, e: &(dyn std::error::Error + 'static)) -> Self {
        Self::from_error_in(status, None, e)
    }

    /// An error from what failed (`what`), the error and its sources.
    pub fn from_error_in(
        status: u16,
        what: Option<&str>,
        e: &(dyn std::error::Error + 'static),
    ) -> Self {
        let mut chain: Vec<String> = what.map(str::to_string).into_iter().collect();
        chain.push(e.to_string());
        let mut cur = e.source();
        while let Some(s) = cur {
            chain.push(s.to_string());
            cur = s.source();
        }
        let refs: Vec<&str> = chain.iter().map(String::as_str).collect();
        Self::error(status, &refs)
    }
}
