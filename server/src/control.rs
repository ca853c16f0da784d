//! `nvlinkd start | stop | status | stats`: talking to a running daemon.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use nvlinkd_proto::v1::{nvlinkd_client::NvlinkdClient, PingReply, PingRequest, ShutdownRequest, StatsRequest};
use tonic::transport::{Channel, Endpoint, Uri};

pub async fn connect(socket: &Path) -> Result<NvlinkdClient<Channel>, String> {
    let path = socket.to_path_buf();
    let channel = Endpoint::from_static("http://nvlinkd.local")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?)) }
        }))
        .await
        .map_err(|e| format!("no daemon at {}: {e}", socket.display()))?;
    Ok(NvlinkdClient::new(channel))
}

pub async fn ping(socket: &Path) -> Result<PingReply, String> {
    let mut c = connect(socket).await?;
    c.ping(PingRequest {}).await.map(|r| r.into_inner()).map_err(|s| s.message().to_string())
}

/// Start a detached daemon unless one answers already; wait until it answers.
pub async fn start(socket: &Path, serve_args: Vec<String>) -> Result<String, String> {
    if let Ok(p) = ping(socket).await {
        return Ok(format!("nvlinkd already running (pid {}) on {}", p.pid, socket.display()));
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("serve").args(&serve_args);
    // The daemon's stderr goes to a memory file: why it could not start (a socket
    // path it refuses, say) is read back from it; a running daemon logs to its file.
    let errors = memfd();
    let stderr = errors
        .as_ref()
        .and_then(|f| f.try_clone().ok())
        .map(std::process::Stdio::from)
        .unwrap_or_else(std::process::Stdio::null);
    cmd.stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(stderr);
    // Detach: own session, so the daemon outlives the shell or build that started it.
    use std::os::unix::process::CommandExt;
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| format!("cannot spawn nvlinkd serve: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(p) = ping(socket).await {
            return Ok(format!("nvlinkd started (pid {}) on {}", p.pid, socket.display()));
        }
        if let Ok(Some(status)) = child.try_wait() {
            // Lost a race with another starter? Then its daemon answers.
            if let Ok(p) = ping(socket).await {
                return Ok(format!("nvlinkd already running (pid {}) on {}", p.pid, socket.display()));
            }
            let said = errors.map(read_back).unwrap_or_default();
            let said = said.trim().strip_prefix("nvlinkd: ").unwrap_or(said.trim()).to_string();
            if !said.is_empty() {
                return Err(said);
            }
            return Err(format!("nvlinkd serve exited early ({status}); see its log in the cache directory"));
        }
        if Instant::now() > deadline {
            return Err("nvlinkd did not answer within 20 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Ask the daemon to finish in-flight links and exit; wait until it is gone.
pub async fn stop(socket: &Path) -> Result<String, String> {
    let Ok(p) = ping(socket).await else {
        return Ok(format!("nvlinkd not running on {}", socket.display()));
    };
    let mut c = connect(socket).await?;
    c.shutdown(ShutdownRequest {}).await.map_err(|s| s.message().to_string())?;
    let deadline = Instant::now() + Duration::from_secs(600);
    while pid_alive(p.pid) {
        if Instant::now() > deadline {
            return Err(format!("nvlinkd (pid {}) still running", p.pid));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(format!("nvlinkd (pid {}) stopped", p.pid))
}

/// An anonymous in-memory file.
fn memfd() -> Option<std::fs::File> {
    use std::os::fd::FromRawFd;
    // SAFETY: a valid NUL-terminated name; the returned descriptor is ours alone.
    let fd = unsafe { libc::memfd_create(c"nvlinkd-start".as_ptr(), libc::MFD_CLOEXEC) };
    // SAFETY: a fresh descriptor owned by nobody else.
    (fd >= 0).then(|| unsafe { std::fs::File::from_raw_fd(fd) })
}

fn read_back(mut f: std::fs::File) -> String {
    use std::io::{Read, Seek};
    let mut s = String::new();
    let _ = f.rewind().and_then(|_| f.take(64 << 10).read_to_string(&mut s));
    s
}

fn pid_alive(pid: u32) -> bool {
    // An exited process its parent has not reaped yet is gone for us.
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| s.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')))
        .unwrap_or(false);
    // SAFETY: signal 0 only checks for existence.
    !zombie && unsafe { libc::kill(pid as i32, 0) == 0 }
}

pub async fn status(socket: &Path) -> Result<String, String> {
    let p = ping(socket).await?;
    Ok(format!("nvlinkd {} running (pid {})\nsocket: {}\ncache: {}", p.version, p.pid, socket.display(), p.cache_dir))
}

pub async fn stats(socket: &Path) -> Result<String, String> {
    let mut c = connect(socket).await?;
    c.stats(StatsRequest {}).await.map(|r| r.into_inner().json).map_err(|s| s.message().to_string())
}

pub fn default_socket() -> PathBuf {
    nvlinkd_proto::paths::socket_path()
}
