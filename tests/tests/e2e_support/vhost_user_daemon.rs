//! `ch-storage-daemon --export type=vhost-user-blk` for the tests that
//! boot with a vhost-user disk: started with its socket ready, stopped
//! with SIGTERM and a clean exit asserted, killed if a test fails first.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use integration_tests::{project_bin, TempDir};

/// `ch-storage-daemon` exporting `image` over vhost-user-blk at `socket`.
pub struct Daemon {
    child: Child,
    log: String,
}

impl Daemon {
    pub fn start(dir: &TempDir, image: &str, socket: &str, num_queues: u16) -> Daemon {
        let log = dir.file("daemon.log");
        let child = Command::new(project_bin("storage-daemon", "ch-storage-daemon"))
            .args(["--image", &format!("path={image}")])
            .args([
                "--export",
                &format!("type=vhost-user-blk,socket={socket},num_queues={num_queues},writable=on"),
                "-v",
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("daemon log"))
            .spawn()
            .expect("spawn ch-storage-daemon");
        let mut daemon = Daemon { child, log };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !Path::new(socket).exists() {
            if let Ok(Some(status)) = daemon.child.try_wait() {
                panic!("daemon exited with {status}: {}", daemon.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "no socket: {}",
                daemon.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        daemon
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM; asserts a clean exit (the image closed and flushed).
    pub fn stop(mut self) -> String {
        testkit::signal(self.child.id(), "TERM").unwrap_or_else(|e| panic!("{e}"));
        let status = super::wait_with_timeout(&mut self.child, Duration::from_secs(30));
        let log = self.log_text();
        assert!(status.success(), "daemon exit {status}: {log}");
        log
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
