//! Real NBD servers for tests: qemu-nbd, qemu-storage-daemon's NBD
//! export and nbdkit (file and memory plugins), each on a Unix socket,
//! started in the foreground and killed when dropped.
//!
//! A test checks [`NbdServer::tool`] with [`crate::has_command`] first.
//! [`NbdServer::start`] waits (at most 20 s) until the socket accepts a
//! connection; [`NbdServer::kill`] and [`NbdServer::restart`] let
//! reconnection tests take the server away and bring it back.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Which server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `qemu-nbd -t`: one client at a time (`--shared=1`), no multi-conn.
    QemuNbd,
    /// `qemu-storage-daemon --nbd-server ... --export type=nbd`:
    /// multi-conn.
    QemuStorageDaemon,
    /// `nbdkit file`.
    NbdkitFile,
    /// `nbdkit memory` (the image argument is ignored; 64 MiB).
    NbdkitMemory,
}

pub const ALL: [Kind; 4] = [
    Kind::QemuNbd,
    Kind::QemuStorageDaemon,
    Kind::NbdkitFile,
    Kind::NbdkitMemory,
];

pub struct NbdServer {
    kind: Kind,
    args: Vec<String>,
    child: Option<Child>,
    socket: PathBuf,
    /// The URI clients open (`nbd+unix:///NAME?socket=PATH`).
    pub uri: String,
}

impl NbdServer {
    /// The command the server needs.
    pub fn tool(kind: Kind) -> &'static str {
        match kind {
            Kind::QemuNbd => "qemu-nbd",
            Kind::QemuStorageDaemon => "qemu-storage-daemon",
            Kind::NbdkitFile | Kind::NbdkitMemory => "nbdkit",
        }
    }

    /// Serves `image` (format `fmt`: raw or qcow2; nbdkit serves raw
    /// only) on `socket`, writable or not.
    pub fn start(kind: Kind, image: &Path, fmt: &str, socket: &Path, writable: bool) -> NbdServer {
        let img = image.display().to_string();
        let sock = socket.display().to_string();
        let mut args: Vec<String> = match kind {
            Kind::QemuNbd => vec![
                "-t".into(),
                "-f".into(),
                fmt.into(),
                "-k".into(),
                sock.clone(),
                img,
            ],
            Kind::QemuStorageDaemon => vec![
                "--blockdev".into(),
                format!("driver=file,filename={img},node-name=file0"),
                "--blockdev".into(),
                format!("driver={fmt},file=file0,node-name=fmt0"),
                "--nbd-server".into(),
                format!("addr.type=unix,addr.path={sock}"),
                "--export".into(),
                format!(
                    "type=nbd,id=e0,node-name=fmt0,name=disk,writable={}",
                    if writable { "on" } else { "off" }
                ),
            ],
            Kind::NbdkitFile => vec![
                "-f".into(),
                "-U".into(),
                sock.clone(),
                "file".into(),
                format!("file={img}"),
            ],
            Kind::NbdkitMemory => vec![
                "-f".into(),
                "-U".into(),
                sock.clone(),
                "memory".into(),
                "size=64M".into(),
            ],
        };
        if !writable {
            match kind {
                Kind::QemuNbd => args.insert(0, "-r".into()),
                Kind::NbdkitFile | Kind::NbdkitMemory => args.insert(0, "-r".into()),
                Kind::QemuStorageDaemon => {}
            }
        }
        let name = if kind == Kind::QemuStorageDaemon {
            "disk"
        } else {
            ""
        };
        let mut s = NbdServer {
            kind,
            args,
            child: None,
            socket: socket.to_owned(),
            uri: format!("nbd+unix:///{name}?socket={sock}"),
        };
        s.spawn();
        s
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    fn spawn(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
        let child = Command::new(Self::tool(self.kind))
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", Self::tool(self.kind)));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while UnixStream::connect(&self.socket).is_err() {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("{} {:?} exited {status}", Self::tool(self.kind), self.args);
            }
            assert!(
                Instant::now() < deadline,
                "{} did not start",
                Self::tool(self.kind)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server (SIGKILL: no goodbye to its clients).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again with the same arguments.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for NbdServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_file(&self.socket);
    }
}
