//! A private nvlinkd for a test: its own socket and cache, stopped on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nvlinkd_proto::paths;

use crate::env::{cuda_home, nvlinkd, TempDir};

pub struct Daemon {
    pub dir: TempDir,
    pub child: Option<Child>,
    /// Environment given to the daemon process.
    pub env: Vec<(String, String)>,
    /// Another daemon's cache directory, when sharing one.
    pub shared_cache: Option<PathBuf>,
    /// Address-space limit of the daemon process (RLIMIT_AS), for tests whose
    /// failure mode is unbounded memory: it then dies instead of taking the machine.
    pub memory_limit: Option<u64>,
    /// Open-file limit of the daemon process (RLIMIT_NOFILE, soft and hard).
    pub file_limit: Option<u64>,
}

impl Daemon {
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("sock")
    }
    pub fn cache_dir(&self) -> PathBuf {
        self.shared_cache.clone().unwrap_or_else(|| self.dir.path().join("cache"))
    }

    /// A second daemon on its own socket over `other`'s cache directory.
    pub fn start_sharing(other: &Daemon) -> Daemon {
        Self::start_sharing_with(other, &[])
    }

    /// [`Daemon::start_sharing`] with more `serve` options.
    pub fn start_sharing_with(other: &Daemon, extra: &[&str]) -> Daemon {
        let mut d = Daemon {
            dir: TempDir::new("d"),
            child: None,
            env: Vec::new(),
            shared_cache: Some(other.cache_dir()),
            memory_limit: None,
            file_limit: None,
        };
        d.spawn(extra);
        d
    }

    /// Start `nvlinkd serve` and wait until it answers.
    pub fn start() -> Daemon {
        Self::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Daemon {
        Self::start_env(extra, &[])
    }

    /// Start with extra `serve` arguments and environment variables.
    pub fn start_env(extra: &[&str], env: &[(&str, &str)]) -> Daemon {
        let dir = TempDir::new("d");
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mut d = Daemon { dir, child: None, env, shared_cache: None, memory_limit: None, file_limit: None };
        d.spawn(extra);
        d
    }

    /// Start with extra `serve` arguments and an address-space limit.
    pub fn start_limited(extra: &[&str], memory_limit: u64) -> Daemon {
        let mut d = Daemon {
            dir: TempDir::new("d"),
            child: None,
            env: Vec::new(),
            shared_cache: None,
            memory_limit: Some(memory_limit),
            file_limit: None,
        };
        d.spawn(extra);
        d
    }

    /// Start with extra `serve` arguments and an open-file limit (soft and hard).
    pub fn start_with_file_limit(extra: &[&str], files: u64) -> Daemon {
        let mut d = Daemon {
            dir: TempDir::new("d"),
            child: None,
            env: Vec::new(),
            shared_cache: None,
            memory_limit: None,
            file_limit: Some(files),
        };
        d.spawn(extra);
        d
    }

    /// The daemon's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// (Re)start the daemon process on the same socket and cache.
    pub fn spawn(&mut self, extra: &[&str]) {
        seed_toolkit_memo(&self.cache_dir());
        let mut cmd = Command::new(nvlinkd());
        if self.memory_limit.is_some() || self.file_limit.is_some() {
            use std::os::unix::process::CommandExt;
            let (memory, files) = (self.memory_limit, self.file_limit);
            // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    if let Some(limit) = memory {
                        let l = libc::rlimit { rlim_cur: limit, rlim_max: limit };
                        libc::setrlimit(libc::RLIMIT_AS, &l);
                    }
                    if let Some(limit) = files {
                        let l = libc::rlimit { rlim_cur: limit, rlim_max: limit };
                        libc::setrlimit(libc::RLIMIT_NOFILE, &l);
                    }
                    Ok(())
                });
            }
        }
        let child = cmd
            .arg("serve")
            .arg("--socket")
            .arg(self.socket())
            .arg("--cache-dir")
            .arg(self.cache_dir())
            // The test's toolkit unless the test names its own.
            .args(if extra.contains(&"--cuda-home") {
                vec![]
            } else {
                vec![std::ffi::OsStr::new("--cuda-home"), cuda_home().as_os_str()]
            })
            // Verification (serve's default: background) runs the real nvlink
            // beside every new link: only where a test asks for it (parity
            // runs `--verify=sync`, verify.rs each mode), so that the other
            // tests' timings, page faults and cache contents stay their own.
            .args(if extra.iter().any(|a| a.starts_with("--verify")) { &[][..] } else { &["--verify=off"][..] })
            .args(extra)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nvlinkd serve");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.answers() {
            assert!(Instant::now() < deadline, "nvlinkd did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn answers(&self) -> bool {
        self.control("status").map(|(ok, _)| ok).unwrap_or(false)
    }

    /// Run `nvlinkd <cmd> --socket <ours>`: (success, stdout).
    pub fn control(&self, cmd: &str) -> Option<(bool, String)> {
        let mut c = Command::new(nvlinkd());
        c.arg(cmd).arg("--socket").arg(self.socket());
        if cmd == "stats" {
            c.arg("--json");
        }
        let out = c.output().ok()?;
        Some((out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned()))
    }

    /// `nvlinkd stats --json`, parsed.
    pub fn stats(&self) -> serde_json::Value {
        let (ok, json) = self.control("stats").expect("stats");
        assert!(ok, "nvlinkd stats failed: {json}");
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("stats are not JSON ({e}): {json}"))
    }

    /// A counter from `nvlinkd stats --json`.
    pub fn stat(&self, name: &str) -> u64 {
        let stats = self.stats();
        stats[name].as_u64().unwrap_or_else(|| panic!("no integer {name} in {stats}"))
    }

    /// Wait until the counter `name` reaches at least `n` (a link is in
    /// flight, a store happened...), polling the stats; fails the test if it
    /// has not after a minute.
    pub fn wait_stat(&self, name: &str, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.stat(name) < n {
            assert!(Instant::now() < deadline, "{name} never reached {n}: {}", self.stats());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A counter, 0 when the daemon does not answer (for polling loops).
    pub fn stat_or_zero(&self, name: &str) -> u64 {
        match self.control("stats") {
            Some((true, json)) => {
                serde_json::from_str::<serde_json::Value>(&json).ok().and_then(|v| v[name].as_u64()).unwrap_or(0)
            }
            _ => 0,
        }
    }

    /// A count of one of the per-reason objects of `nvlinkd stats --json`
    /// (`routed`, `fallback_reasons`; reasons as in `nvlinkd_core::declined`),
    /// 0 when the reason was never counted.
    pub fn reason_count(&self, object: &str, reason: &str) -> u64 {
        let stats = self.stats();
        let counts = stats[object].as_object().unwrap_or_else(|| panic!("no object {object} in {stats}"));
        counts.get(reason).map_or(0, |v| v.as_u64().unwrap_or_else(|| panic!("{object}.{reason} is not an integer")))
    }

    /// Environment for the shim to use this daemon and never fall back.
    pub fn shim_env(&self) -> Vec<(String, String)> {
        vec![
            (paths::ENV_SOCKET.into(), self.socket().display().to_string()),
            (paths::ENV_FALLBACK.into(), "never".into()),
            ("CUDA_HOME".into(), cuda_home().display().to_string()),
        ]
    }

    /// The shim's environment with fallback allowed: when the daemon declines,
    /// the shim runs the real nvlink itself (and starts no daemon of its own).
    pub fn fallback_env(&self) -> Vec<(String, String)> {
        vec![
            (paths::ENV_SOCKET.into(), self.socket().display().to_string()),
            (paths::ENV_FALLBACK.into(), "auto".into()),
            (paths::ENV_REAL_NVLINK.into(), crate::env::real_nvlink().display().to_string()),
            ("CUDA_HOME".into(), cuda_home().display().to_string()),
            (paths::ENV_DAEMON_BIN.into(), "/nonexistent/nvlinkd".into()),
        ]
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.cache_dir().join("nvlinkd.log")).unwrap_or_default()
    }

    /// Wait until the log holds at least `n` lines containing `what` (lines
    /// reach the file through the daemon's log thread); fails the test after
    /// a minute. Returns those lines.
    pub fn wait_log(&self, what: &str, n: usize) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let lines: Vec<String> = self.log().lines().filter(|l| l.contains(what)).map(String::from).collect();
            if lines.len() >= n {
                return lines;
            }
            assert!(Instant::now() < deadline, "never {n} log lines with {what:?}:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Send `signal` (e.g. `libc::SIGHUP`) to the daemon process.
    pub fn signal(&self, signal: i32) {
        let pid = self.pid().expect("the daemon runs") as i32;
        // SAFETY: signalling our own child.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "kill({pid}, {signal})");
    }

    /// Whether the daemon process is still there (not exited).
    pub fn running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Kill the process without warning.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait (a daemon still there after a minute is killed, so that
    /// a test that found it stuck fails instead of hanging).
    pub fn stop(&mut self) {
        keep_toolkit_memo(&self.cache_dir());
        if let Some(mut c) = self.child.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(60);
            while matches!(c.try_wait(), Ok(None)) {
                if Instant::now() > deadline {
                    let _ = c.kill();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.wait();
        }
    }
}

/// Toolkit identities that this test run's daemons computed (`toolkit.rs`
/// hashes a toolkit's files once per cache directory, ~0.5 s of a debug
/// build): a fresh daemon's cache directory starts with them, as a
/// restarted daemon's would.
fn toolkit_memo() -> PathBuf {
    crate::env::bin_dir().join("nvlinkd-toolkit-memo")
}

fn seed_toolkit_memo(cache: &std::path::Path) {
    use std::os::unix::fs::DirBuilderExt;
    if cache.exists() {
        return;
    }
    let Ok(memos) = std::fs::read_dir(toolkit_memo()) else { return };
    if std::fs::DirBuilder::new().recursive(true).mode(0o700).create(cache.join("toolkits")).is_err() {
        return;
    }
    for m in memos.flatten().filter(|m| !m.file_name().to_string_lossy().starts_with('.')) {
        let _ = std::fs::copy(m.path(), cache.join("toolkits").join(m.file_name()));
    }
}

fn keep_toolkit_memo(cache: &std::path::Path) {
    let Ok(memos) = std::fs::read_dir(cache.join("toolkits")) else { return };
    let shared = toolkit_memo();
    let _ = std::fs::create_dir_all(&shared);
    for m in memos.flatten().filter(|m| !m.file_name().to_string_lossy().starts_with('.')) {
        let to = shared.join(m.file_name());
        if !to.exists() {
            static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let tmp = shared.join(format!(".tmp-{}-{n}", std::process::id()));
            if std::fs::copy(m.path(), &tmp).is_ok() {
                let _ = std::fs::rename(&tmp, &to);
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Field `n` of `/proc/<pid>/stat`, numbered as in proc(5) (3: state, 10:
/// minor faults, 19: nice, 41: scheduling policy), read after the command
/// name, which may hold spaces and parentheses. None once the process is gone.
pub fn proc_stat_field(pid: u32, n: usize) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // What follows the name starts at field 3.
    stat.rsplit_once(')')?.1.split_whitespace().nth(n.checked_sub(3)?).map(str::to_string)
}

/// Clock ticks of CPU (user and system, proc(5) fields 14 and 15) process
/// `pid` uses over the next `span`.
pub fn cpu_ticks_over(pid: u32, span: Duration) -> u64 {
    let cpu = || -> u64 {
        let field = |n| proc_stat_field(pid, n).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        field(14) + field(15)
    };
    let before = cpu();
    std::thread::sleep(span);
    cpu().saturating_sub(before)
}

/// The daemon's counters that each say one engine served a link, with the
/// engine's name in the table.
pub const ENGINE_COUNTERS: &[(&str, &str)] = &[
    ("in_process", "in-process"),
    ("nvlink_process", "nvlink engine"),
    ("cache_hits", "cache"),
    ("frontend", "frontend"),
    ("fallbacks", "fallback"),
];

/// The engine that served the one link run between two reads of a daemon's
/// `stats --json` (nothing else ran on that daemon meanwhile): the counters of
/// [`ENGINE_COUNTERS`] that grew, "?" if none did.
pub fn engine_between(before: &serde_json::Value, after: &serde_json::Value) -> String {
    let grew: Vec<&str> = ENGINE_COUNTERS
        .iter()
        .filter(|(counter, _)| after[counter].as_u64() > before[counter].as_u64())
        .map(|(_, engine)| *engine)
        .collect();
    if grew.is_empty() {
        "?".into()
    } else {
        grew.join("+")
    }
}
