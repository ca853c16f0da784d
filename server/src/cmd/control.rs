//! `nvlinkd start | stop | status | stats`: talking to a running daemon.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nvlinkd_proto::v1::{
    nvlinkd_client::NvlinkdClient, CancelRequest, EventsRequest, PingReply, PingRequest, ShutdownRequest, StatsRequest,
};
use nvlinkd_proto::{paths, shared};
use tonic::transport::Channel;

/// How an error refusing the daemon behind a socket begins.
const REFUSING: &str = "refusing the daemon at";

/// The daemon at `socket`, if it is this user's (or root's), as the shim
/// holds it: the default socket only in a runtime directory of this user's
/// own (in /tmp another user may have made `nvlinkd-$UID` first), and the
/// process behind any socket checked by `SO_PEERCRED` before anything is
/// sent ([`shared::connect_unix_own`]). Another user's daemon could tell
/// `watch` what to write and `start` that one is running.
pub async fn connect(socket: &Path) -> Result<NvlinkdClient<Channel>, String> {
    let dir = paths::runtime_dir();
    if socket.parent() == Some(dir.as_path()) && std::fs::symlink_metadata(&dir).is_ok() {
        paths::private_dir(&dir).map_err(|why| {
            format!(
                "{REFUSING} {}: {why} (another user may have made it); fix: remove it, or set XDG_RUNTIME_DIR \
                 or NVLINKD_SOCKET to a directory of your own",
                socket.display()
            )
        })?;
    }
    let channel = shared::connect_unix_own(shared::unix_endpoint(), socket.to_path_buf())
        .await
        .map_err(|e| unreachable_reason(socket, &e))?;
    Ok(NvlinkdClient::new(channel))
}

/// `text` from the daemon as a terminal may show it: control characters
/// (escape sequences) escaped, line breaks and tabs kept.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Why the daemon at `socket` could not be reached, in words: tonic says only
/// "transport error"; the cause is the socket's `connect` error beneath it.
fn unreachable_reason(socket: &Path, e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = Some(e);
    while let Some(c) = cause {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                // No socket, or one no process listens on (a daemon that was killed).
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => not_running(socket),
                std::io::ErrorKind::PermissionDenied if io.get_ref().is_some() => {
                    format!("{REFUSING} {}: {io}", socket.display())
                }
                _ => format!("cannot reach the daemon at {}: {io}", socket.display()),
            };
        }
        cause = c.source();
    }
    format!("cannot reach the daemon at {}: {e}", socket.display())
}

fn not_running(socket: &Path) -> String {
    format!("no daemon is running at {} (start one with `nvlinkd start`)", socket.display())
}

pub async fn ping(socket: &Path) -> Result<PingReply, String> {
    let mut c = connect(socket).await?;
    c.ping(PingRequest {}).await.map(|r| r.into_inner()).map_err(|s| s.message().to_string())
}

/// Start a detached daemon unless one answers already; wait until it answers.
pub async fn start(socket: &Path, serve_args: Vec<String>) -> Result<String, String> {
    match ping(socket).await {
        Ok(p) => return Ok(format!("nvlinkd already running (pid {}) on {}", p.pid, socket.display())),
        // Another user's daemon there, or its directory: not ours to start beside.
        Err(e) if e.starts_with(REFUSING) => return Err(e),
        Err(_) => {}
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
    // SAFETY: the closure runs in the forked child before exec and calls only
    // setsid(2), which is async-signal-safe; it touches no memory of the parent.
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
///
/// The daemon's servers wait for open connections to close before they end
/// (up to the grace period), so ours is closed as soon as the request is
/// answered; then the process is watched until it is gone.
pub async fn stop(socket: &Path) -> Result<String, String> {
    let mut c = match connect(socket).await {
        Ok(c) => c,
        // Nothing to stop: not an error (scripts stop unconditionally), said on stderr.
        Err(e) if e == not_running(socket) => {
            eprintln!("nvlinkd: no daemon is running at {}", socket.display());
            return Ok(String::new());
        }
        Err(e) => return Err(e),
    };
    let p = c.ping(PingRequest {}).await.map_err(|s| s.message().to_string())?.into_inner();
    c.shutdown(ShutdownRequest {}).await.map_err(|s| s.message().to_string())?;
    drop(c);
    let deadline = Duration::from_secs(600);
    if tokio::time::timeout(deadline, exited(p.pid)).await.is_err() {
        return Err(format!("nvlinkd (pid {}) still running after {} s", p.pid, deadline.as_secs()));
    }
    Ok(format!("nvlinkd (pid {}) stopped", p.pid))
}

/// Wait until process `pid` has exited (a short poll: an idle daemon exits
/// within a few hundred milliseconds of the request).
async fn exited(pid: u32) {
    while pid_alive(pid) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
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
    // SAFETY: signal 0 only checks for existence.
    let exists = unsafe { libc::kill(pid as i32, 0) == 0 };
    exists && !exited_unreaped(pid)
}

/// Whether `pid` has exited and only waits for its parent to reap it: a zombie
/// whose every thread is gone. The thread-group leader turns zombie as soon as
/// it exits, while the process's other threads may still be dying (a loaded
/// machine takes a while to schedule them); until they are gone the parent's
/// wait does not see the exit, so the process still counts as running.
fn exited_unreaped(pid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return false };
    let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).map(str::trim);
    field("State:").is_some_and(|s| s.starts_with('Z')) && field("Threads:") == Some("1")
}

pub async fn status(socket: &Path) -> Result<String, String> {
    let p = ping(socket).await?;
    let head =
        format!("nvlinkd {} running (pid {})\nsocket: {}\ncache: {}", p.version, p.pid, socket.display(), p.cache_dir);
    let Ok(json) = stats_json(socket).await else { return Ok(head) };
    let v: serde_json::Value = serde_json::from_str(&json).unwrap_or_default();
    let n = |k: &str| v.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
    Ok(format!(
        "{head}\ntoolkits: {}\nup {}; {} links, {} fell back to the real nvlink",
        toolkits(&v),
        duration(n("uptime_s")),
        n("requests"),
        n("fallbacks")
    ))
}

async fn stats_json(socket: &Path) -> Result<String, String> {
    let mut c = connect(socket).await?;
    c.stats(StatsRequest {}).await.map(|r| r.into_inner().json).map_err(|s| s.message().to_string())
}

/// `nvlinkd stats`: the counters in words, or (`--json`) as one JSON object.
pub async fn stats(socket: &Path, json: bool) -> Result<String, String> {
    let raw = stats_json(socket).await?;
    if json {
        return Ok(raw);
    }
    let v: serde_json::Value = serde_json::from_str(&raw).map_err(|e| format!("unreadable stats: {e}"))?;
    Ok(stats_in_words(&v))
}

fn toolkits(v: &serde_json::Value) -> String {
    let list: Vec<&str> = v
        .get("toolkits")
        .and_then(|t| t.as_array())
        .map(|a| a.iter().filter_map(|t| t.as_str()).collect())
        .unwrap_or_default();
    if list.is_empty() {
        "none".into()
    } else {
        list.join(", ")
    }
}

fn duration(s: u64) -> String {
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, s % 3600 / 60),
    }
}

fn bytes(b: u64) -> String {
    match b {
        0..=1023 => format!("{b} B"),
        1024..=1048575 => format!("{:.1} KiB", b as f64 / 1024.0),
        1048576..=1073741823 => format!("{:.1} MiB", b as f64 / 1048576.0),
        _ => format!("{:.2} GiB", b as f64 / 1073741824.0),
    }
}

/// The counters a user asks about, in plain words (every counter: `--json`).
fn stats_in_words(v: &serde_json::Value) -> String {
    let n = |k: &str| v.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
    let by_reason = |k: &str| -> String {
        let Some(m) = v.get(k).and_then(|m| m.as_object()).filter(|m| !m.is_empty()) else { return String::new() };
        let parts: Vec<String> = m.iter().map(|(r, c)| format!("{r} {}", c.as_u64().unwrap_or(0))).collect();
        format!(" ({})", parts.join(", "))
    };
    let mut out = vec![
        format!("up {}; toolkits: {}", duration(n("uptime_s")), toolkits(v)),
        format!(
            "links: {} answered — {} from the cache, {} linked in process, {} by the real nvlink{}, {} by the front end",
            n("requests"),
            n("cache_hits"),
            n("in_process"),
            n("nvlink_process"),
            by_reason("routed"),
            n("frontend")
        ),
        format!("fell back (the shim ran nvlink itself): {}{}", n("fallbacks"), by_reason("fallback_reasons")),
        format!(
            "cancelled before their answer: {} ({} superseded by a newer link of the same output)",
            n("cancelled"),
            n("cancelled_superseded")
        ),
        format!(
            "now: {} in flight, {} queued; {} workers ({} crashed so far)",
            n("in_flight"),
            n("queued"),
            n("workers"),
            n("worker_crashes")
        ),
        format!(
            "cache: {} in memory, {} on disk; compile steps reused: {} of {}",
            bytes(n("cache_mem_bytes")),
            bytes(n("cache_disk_bytes")),
            n("jit_hits") + n("nvvm_hits") + n("ptxas_hits"),
            n("jit_hits") + n("nvvm_hits") + n("ptxas_hits") + n("jit_misses") + n("nvvm_misses") + n("ptxas_misses")
        ),
        format!(
            "checked against nvlink: {} verified, {} differed, {} pending, {} skipped",
            n("verified"),
            n("verify_mismatches"),
            n("verify_pending"),
            n("verify_skipped")
        ),
    ];
    if n("speculative_links") > 0 {
        out.push(format!(
            "speculative links: {} started, {} finished, {} used by a build",
            n("speculative_links"),
            n("speculative_finished"),
            n("speculative_hits")
        ));
    }
    let farm = [
        "remote_cache_hits",
        "remote_cache_rejected",
        "auth_failures",
        "tcp_connections_refused",
        "tcp_closed_unauthenticated",
        "remote_links_refused",
    ];
    if farm.iter().any(|c| n(c) > 0) {
        out.push(format!(
            "farm: {} shared-cache hits, {} entries rejected, {} refused tokens, {} connections refused, {} closed \
             without an authenticated call, {} remote links refused (no free slot)",
            n("remote_cache_hits"),
            n("remote_cache_rejected"),
            n("auth_failures"),
            n("tcp_connections_refused"),
            n("tcp_closed_unauthenticated"),
            n("remote_links_refused")
        ));
    }
    // Remote links per token of the listener (`name:secret` in --token-file).
    if let Some(tokens) = v.get("tokens").and_then(|t| t.as_object()) {
        for (name, t) in tokens {
            let t = |k: &str| t.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
            out.push(format!(
                "token {name}: {} remote links, {} refused, {} received, {} sent",
                t("links"),
                t("refused"),
                bytes(t("bytes_received")),
                bytes(t("bytes_sent"))
            ));
        }
    }
    out.push("(every counter: nvlinkd stats --json)".into());
    out.join("\n")
}

/// `nvlinkd events --json`: print the daemon's events, one JSON object per
/// line, flushed as each arrives, until interrupted or the daemon stops.
pub async fn events(socket: &Path, filter: EventsRequest) -> Result<String, String> {
    use std::io::Write;
    let mut c = connect(socket).await?;
    let mut stream = c.events(filter).await.map_err(|s| s.message().to_string())?.into_inner();
    let mut out = std::io::stdout().lock();
    loop {
        match stream.message().await {
            Ok(Some(ev)) => {
                // A reader that went away (`| head`) ends us quietly.
                if writeln!(out, "{}", printable(&ev.json)).and_then(|()| out.flush()).is_err() {
                    return Ok(String::new());
                }
            }
            Ok(None) => return Err("the daemon ended the event stream (stopped)".into()),
            Err(s) => return Err(format!("event stream failed: {}", s.message())),
        }
    }
}

/// `nvlinkd cancel ID`.
pub async fn cancel(socket: &Path, link: u64) -> Result<String, String> {
    let mut c = connect(socket).await?;
    let r = c.cancel(CancelRequest { link }).await.map_err(|s| s.message().to_string())?.into_inner();
    if r.cancelled {
        Ok(format!("link {link} cancelled"))
    } else {
        Err(format!("no running link {link}"))
    }
}

pub fn default_socket() -> PathBuf {
    nvlinkd_proto::paths::socket_path()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a daemon says reaches the terminal with its control characters
    /// escaped: no escape sequence of its choosing runs there.
    #[test]
    fn daemon_text_is_printed_with_control_characters_escaped() {
        let said = "nvlinkd 0.fake\x1b]0;owned\x07 running\r\nline two\tok\n";
        let shown = printable(said);
        assert!(!shown.chars().any(|c| c.is_control() && c != '\n' && c != '\t'), "{shown:?}");
        assert_eq!(shown, "nvlinkd 0.fake\\u{1b}]0;owned\\u{7} running\\r\nline two\tok\n");
    }

    /// Plain `stats` says in words what users ask about: links by engine,
    /// fallbacks and cancellations apart, and each token's remote links.
    #[test]
    fn stats_in_words_name_cancellations_and_each_token() {
        let v = serde_json::json!({
            "uptime_s": 61, "requests": 5, "cache_hits": 2, "in_process": 2, "nvlink_process": 1,
            "fallbacks": 1, "cancelled": 3, "cancelled_superseded": 1, "auth_failures": 1,
            "tokens": {"ci": {"links": 2, "refused": 1, "bytes_received": 2048, "bytes_sent": 40}},
        });
        let words = stats_in_words(&v);
        assert!(words.contains("up 1 min 1 s"), "{words}");
        assert!(words.contains("fell back (the shim ran nvlink itself): 1"), "{words}");
        assert!(words.contains("cancelled before their answer: 3 (1 superseded"), "{words}");
        assert!(words.contains("token ci: 2 remote links, 1 refused, 2.0 KiB received, 40 B sent"), "{words}");
    }
}
