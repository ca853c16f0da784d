//! Where the shim and the daemon meet by default, and the environment variables
//! that change it. Shared by both binaries so they always agree.

use std::path::PathBuf;

/// Unix socket of the daemon.
pub const ENV_SOCKET: &str = "NVLINKD_SOCKET";
/// `HOST:PORT` of a remote daemon (takes precedence over the socket).
pub const ENV_ADDR: &str = "NVLINKD_ADDR";
/// The real nvlink, for fallback.
pub const ENV_REAL_NVLINK: &str = "NVLINKD_REAL_NVLINK";
/// `auto` (default): fall back to the real nvlink when no daemon answers;
/// `never`: fail instead.
pub const ENV_FALLBACK: &str = "NVLINKD_FALLBACK";
/// Cache directory of an auto-started daemon.
pub const ENV_CACHE_DIR: &str = "NVLINKD_CACHE_DIR";
/// The nvlinkd binary the shim starts when no daemon answers.
pub const ENV_DAEMON_BIN: &str = "NVLINKD_BIN";
/// Idle time after which a daemon the shim starts exits (`nvlinkd serve --idle-exit`).
pub const ENV_IDLE_EXIT: &str = "NVLINKD_IDLE_EXIT";
/// File written by `nvlinkd install` next to the shim, recording the toolkit.
pub const OVERLAY_RECORD: &str = "nvlinkd-overlay.env";
/// Directory beside the shim (`<toolkit>/bin/.nvlinkd`) where `nvlinkd install
/// --in-place` keeps the toolkit's real nvlink, the daemon and the record.
pub const IN_PLACE_DIR: &str = ".nvlinkd";

fn uid() -> u32 {
    // SAFETY: getuid cannot fail.
    unsafe { libc_getuid() }
}

extern "C" {
    #[link_name = "getuid"]
    fn libc_getuid() -> u32;
}

/// The per-user runtime directory: `$XDG_RUNTIME_DIR/nvlinkd` or `/tmp/nvlinkd-$UID`.
pub fn runtime_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("nvlinkd"),
        _ => PathBuf::from(format!("/tmp/nvlinkd-{}", uid())),
    }
}

/// The socket path: `$NVLINKD_SOCKET`, else `<runtime dir>/nvlinkd.sock`.
pub fn socket_path() -> PathBuf {
    match std::env::var_os(ENV_SOCKET) {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => runtime_dir().join("nvlinkd.sock"),
    }
}

/// The default cache directory: `$NVLINKD_CACHE_DIR`, `$XDG_CACHE_HOME/nvlinkd`
/// or `~/.cache/nvlinkd`.
pub fn cache_dir() -> PathBuf {
    if let Some(p) = std::env::var_os(ENV_CACHE_DIR).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    if let Some(p) = std::env::var_os("XDG_CACHE_HOME").filter(|p| !p.is_empty()) {
        return PathBuf::from(p).join("nvlinkd");
    }
    match std::env::var_os("HOME").filter(|p| !p.is_empty()) {
        Some(h) => PathBuf::from(h).join(".cache/nvlinkd"),
        None => runtime_dir().join("cache"),
    }
}
