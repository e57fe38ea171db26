//! End-to-end: upstream Cloud Hypervisor's own `ch-remote` (v54) against
//! our VMM running the test guest, through every verb we implement and
//! their error cases. A user who moves from upstream keeps that client:
//! each verb must exit 0 and print what it prints against upstream (the
//! JSON body, or nothing for a 204), and each error must exit non-zero
//! with our message in its chain.
//!
//! The client is not packaged anywhere: the test finds it in the folder
//! `CH_UPSTREAM_DIR` names (`.ci/run` sets it where the binaries exist)
//! and reports a skip naming the variable otherwise (even under
//! `CH_REQUIRE_ALL=1`: a user's clone cannot get them; testkit::upstream).
//!
//! The lifecycle verbs too: reboot and power-button on the running VM,
//! shutdown then boot again, delete, then create (a JSON file, sent as
//! it is) and boot, with the answers upstream gives when the VM is not
//! in the state a verb needs.

mod e2e_api_support;
mod e2e_support;

use std::path::PathBuf;
use std::process::{Command, Output};

use e2e_api_support::{locked, vm_config, ApiVm};
use e2e_support::{check_clean, create_lazy_qcow2};
use integration_tests::{json, qemu_create_overlay, qemu_img, TempDir};

/// Upstream's `ch-remote`, when `CH_UPSTREAM_DIR` names its folder.
fn upstream_ch_remote() -> Option<PathBuf> {
    testkit::upstream_binary("ch-remote")
}

struct Upstream {
    bin: PathBuf,
    socket: String,
}

impl Upstream {
    fn run(&self, args: &[&str]) -> Output {
        testkit::output_within(
            Command::new(&self.bin)
                .args(["--api-socket", &self.socket])
                .args(args),
            testkit::COMMAND_LIMIT,
        )
    }

    /// Exit 0; returns stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Exit 0 and nothing printed (a 204, as against upstream).
    fn quiet(&self, args: &[&str]) {
        assert_eq!(self.ok(args), "", "{args:?} printed something");
    }

    /// A non-zero exit whose error chain has every one of `words`.
    fn fails(&self, args: &[&str], words: &[&str]) {
        let out = self.run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded: {err}");
        for w in words {
            assert!(err.contains(w), "{args:?}: no {w:?} in {err}");
        }
    }
}

/// The keys of a JSON object.
fn keys(v: &serde_json::Value) -> Vec<String> {
    let mut k: Vec<String> = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .cloned()
        .collect();
    k.sort();
    k
}

#[test]
fn upstream_ch_remote_drives_every_verb() {
    let Some(bin) = upstream_ch_remote() else {
        return;
    };
    let dir = TempDir::new("api-upstream-client");
    let q = dir.file("d0.qcow2");
    create_lazy_qcow2(&q, "64M");
    let raw = dir.file("d1.raw");
    qemu_img(&["create", "-q", "-f", "raw", &raw, "16M"]);
    let hot = dir.file("hot.qcow2");
    create_lazy_qcow2(&hot, "16M");
    let base = dir.file("base.raw");
    qemu_img(&["create", "-q", "-f", "raw", &base, "16M"]);
    let overlay = dir.file("overlay.qcow2");
    qemu_create_overlay(&overlay, &base, "raw");
    let mut vm = ApiVm::start(
        &dir,
        "disks=2 park",
        &[
            "--cpus",
            "boot=2",
            "--disk",
            &format!("path={q},num_queues=2"),
            &format!("path={raw}"),
        ],
    );
    vm.wait_for("info parked");
    let up = Upstream {
        bin,
        socket: vm.socket.clone(),
    };

    // vmm.ping: upstream's keys, our version, the features.
    let ping = json(&up.ok(&["ping"]));
    assert_eq!(keys(&ping), ["build_version", "features", "pid", "version"]);
    assert_eq!(ping["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(ping["features"], serde_json::json!(["io_uring", "kvm"]));

    // vm.info: upstream's top-level keys, disks with its DiskConfig keys
    // and the probed formats, its device-tree layout.
    let info = json(&up.ok(&["info"]));
    assert_eq!(
        keys(&info),
        ["config", "device_tree", "memory_actual_size", "state"]
    );
    assert_eq!(info["state"], "Running");
    assert_eq!(info["config"]["cpus"]["boot_vcpus"], 2);
    let disks = &info["config"]["disks"];
    let disk_keys = keys(&disks[0]);
    for k in [
        "backing_files",
        "direct",
        "disable_aio",
        "disable_io_uring",
        "id",
        "image_type",
        "lock_granularity",
        "num_queues",
        "path",
        "pci_segment",
        "queue_size",
        "readonly",
        "sparse",
        "vhost_user",
    ] {
        assert!(disk_keys.iter().any(|d| d == k), "no {k}: {disk_keys:?}");
    }
    assert_eq!(disks[0]["image_type"], "Qcow2");
    assert_eq!(disks[1]["image_type"], "Raw");
    let tree = &info["device_tree"];
    for (id, bdf) in [("_disk0", "0000:00:01.0"), ("_disk1", "0000:00:02.0")] {
        let pci = format!("_virtio-pci-{id}");
        assert_eq!(tree[id]["parent"], pci.as_str(), "{tree}");
        assert_eq!(tree[&pci]["pci_bdf"], bdf, "{tree}");
        assert_eq!(tree[&pci]["children"], serde_json::json!([id]));
        assert!(tree[&pci]["resources"][0]["PciBar"]["base"].as_u64() > Some(0));
    }

    let counters = json(&up.ok(&["counters"]));
    assert!(
        counters["_disk0"]["read_ops"].as_u64() > Some(0),
        "{counters}"
    );
    for k in ["read_bytes", "write_bytes", "read_ops", "write_ops"] {
        assert!(counters["_disk1"].get(k).is_some(), "{k}: {counters}");
    }

    // Pause and resume, and each again: 500 as upstream, our reason.
    up.quiet(&["pause"]);
    up.fails(&["pause"], &["InternalServerError", "cannot pause"]);
    up.quiet(&["resume"]);
    up.fails(&["resume"], &["InternalServerError", "cannot resume"]);

    // Resize: the raw disk grows; unknown ids and a qcow2 shrink fail.
    up.quiet(&["resize-disk", "--disk", "_disk1", "--size", "32M"]);
    assert_eq!(std::fs::metadata(&raw).unwrap().len(), 32 << 20);
    up.fails(
        &["resize-disk", "--disk", "nosuch", "--size", "1M"],
        &["NotFound", "nosuch"],
    );
    up.fails(
        &["resize-disk", "--disk", "_disk0", "--size", "1M"],
        &["only grow"],
    );

    // Hot-add with upstream's DiskConfig (every field it serializes),
    // then what cannot be done, each named.
    let added = json(&up.ok(&["add-disk", &format!("path={hot},id=hot")]));
    assert_eq!(
        added,
        serde_json::json!({"id": "hot", "bdf": "0000:00:03.0"})
    );
    let info = json(&up.ok(&["info"]));
    assert_eq!(info["config"]["disks"][2]["image_type"], "Qcow2");
    assert_eq!(info["config"]["disks"][2]["backing_files"], false);
    up.fails(
        &["add-disk", &format!("path={hot},id=hot")],
        &["'hot' exists"],
    );
    up.fails(
        &[
            "add-disk",
            &format!("path={},id=h2", dir.file("missing.qcow2")),
        ],
        // A path that names nothing is the caller's mistake: 400 here
        // (upstream: 500; docs/api.md, the status rule).
        &["BadRequest", "missing.qcow2"],
    );
    up.fails(
        &["add-disk", &format!("path={raw},id=h3,iommu=on")],
        &["BadRequest", "iommu"],
    );
    // Upstream's client sends backing_files=false unless asked: an
    // overlay is refused, as upstream refuses it, and taken with =on.
    up.fails(
        &["add-disk", &format!("path={overlay},id=ov")],
        &["BadRequest", "backing"],
    );
    let added = json(&up.ok(&[
        "add-disk",
        &format!("path={overlay},id=ov,backing_files=on"),
    ]));
    assert_eq!(added["id"], "ov");

    // Removal (paused: the device goes at once), unknown ids.
    up.fails(&["remove-device", "nosuch"], &["NotFound", "nosuch"]);
    up.quiet(&["pause"]);
    up.quiet(&["remove-device", "hot"]);
    up.quiet(&["remove-device", "ov"]);
    up.quiet(&["resume"]);
    check_clean(&hot);

    // Reboot and the power button on the running VM (parked: it does
    // not act on the button, the GED's event is all it gets).
    up.quiet(&["reboot"]);
    vm.wait_for_count("info parked", 2);
    up.quiet(&["power-button"]);
    assert_eq!(json(&up.ok(&["info"]))["state"], "Running");

    // Shutdown, twice; what a stopped VM still answers.
    up.quiet(&["shutdown"]);
    up.fails(&["shutdown"], &["InternalServerError", "not running"]);
    up.fails(&["pause"], &["InternalServerError", "not running"]);
    up.fails(&["power-button"], &["InternalServerError", "not running"]);
    up.fails(
        &["add-disk", &format!("path={hot}")],
        &["InternalServerError", "not running"],
    );
    assert_eq!(json(&up.ok(&["info"]))["state"], "Created");
    assert!(!locked(&q) && !locked(&raw));
    check_clean(&q);
    // The same VM boots again, its disks reopened.
    up.quiet(&["boot"]);
    up.fails(&["boot"], &["InternalServerError", "already"]);
    vm.wait_for("info parked");
    assert!(locked(&q));

    // Delete, then a VM of our own making from a file.
    up.quiet(&["delete"]);
    assert!(!locked(&q));
    up.quiet(&["delete"]);
    up.fails(&["boot"], &["NotFound"]);
    up.fails(&["reboot"], &["NotFound"]);
    up.fails(&["info"], &["NotFound"]);
    let config = dir.file("vm.json");
    std::fs::write(&config, r#"{"net":[{"tap":"t0"}]}"#).unwrap();
    up.fails(&["create", &config], &["BadRequest", "net"]);
    let one = serde_json::json!({"path": q, "num_queues": 2});
    std::fs::write(&config, vm_config(&dir, "disks=1 park", &[one]).to_string()).unwrap();
    up.quiet(&["create", &config]);
    up.fails(&["create", &config], &["InternalServerError", "already"]);
    assert_eq!(json(&up.ok(&["info"]))["state"], "Created");
    up.quiet(&["boot"]);
    vm.wait_for("info parked");
    assert_eq!(json(&up.ok(&["info"]))["state"], "Running");
    // 200 with an empty body, as upstream answers: its client prints an
    // empty line, as it does against upstream.
    assert_eq!(up.ok(&["shutdown-vmm"]), "\n");
    let (status, stderr) = vm.wait_exit();
    assert!(status.success(), "{status}: {stderr}");
    check_clean(&q);
}
