//! The remote path for tests: certificates and tokens made with rcgen, and a
//! daemon serving `--listen` over TLS with tokens, optionally as `nobody` (so
//! that it cannot read the caller's files and must get them from the shim).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nvlinkd_proto::paths;

use crate::env::{cuda_home, nvlinkd, real_nvlink, TempDir};

/// The token the shims of the tests present.
pub const TOKEN: &str = "s3cret-token-for-tests";
/// The token file's other token (`other-client-token`): another caller.
pub const OTHER_TOKEN: &str = "other-token-for-tests";

/// A CA, a server certificate it signed for 127.0.0.1 and localhost (or the
/// names given), a client certificate it signed (`client.pem`,
/// `client-key.pem`, for mTLS), and a token file of two tokens with a file
/// for each shim (`client-token`: [`TOKEN`], `other-client-token`:
/// [`OTHER_TOKEN`]), in a fresh directory.
pub struct Pki {
    pub dir: TempDir,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl Pki {
    pub fn new() -> Pki {
        Self::for_hosts(&["127.0.0.1", "localhost"])
    }

    /// The same, with a server certificate for these names and addresses.
    pub fn for_hosts(hosts: &[&str]) -> Pki {
        let dir = TempDir::new("pki");
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(rcgen::DnType::CommonName, "nvlinkd test CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let pki = Pki { dir, issuer: rcgen::Issuer::new(ca_params, ca_key) };
        std::fs::write(pki.dir.path().join("ca.pem"), ca.pem()).unwrap();
        pki.issue(hosts, "cert.pem", "key.pem");
        // A build machine's certificate (clientAuth), for daemons with --client-ca.
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["build-machine".to_string()]).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, "build-machine");
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &pki.issuer).unwrap();
        std::fs::write(pki.dir.path().join("client.pem"), cert.pem()).unwrap();
        std::fs::write(pki.dir.path().join("client-key.pem"), key.serialize_pem()).unwrap();
        pki.replace("tokens", format!("# farm tokens\n\n{OTHER_TOKEN}\n{TOKEN}\n").as_bytes());
        crate::env::write_private(&pki.dir.path().join("client-token"), format!("{TOKEN}\n").as_bytes());
        crate::env::write_private(&pki.dir.path().join("other-client-token"), format!("{OTHER_TOKEN}\n").as_bytes());
        pki
    }

    /// A new server certificate for `hosts` and its new key, signed by the
    /// same CA, written to `cert` and `key` in the directory (each replaced
    /// at once, by a rename, as a certificate manager does).
    pub fn issue(&self, hosts: &[&str], cert: &str, key: &str) {
        let pair = rcgen::KeyPair::generate().unwrap();
        let signed = rcgen::CertificateParams::new(hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>())
            .unwrap()
            .signed_by(&pair, &self.issuer)
            .unwrap();
        self.replace(cert, signed.pem().as_bytes());
        self.replace(key, pair.serialize_pem().as_bytes());
    }

    /// Replace file `name` of the directory with `contents`, by a rename;
    /// the new file is for this user alone (mode 0600: the daemon refuses a
    /// token file others can read).
    pub fn replace(&self, name: &str, contents: &[u8]) {
        use std::os::unix::fs::PermissionsExt;
        let tmp = self.dir.path().join(format!(".{name}.new"));
        std::fs::write(&tmp, contents).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::rename(&tmp, self.dir.path().join(name)).unwrap();
    }

    pub fn file(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    /// The shim's environment for the daemons at `addr` (`NVLINKD_ADDR`).
    pub fn shim_env(&self, addr: &str, fallback: &str) -> Vec<(String, String)> {
        vec![
            (paths::ENV_ADDR.into(), addr.into()),
            (paths::ENV_TLS_CA.into(), self.file("ca.pem")),
            (paths::ENV_TOKEN_FILE.into(), self.file("client-token")),
            (paths::ENV_FALLBACK.into(), fallback.into()),
            (paths::ENV_REAL_NVLINK.into(), real_nvlink().display().to_string()),
        ]
    }
}

impl Default for Pki {
    fn default() -> Self {
        Self::new()
    }
}

/// A daemon serving `--listen` on 127.0.0.1 with TLS and tokens (and `extra`
/// serve options); it and its port.
pub fn tls_daemon(pki: &Pki, extra: &[&str]) -> (crate::daemon::Daemon, u16) {
    tls_daemon_env(pki, extra, &[])
}

/// [`tls_daemon`] with environment variables for the daemon (test hooks).
pub fn tls_daemon_env(pki: &Pki, extra: &[&str], env: &[(&str, &str)]) -> (crate::daemon::Daemon, u16) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let (cert, key, tokens) = (pki.file("cert.pem"), pki.file("key.pem"), pki.file("tokens"));
    let mut args = vec!["--listen", &listen, "--tls-cert", &cert, "--tls-key", &key, "--token-file", &tokens];
    args.extend(extra);
    (crate::daemon::Daemon::start_env(&args, env), port)
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A daemon serving TLS and tokens on 127.0.0.1 as `nobody`, killed on drop.
pub struct NobodyDaemon {
    child: Child,
    pub port: u16,
    _dir: TempDir,
}

impl NobodyDaemon {
    /// None (with the reason printed) where the machine cannot run it: not
    /// root, no `setpriv`, or files `nobody` cannot reach.
    pub fn start(pki: &Pki) -> Option<NobodyDaemon> {
        use std::os::unix::fs::PermissionsExt;
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root to run the daemon as nobody");
            return None;
        }
        let dir = TempDir::new("nobody-d");
        // Sticky, as /tmp: the daemon accepts a shared socket directory only so.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        std::fs::set_permissions(pki.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(pki.file("cert.pem"), std::fs::Permissions::from_mode(0o644)).unwrap();
        // The key and the token file must be the daemon's user's alone.
        const NOBODY: u32 = 65534;
        for f in ["key.pem", "tokens"] {
            if let Err(e) = std::os::unix::fs::chown(pki.file(f), Some(NOBODY), None) {
                eprintln!("skipped: cannot give {f} to nobody ({e})");
                return None;
            }
        }
        let port = free_port();
        let spawned = Command::new("setpriv")
            .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
            .arg(nvlinkd())
            .args(["serve", "--socket"])
            .arg(dir.path().join("sock"))
            .arg("--cache-dir")
            .arg(dir.path().join("cache"))
            .arg("--cuda-home")
            .arg(cuda_home())
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--tls-cert", &pki.file("cert.pem"), "--tls-key", &pki.file("key.pem")])
            .args(["--token-file", &pki.file("tokens")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                eprintln!("skipped: cannot run setpriv ({e})");
                return None;
            }
        };
        let up = (0..600).any(|_| {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        if !up {
            let _ = child.kill();
            let _ = child.wait();
            eprintln!("skipped: nvlinkd did not start as nobody (binaries or toolkit not reachable by it)");
            return None;
        }
        Some(NobodyDaemon { child, port, _dir: dir })
    }

    /// Its counters, read over its unix socket as its own user (`nvlinkd`
    /// talks only to a daemon of its own user or root).
    pub fn stats(&self) -> serde_json::Value {
        let out = Command::new("setpriv")
            .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
            .arg(nvlinkd())
            .args(["stats", "--json", "--socket"])
            .arg(self._dir.path().join("sock"))
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("stats: {e}: {out:?}"))
    }

    /// Its unix socket (in a sticky directory others may write).
    pub fn socket(&self) -> std::path::PathBuf {
        self._dir.path().join("sock")
    }

    /// Its cache directory (the sandboxes of its links go under `tmp/`).
    pub fn cache_dir(&self) -> std::path::PathBuf {
        self._dir.path().join("cache")
    }

    pub fn addr(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }
}

impl Drop for NobodyDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A copy of `src` (recursively) in a fresh directory of mode 0700: only this
/// user (root in the tests) can read it.
pub fn private_copy(src: &Path, tag: &str) -> TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new(tag);
    let status = Command::new("cp").arg("-a").arg(format!("{}/.", src.display())).arg(dir.path()).status().unwrap();
    assert!(status.success(), "cp -a {} failed", src.display());
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}
