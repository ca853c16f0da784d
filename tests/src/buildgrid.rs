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
    /// Whether it serves TLS (see [`BuildGrid::start_secure`]).
    tls: bool,
}

/// What a secured BuildGrid needs: its TLS files and a token it accepts.
pub struct Secured {
    /// The CA certificate (PEM) that signed the server's certificate.
    pub ca: PathBuf,
    /// A file holding a bearer token (a JWT signed with the server's secret).
    pub token_file: PathBuf,
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
        Self::launch(None, None).map(|(bg, _)| bg)
    }

    /// [`BuildGrid::start`] serving at most `n` calls at once: gRPC refuses
    /// any more as busy (`RESOURCE_EXHAUSTED`, "Concurrent RPC limit
    /// exceeded!"), as BuildGrid does past `thread-pool-size` unless told
    /// otherwise (`maximum-concurrent-rpcs`).
    pub fn start_with_call_limit(n: u32) -> Option<BuildGrid> {
        Self::launch(None, Some(n)).map(|(bg, _)| bg)
    }

    /// BuildGrid serving TLS (a certificate for 127.0.0.1 and localhost from a
    /// CA made here with openssl) and accepting only JWT bearer tokens signed
    /// with its secret (made with the PyJWT of BuildGrid's environment). None
    /// (with a message) without BuildGrid or openssl.
    pub fn start_secure() -> Option<(BuildGrid, Secured)> {
        if Command::new("openssl").arg("version").output().is_err() {
            eprintln!("SKIP: no openssl to make the test certificates");
            return None;
        }
        Self::launch(Some(()), None).map(|(bg, s)| (bg, s.expect("secured")))
    }

    fn launch(secure: Option<()>, call_limit: Option<u32>) -> Option<(BuildGrid, Option<Secured>)> {
        let Some(bgd) = bgd() else {
            eprintln!(
                "SKIP: BuildGrid is not installed (scripts/setup-buildgrid.sh; or set NVLINKD_BUILDGRID to a bgd)"
            );
            return None;
        };
        let dir = TempDir::new("bg");
        let addr = free_port();
        let config = dir.path().join("buildgrid.yml");
        let (secured, mut extra) = match secure {
            Some(()) => {
                let (s, extra) = secure_files(&bgd, dir.path());
                (Some(s), extra)
            }
            None => (None, String::new()),
        };
        if let Some(n) = call_limit {
            extra += &format!("maximum-concurrent-rpcs: {n}\n");
        }
        let text = match secured {
            // The deployed configuration itself (deploy/buildgrid), its
            // address and paths this test's.
            Some(_) => deployed_config(addr, dir.path()),
            None => config_text(addr, &dir.path().join("storage"), false) + &extra,
        };
        std::fs::write(&config, text).expect("write BuildGrid config");
        let log = std::fs::File::create(dir.path().join("bgd.log")).expect("BuildGrid log");
        let child = Command::new(&bgd)
            .args(["server", "start"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start bgd");
        let tls = secured.is_some();
        let mut bg = BuildGrid { dir, addr, child: Some(child), tls };
        bg.wait_ready();
        Some((bg, secured))
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
        format!("{}://{}", if self.tls { "grpcs" } else { "grpc" }, self.addr)
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

/// Run a command; panic with its output if it fails.
fn must(cmd: &mut Command) -> Vec<u8> {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

/// A CA, a server certificate for 127.0.0.1/localhost signed by it, a JWT
/// secret and a token signed with it; the config lines for them.
fn secure_files(bgd: &Path, dir: &Path) -> (Secured, String) {
    let p = |n: &str| dir.join(n);
    let ssl = |args: &[&str]| must(Command::new("openssl").args(args).current_dir(dir));
    ssl(&["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2"]
        .iter()
        .copied()
        .chain(["-subj", "/CN=nvlinkd test CA"])
        .collect::<Vec<_>>());
    ssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    std::fs::write(p("ext.cnf"), "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n").unwrap();
    ssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
    let secret = "nvlinkd-test-secret-0123456789abcdef";
    // bgd's own interpreter, which has PyJWT (BuildGrid depends on it).
    let python = bgd.with_file_name("python");
    let token = must(Command::new(python).args([
        "-c",
        &format!(
            "import jwt, time; print(jwt.encode({{'exp': int(time.time()) + 3600, 'sub': 'nvlinkd'}}, '{secret}', algorithm='HS256'))"
        ),
    ]));
    crate::env::write_private(&p("token"), &token);
    // BuildGrid reads the secret from a file.
    std::fs::write(p("jwt.secret"), secret).unwrap();
    let extra = format!(
        r#"authorization:
  method: jwt
  secret: "{}"
  algorithm: hs256
  allow-localhost-requests: false
"#,
        p("jwt.secret").display()
    );
    (Secured { ca: p("ca.pem"), token_file: p("token") }, extra)
}

/// `deploy/buildgrid/buildgrid.yml` with this server's address and files.
fn deployed_config(addr: SocketAddr, dir: &Path) -> String {
    let text = std::fs::read_to_string(repo_root().join("deploy/buildgrid/buildgrid.yml")).expect("deploy/buildgrid");
    let subst = [
        ("0.0.0.0:50051", addr.to_string()),
        ("/etc/buildgrid/tls.key", dir.join("server.key").display().to_string()),
        ("/etc/buildgrid/tls.crt", dir.join("server.pem").display().to_string()),
        ("/etc/buildgrid/jwt.secret", dir.join("jwt.secret").display().to_string()),
        ("/var/lib/buildgrid/cas", dir.join("storage").display().to_string()),
    ];
    subst.iter().fold(text, |t, (from, to)| {
        assert!(t.contains(from), "deploy/buildgrid/buildgrid.yml names no {from}");
        t.replace(from, to)
    })
}

fn config_text(addr: SocketAddr, storage: &Path, tls: bool) -> String {
    let channel = if tls {
        let dir = storage.parent().expect("storage in the BuildGrid directory");
        format!(
            "    insecure-mode: false\n    credentials:\n      tls-server-key: \"{}\"\n      tls-server-cert: \"{}\"\n",
            dir.join("server.key").display(),
            dir.join("server.pem").display()
        )
    } else {
        "    insecure-mode: true\n".to_owned()
    };
    format!(
        r#"server:
  - !channel
    address: "{addr}"
{channel}storages:
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
