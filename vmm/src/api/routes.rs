//! Which request a method and path stand for, and their bodies parsed:
//! the table of endpoints under `/api/v1/` (Cloud Hypervisor's names,
//! plus our `vm.snapshot-disk` and `vm.disk-info`).
//!
//! An unknown path is 404, a known path with the wrong method 405, a
//! body that is not the JSON the endpoint takes 400; none of these reach
//! the control loop.

use serde::de::DeserializeOwned;

use super::types::{DiskConfigBody, IdBody, ResizeDiskBody, SnapshotDiskBody};
use super::{ApiRequest, ApiResponse};
use crate::config::disk::parse_disk;

pub const API_ROOT: &str = "/api/v1/";

/// Every endpoint with its method.
pub const ENDPOINTS: &[(&str, &str)] = &[
    ("vmm.ping", "GET"),
    ("vmm.shutdown", "PUT"),
    ("vm.info", "GET"),
    ("vm.counters", "GET"),
    ("vm.pause", "PUT"),
    ("vm.resume", "PUT"),
    ("vm.shutdown", "PUT"),
    ("vm.reboot", "PUT"),
    ("vm.resize-disk", "PUT"),
    ("vm.add-disk", "PUT"),
    ("vm.remove-device", "PUT"),
    ("vm.snapshot-disk", "PUT"),
    ("vm.disk-info", "PUT"),
];

fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiResponse> {
    if body.is_empty() {
        return Err(ApiResponse::error(
            400,
            &["this endpoint needs a JSON body"],
        ));
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiResponse::error(400, &["cannot parse the request body", &e.to_string()]))
}

/// The request `method` `path` with `body` stands for.
pub fn route(method: &str, path: &str, body: &[u8]) -> Result<ApiRequest, ApiResponse> {
    let Some(name) = path.strip_prefix(API_ROOT) else {
        return Err(ApiResponse::error(
            404,
            &[&format!(
                "no such path '{path}' (endpoints are under {API_ROOT})"
            )],
        ));
    };
    let Some(&(_, want)) = ENDPOINTS.iter().find(|(n, _)| *n == name) else {
        return Err(ApiResponse::error(404, &[&format!("no endpoint '{name}'")]));
    };
    if method != want {
        return Err(ApiResponse::error(
            405,
            &[&format!("{name} takes {want}, not {method}")],
        ));
    }
    let takes_body = matches!(
        name,
        "vm.resize-disk" | "vm.add-disk" | "vm.remove-device" | "vm.snapshot-disk" | "vm.disk-info"
    );
    if !takes_body && !body.is_empty() {
        return Err(ApiResponse::error(400, &[&format!("{name} takes no body")]));
    }
    Ok(match name {
        "vmm.ping" => ApiRequest::VmmPing,
        "vmm.shutdown" => ApiRequest::VmmShutdown,
        "vm.info" => ApiRequest::VmInfo,
        "vm.counters" => ApiRequest::VmCounters,
        "vm.pause" => ApiRequest::VmPause,
        "vm.resume" => ApiRequest::VmResume,
        "vm.shutdown" => ApiRequest::VmShutdown,
        "vm.reboot" => ApiRequest::VmReboot,
        "vm.resize-disk" => {
            let b: ResizeDiskBody = parse(body)?;
            ApiRequest::VmResizeDisk {
                id: b.id,
                desired_size: b.desired_size,
                shrink: b.shrink,
            }
        }
        "vm.add-disk" => {
            let b: DiskConfigBody = parse(body)?;
            let arg = b
                .to_disk_arg()
                .map_err(|e| ApiResponse::error(400, &["invalid disk configuration", &e]))?;
            let config = parse_disk(&arg).map_err(|e| {
                ApiResponse::error(400, &["invalid disk configuration", &e.to_string()])
            })?;
            ApiRequest::VmAddDisk(Box::new(config))
        }
        "vm.remove-device" => ApiRequest::VmRemoveDevice {
            id: parse::<IdBody>(body)?.id,
        },
        "vm.snapshot-disk" => {
            let b: SnapshotDiskBody = parse(body)?;
            ApiRequest::VmSnapshotDisk {
                id: b.id,
                name: b.name,
            }
        }
        "vm.disk-info" => ApiRequest::VmDiskInfo {
            id: parse::<IdBody>(body)?.id,
        },
        _ => unreachable!("every endpoint of the table is matched"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(method: &str, path: &str, body: &str) -> u16 {
        match route(method, path, body.as_bytes()) {
            Ok(_) => 200,
            Err(r) => r.status,
        }
    }

    #[test]
    fn paths_methods_and_bodies() {
        assert!(matches!(
            route("GET", "/api/v1/vmm.ping", b""),
            Ok(ApiRequest::VmmPing)
        ));
        assert!(matches!(
            route(
                "PUT",
                "/api/v1/vm.resize-disk",
                br#"{"id":"_disk0","desired_size":1048576}"#
            ),
            Ok(ApiRequest::VmResizeDisk {
                desired_size: 1048576,
                ..
            })
        ));
        for (m, p, b, want) in [
            ("GET", "/api/v1/vm.nothing", "", 404),
            ("GET", "/v1/vm.info", "", 404),
            ("PUT", "/api/v1/vm.info", "", 405),
            ("GET", "/api/v1/vm.pause", "", 405),
            ("PUT", "/api/v1/vm.pause", "{}", 400),
            ("PUT", "/api/v1/vm.resize-disk", "", 400),
            ("PUT", "/api/v1/vm.resize-disk", "{", 400),
            ("PUT", "/api/v1/vm.resize-disk", r#"{"id":"a"}"#, 400),
            (
                "PUT",
                "/api/v1/vm.resize-disk",
                r#"{"id":"a","desired_size":"1M"}"#,
                400,
            ),
            (
                "PUT",
                "/api/v1/vm.resize-disk",
                r#"{"id":"a","desired_size":-1}"#,
                400,
            ),
            (
                "PUT",
                "/api/v1/vm.resize-disk",
                r#"{"id":"a","desired_size":1,"x":2}"#,
                400,
            ),
            ("PUT", "/api/v1/vm.remove-device", r#"{"id":3}"#, 400),
            (
                "PUT",
                "/api/v1/vm.add-disk",
                r#"{"path":"a","num_queues":0}"#,
                400,
            ),
            (
                "PUT",
                "/api/v1/vm.add-disk",
                r#"{"path":"a","iommu":true}"#,
                400,
            ),
            ("PUT", "/api/v1/vm.add-disk", r#"{"path":"a"}"#, 200),
            ("PUT", "/api/v1/vm.snapshot-disk", r#"{"id":"a"}"#, 400),
            (
                "PUT",
                "/api/v1/vm.resize-disk",
                r#"{"id":"a","desired_size":512,"shrink":true}"#,
                200,
            ),
            (
                "PUT",
                "/api/v1/vm.resize-disk",
                r#"{"id":"a","desired_size":512,"shrink":"yes"}"#,
                400,
            ),
        ] {
            assert_eq!(status(m, p, b), want, "{m} {p} {b}");
        }
        let e = route(
            "PUT",
            "/api/v1/vm.resize-disk",
            br#"{"id":"a","bogus":1,"desired_size":1}"#,
        )
        .unwrap_err();
        assert!(e.body.unwrap().contains("bogus"));
    }
}
