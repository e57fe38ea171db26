//! Differential: the bare-metal test guest under upstream Cloud
//! Hypervisor's `cloud-hypervisor` (v54) and under ours, with the same
//! disks (a raw disk with one queue, `image_type=raw`, and a 2-queue
//! qcow2 whose type each VMM probes, made fresh for each VMM), 2 vCPUs, the guest's `counts` and `park`, and the API on
//! both:
//! - the guest's RESULT and COUNT lines are the same byte for byte, and
//!   both VMMs' vm.counters agree on the operations and bytes;
//! - vm.info, vm.counters and vmm.ping have upstream's structure (keys,
//!   nesting, JSON types; not values such as paths, pids or addresses):
//!   the parts upstream's clients read of the disks (the disk entries,
//!   their `device_tree` nodes and the probed `image_type`), vm.counters'
//!   disk entries and vmm.ping must match; every other difference is
//!   printed (keys only ours has, upstream's sections for devices we do
//!   not have);
//! - the load mode (`load=`) runs under both.
//!
//! Upstream's binaries come from the folder in `CH_UPSTREAM_DIR` (`.ci/run`
//! sets it); no package provides them, so without it each test reports a
//! skip naming the variable, even under `CH_REQUIRE_ALL=1`
//! (testkit::upstream). Upstream turns the guest's reset into a reboot,
//! hence `park` and `vmm.shutdown`.

mod e2e_api_support;
mod e2e_support;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e_api_support::{curl_raw, guest_counts, have_curl};
use e2e_support::{test_guest, vmm_binary, BOOT_TIMEOUT};
use integration_tests::{json, qemu_img, TempDir};
use serde_json::Value;
use testkit::ChildGuard;

/// Upstream's folder, or `None` (a reported skip naming
/// `CH_UPSTREAM_DIR`) when the variable is unset (testkit::upstream).
fn upstream_dir() -> Option<PathBuf> {
    let binary = testkit::upstream_binary("cloud-hypervisor")?;
    have_curl().then(|| binary.parent().map(PathBuf::from))?
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Peer {
    Upstream,
    Ours,
}

/// What one VMM gave: the serial log and the API's answers.
struct Outcome {
    serial: String,
    /// The VMM's stderr (its log).
    stderr: String,
    info: Value,
    counters: Value,
    ping: Value,
    /// (endpoint, HTTP status) of each call made.
    statuses: Vec<(String, u16)>,
}

/// Boots the test guest with `cmdline` under `peer` with a fresh raw disk
/// (16 MiB, 1 queue) and a fresh qcow2 (64 MiB, 2 queues), the API on a
/// socket; waits for the guest to park, asks the API, shuts the VMM down.
fn run(peer: Peer, upstream: &Path, cmdline: &str) -> Outcome {
    let dir = TempDir::new(&format!("updiff-{peer:?}"));
    let raw = dir.file("a.raw");
    let qcow2 = dir.file("b.qcow2");
    qemu_img(&["create", "-q", "-f", "raw", &raw, "16M"]);
    qemu_img(&["create", "-q", "-f", "qcow2", &qcow2, "64M"]);
    let socket = dir.file("api.sock");
    let serial = dir.file("serial.log");
    let stderr_path = dir.file("stderr.log");
    let binary = match peer {
        Peer::Upstream => upstream.join("cloud-hypervisor"),
        Peer::Ours => vmm_binary().to_path_buf(),
    };
    let mut cmd = Command::new(&binary);
    cmd.arg("--kernel")
        .arg(test_guest())
        .args([
            "--cmdline",
            cmdline,
            "--cpus",
            "boot=2",
            "--memory",
            "size=128M",
        ])
        // image_type=raw: upstream refuses writes to sector 0 of a raw
        // image whose type it probed (the qcow2's type is probed).
        .args(["--disk", &format!("path={raw},image_type=raw")])
        .args(["--disk", &format!("path={qcow2},num_queues=2")])
        .args(["--serial", &format!("file={serial}")])
        .args(["--api-socket", &format!("path={socket}")]);
    if peer == Peer::Upstream {
        // Its default is a virtio-console on the terminal; ours has none.
        cmd.args(["--console", "off"]);
    }
    let err = File::create(&stderr_path).unwrap();
    let mut child = ChildGuard(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", binary.display())),
    );
    let end = Instant::now() + BOOT_TIMEOUT;
    let serial_text = loop {
        let s = std::fs::read_to_string(&serial).unwrap_or_default();
        if s.contains("info parked") || s.contains("RESULT: FAIL") {
            break s;
        }
        if let Ok(Some(status)) = child.try_wait() {
            let e = std::fs::read_to_string(&stderr_path).unwrap_or_default();
            panic!("{peer:?} VMM exited ({status}) before the guest parked:\n{s}\n{e}");
        }
        assert!(
            Instant::now() < end,
            "{peer:?}: the guest did not park within {BOOT_TIMEOUT:?}:\n{s}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut statuses = Vec::new();
    let mut get = |endpoint: &str| {
        let (status, body) = curl_raw(
            &socket,
            "GET",
            &format!("http://localhost/api/v1/{endpoint}"),
            None,
        );
        statuses.push((endpoint.to_string(), status));
        if status == 200 {
            json(&body)
        } else {
            Value::Null
        }
    };
    let info = get("vm.info");
    let counters = get("vm.counters");
    let ping = get("vmm.ping");
    let (status, _) = curl_raw(&socket, "PUT", "http://localhost/api/v1/vmm.shutdown", None);
    statuses.push(("vmm.shutdown".to_string(), status));
    testkit::exit_within(&mut child, "the VMM after vmm.shutdown", BOOT_TIMEOUT);
    Outcome {
        serial: serial_text,
        stderr: std::fs::read_to_string(&stderr_path).unwrap_or_default(),
        info,
        counters,
        ping,
        statuses,
    }
}

/// The guest's RESULT and COUNT lines.
fn verdict_lines(serial: &str) -> Vec<&str> {
    serial
        .lines()
        .filter(|l| l.starts_with("RESULT:") || l.starts_with("COUNT "))
        .collect()
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Structural differences between upstream's `up` and our `ours` at
/// `path`: (missing in ours or of another type, only in ours). Arrays
/// are compared element by element (a length difference counts as
/// missing elements when ours is shorter).
fn shape_diff(
    path: &str,
    up: &Value,
    ours: &Value,
    missing: &mut Vec<String>,
    extra: &mut Vec<String>,
) {
    match (up, ours) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                match b.get(k) {
                    Some(w) => shape_diff(&format!("{path}.{k}"), v, w, missing, extra),
                    None => missing.push(format!("{path}.{k} ({}) missing in ours", kind(v))),
                }
            }
            for (k, w) in b {
                if !a.contains_key(k) {
                    extra.push(format!("{path}.{k} ({}) only in ours", kind(w)));
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                shape_diff(&format!("{path}[{i}]"), v, w, missing, extra);
            }
            if b.len() < a.len() {
                missing.push(format!("{path}: {} elements, ours {}", a.len(), b.len()));
            }
        }
        (a, Value::Null) if !a.is_null() => {
            missing.push(format!("{path} ({}) missing in ours", kind(a)));
        }
        (a, b) if kind(a) != kind(b) => {
            missing.push(format!("{path}: upstream {}, ours {}", kind(a), kind(b)));
        }
        _ => {}
    }
}

/// The ids of the disks in a vm.info.
fn disk_ids(info: &Value) -> Vec<String> {
    info["config"]["disks"]
        .as_array()
        .map(|d| {
            d.iter()
                .filter_map(|e| e["id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Upstream's device_tree nodes that belong to a disk: the disk's node
/// and every node with it among its children (its virtio-pci node).
fn disk_node_ids(info: &Value) -> Vec<String> {
    let disks = disk_ids(info);
    let mut ids = Vec::new();
    if let Some(tree) = info["device_tree"].as_object() {
        for (id, node) in tree {
            let has_disk_child = node["children"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|x| x.as_str().is_some_and(|x| disks.iter().any(|d| d == x)))
            });
            if disks.contains(id) || has_disk_child {
                ids.push(id.clone());
            }
        }
    }
    ids
}

#[test]
fn the_guest_reports_the_same_under_upstream_and_ours() {
    let Some(upstream) = upstream_dir() else {
        return;
    };
    let up = run(Peer::Upstream, &upstream, "disks=2 counts park");
    let ours = run(Peer::Ours, &upstream, "disks=2 counts park");
    let up_lines = verdict_lines(&up.serial);
    assert_eq!(
        up_lines.last(),
        Some(&"RESULT: PASS"),
        "upstream did not pass the test guest:\n{}\n{}",
        up.serial,
        up.stderr
    );
    assert_eq!(
        up_lines.len(),
        3,
        "two COUNT lines and RESULT:\n{}",
        up.serial
    );
    assert_eq!(
        verdict_lines(&ours.serial),
        up_lines,
        "RESULT/COUNT lines differ; ours:\n{}",
        ours.serial
    );
    // Both VMMs counted what the guest asked, the same way.
    for (n, id) in disk_ids(&up.info).iter().enumerate() {
        for key in ["read_ops", "read_bytes", "write_ops", "write_bytes"] {
            assert_eq!(
                ours.counters[id][key], up.counters[id][key],
                "{id}.{key}: ours {} upstream {}",
                ours.counters, up.counters
            );
        }
        // ... which is what the guest says it asked.
        for (key, want) in guest_counts(&up.serial, n) {
            if up.counters[id].get(&key).is_some() {
                assert_eq!(up.counters[id][&key], want, "{id}.{key}: {}", up.counters);
            }
        }
    }
}

#[test]
fn the_api_answers_in_upstreams_shape() {
    let Some(upstream) = upstream_dir() else {
        return;
    };
    let up = run(Peer::Upstream, &upstream, "disks=2 counts park");
    let ours = run(Peer::Ours, &upstream, "disks=2 counts park");
    let (mut must, mut may, mut extra) = (Vec::new(), Vec::new(), Vec::new());

    // vm.info: the top level, then the disk entries and their nodes.
    // (Nested objects and arrays emptied: their insides are compared
    // below where required.)
    let top = |v: &Value| -> Value {
        let keys = v.as_object().map(|o| {
            o.iter()
                .map(|(k, x)| {
                    let shallow = match x {
                        Value::Object(_) => Value::Object(Default::default()),
                        Value::Array(_) => Value::Array(Vec::new()),
                        other => other.clone(),
                    };
                    (k.clone(), shallow)
                })
                .collect()
        });
        keys.map(Value::Object).unwrap_or(Value::Null)
    };
    shape_diff(
        "vm.info",
        &top(&up.info),
        &top(&ours.info),
        &mut must,
        &mut extra,
    );
    shape_diff(
        "vm.info.config.disks",
        &up.info["config"]["disks"],
        &ours.info["config"]["disks"],
        &mut must,
        &mut extra,
    );
    for (i, d) in up.info["config"]["disks"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let theirs = &ours.info["config"]["disks"][i]["image_type"];
        if d["image_type"] != *theirs {
            must.push(format!(
                "vm.info.config.disks[{i}].image_type: upstream {}, ours {theirs}",
                d["image_type"]
            ));
        }
    }
    for id in disk_node_ids(&up.info) {
        let path = format!("vm.info.device_tree.{id}");
        match ours.info["device_tree"].get(&id) {
            Some(node) => shape_diff(
                &path,
                &up.info["device_tree"][&id],
                node,
                &mut must,
                &mut extra,
            ),
            None => must.push(format!("{path} missing in ours")),
        }
        // The tree's links (ids, the same in both); a missing link is
        // already reported above.
        for rel in ["parent", "children"] {
            let (a, b) = (
                &up.info["device_tree"][&id][rel],
                &ours.info["device_tree"][&id][rel],
            );
            if !a.is_null() && !b.is_null() && a != b {
                must.push(format!("{path}.{rel}: upstream {a}, ours {b}"));
            }
        }
    }
    // Everything else in vm.info is reported, not required.
    for section in up.info["config"].as_object().into_iter().flatten() {
        if section.0 != "disks" {
            let path = format!("vm.info.config.{}", section.0);
            shape_diff(
                &path,
                section.1,
                &ours.info["config"][section.0],
                &mut may,
                &mut extra,
            );
        }
    }
    let disk_nodes = disk_node_ids(&up.info);
    for (id, node) in up.info["device_tree"].as_object().into_iter().flatten() {
        if !disk_nodes.contains(id) {
            let path = format!("vm.info.device_tree.{id}");
            shape_diff(
                &path,
                node,
                &ours.info["device_tree"][id],
                &mut may,
                &mut extra,
            );
        }
    }
    for (id, _) in ours.info["device_tree"].as_object().into_iter().flatten() {
        if up.info["device_tree"].get(id).is_none() {
            extra.push(format!("vm.info.device_tree.{id} only in ours"));
        }
    }

    // vm.counters: every disk's entry; vmm.ping whole.
    shape_diff(
        "vm.counters",
        &up.counters,
        &ours.counters,
        &mut must,
        &mut extra,
    );
    shape_diff("vmm.ping", &up.ping, &ours.ping, &mut must, &mut extra);
    if up.statuses != ours.statuses {
        may.push(format!(
            "HTTP statuses: upstream {:?}, ours {:?}",
            up.statuses, ours.statuses
        ));
    }

    for d in &may {
        eprintln!("differs (reported, not required): {d}");
    }
    for d in &extra {
        eprintln!("only in ours (allowed): {d}");
    }
    assert!(
        must.is_empty(),
        "vm.info / vm.counters / vmm.ping differ from upstream's shape where upstream's \
         clients read them:\n  {}\nupstream vm.info: {}\nours: {}",
        must.join("\n  "),
        up.info,
        ours.info
    );
}

#[test]
fn the_load_mode_runs_under_upstream_and_ours() {
    let Some(upstream) = upstream_dir() else {
        return;
    };
    let cmdline = "disks=2 counts park load=1 depth=8 bs=4k rw=randwrite";
    for peer in [Peer::Upstream, Peer::Ours] {
        let out = run(peer, &upstream, cmdline);
        assert!(
            out.serial.contains("RESULT: PASS"),
            "{peer:?}:\n{}\n{}",
            out.serial,
            out.stderr
        );
        let done = out
            .serial
            .lines()
            .find(|l| l.starts_with("LOAD done requests="))
            .unwrap_or_else(|| panic!("{peer:?}: no LOAD done line:\n{}", out.serial));
        assert!(
            !done.starts_with("LOAD done requests=0 "),
            "{peer:?}: {done}"
        );
        // The load's writes are in the COUNT lines, as the VMM counted them.
        for (n, id) in disk_ids(&out.info).iter().enumerate() {
            for (key, want) in guest_counts(&out.serial, n) {
                if ["read_ops", "write_ops", "read_bytes", "write_bytes"].contains(&key.as_str()) {
                    assert_eq!(
                        out.counters[id][&key], want,
                        "{peer:?} {id}.{key}: {}",
                        out.counters
                    );
                }
            }
        }
    }
}
