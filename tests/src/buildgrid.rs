//! A private BuildGrid (a real Remote Execution API server, from PyPI) for the
//! shared-cache tests: disk CAS, ByteStream and an ActionCache on a loopback
//! port, stopped on drop.
//!
//! BuildGrid is installed by `scripts/setup-buildgrid.sh` (which
//! `scripts/test.sh` runs) into `.tools/buildgrid`; `NVLINKD_BUILDGRID` names
//! another `bgd`. Where it is not installed (offline, no Python 3.13),
//! [`BuildGrid::start`] returns None and the tests skip with a message.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::env::{repo_root, TempDir};

pub struct BuildGrid {
    pub dir: TempDir,
    pub addr: SocketAddr,
    child: Option<Child>,
}

/// The `bgd` to run, if installed.
pub fn bgd() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NVLINKD_BUILDGRID") {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    Some(repo_root().join(".tools/buildgrid/bin/bgd")).filter(|p| p.is_file())
}

/// A free loopback port (bound, then released for BuildGrid to take).
fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free loopback port")
}

impl BuildGrid {
    /// Start BuildGrid and wait until it accepts connections; None (with a
    /// message) where BuildGrid is not installed.
    pub fn start() -> Option<BuildGrid> {
        let Some(bgd) = bgd() else {
            eprintln!(
                "SKIP: BuildGrid is not installed (scripts/setup-buildgrid.sh; or set NVLINKD_BUILDGRID to a bgd)"
            );
            return None;
        };
        let dir = TempDir::new("bg");
        let addr = free_port();
        let config = dir.path().join("buildgrid.yml");
        std::fs::write(&config, config_text(addr, &dir.path().join("storage"))).expect("write BuildGrid config");
        let log = std::fs::File::create(dir.path().join("bgd.log")).expect("BuildGrid log");
        let child = Command::new(&bgd)
            .args(["server", "start"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start bgd");
        let mut bg = BuildGrid { dir, addr, child: Some(child) };
        bg.wait_ready();
        Some(bg)
    }

    /// Wait until the port accepts connections (gRPC's server starts listening
    /// once its services are registered); fail with the log if bgd exits or
    /// takes more than two minutes (its Python start is slow on a busy machine).
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                return;
            }
            if let Some(c) = &mut self.child {
                if let Ok(Some(st)) = c.try_wait() {
                    panic!("bgd exited ({st}) before serving:\n{}", self.log());
                }
            }
            assert!(Instant::now() < deadline, "BuildGrid did not start serving:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `--remote-cache` for this server.
    pub fn url(&self) -> String {
        format!("grpc://{}", self.addr)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("bgd.log")).unwrap_or_default()
    }

    /// The files of BuildGrid's disk CAS (one per blob).
    pub fn blobs(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let objects = self.dir.path().join("storage/cas/objects");
        for shard in std::fs::read_dir(objects).into_iter().flatten().flatten() {
            for f in std::fs::read_dir(shard.path()).into_iter().flatten().flatten() {
                out.push(f.path());
            }
        }
        out
    }

    /// Stop the server (its port then refuses connections).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for BuildGrid {
    fn drop(&mut self) {
        self.stop();
    }
}

fn config_text(addr: SocketAddr, storage: &Path) -> String {
    format!(
        r#"server:
  - !channel
    address: "{addr}"
    insecure-mode: true
storages:
  - !disk-storage &cas
    path: "{storage}"
caches:
  - !lru-action-cache &ac
    storage: *cas
    max-cached-refs: 100000
    allow-updates: true
    cache-failed-actions: true
instances:
  - name: ""
    services:
      - !action-cache
        cache: *ac
      - !cas
        storage: *cas
      - !bytestream
        storage: *cas
thread-pool-size: 8
"#,
        storage = storage.display()
    )
}
