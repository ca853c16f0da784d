//! `nvlinkd`: the device-link daemon and its control commands.

//!
//! Layout: `daemon` wires `serve` together; `net` is the trust boundary's
//! edge (listeners, tokens, connection limits); `link` serves one link per
//! stream; `speculate` links ahead (other archs, `--watch`); `reapi` is the
//! shared cache tier; `blobs` holds remote shims' inputs; `observe` is the
//! event stream and `/metrics`; `cmd` the subcommands besides `serve`.

mod blobs;
mod cmd;
mod daemon;
mod link;
mod net;
mod observe;
mod reapi;
mod speculate;
mod toolkit;

use cmd::{control, exec, install};
use link::service;
use observe::events;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, CommandFactory, Parser, Subcommand};
use nvlinkd_core::LinkerConfig;

#[derive(Parser)]
#[command(name = "nvlinkd", version, about = "CUDA device-link daemon behind the nvlink shim")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Clone)]
struct ServeArgs {
    /// Options from a TOML file: keys are these long options without their
    /// dashes (`cache-dir = "/var/cache/nvlinkd"`, `cuda-home = [...]`,
    /// `watch = true`); options given here override the file's
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Unix socket to listen on [default: $NVLINKD_SOCKET or the per-user runtime dir]
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Cache directory (and log file) [default: $NVLINKD_CACHE_DIR or ~/.cache/nvlinkd]
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Also serve remote shims on HOST:PORT (needs --tls-cert, --tls-key and
    /// --token-file or --client-ca, or --insecure)
    #[arg(long)]
    listen: Option<String>,
    /// TLS certificate chain (PEM) of the --listen port
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// TLS private key (PEM) of the --listen port
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Bearer tokens remote shims must present: one per line, `name:secret` (a bare
    /// secret is named `token-N` after its line), `#` comments; names label the audit
    /// lines and per-token figures
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// CA (PEM) whose client certificates the --listen port requires (mTLS)
    #[arg(long)]
    client_ca: Option<PathBuf>,
    /// Serve --listen without TLS or without authentication (behind a
    /// TLS-terminating, authenticating proxy only)
    #[arg(long)]
    insecure: bool,
    /// A toolkit this daemon links with (repeatable, one per installed
    /// release; the first serves requests that name none) [default: this overlay's
    /// toolkit, else $CUDA_HOME, else the toolkit of the nvlink on PATH, else
    /// /usr/local/cuda; with none, the daemon does not start]
    #[arg(long)]
    cuda_home: Vec<PathBuf>,
    /// Links and compile steps that run at once (and nvJitLink worker processes) [default: number of CPUs]
    #[arg(long)]
    jobs: Option<usize>,
    /// Bytes of cached results kept in memory
    #[arg(long, default_value_t = 512 << 20, value_parser = parse_size)]
    cache_mem: u64,
    /// Bytes of cached results kept on disk
    #[arg(long, default_value_t = 10 << 30, value_parser = parse_size)]
    cache_size: u64,
    /// Bytes of heap the daemon touches at start and keeps, so that its first
    /// links reuse memory instead of faulting new pages in (0: glibc's defaults)
    #[arg(long, default_value_t = nvlinkd_core::heap::DAEMON_RESERVE, value_parser = parse_size)]
    heap_reserve: u64,
    /// Bytes of remote shims' input files (blobs, by digest) kept in memory
    #[arg(long, default_value_t = 512 << 20, value_parser = parse_size)]
    blob_mem: u64,
    /// Bytes of remote shims' input files (blobs, by digest) kept on disk
    #[arg(long, default_value_t = 10 << 30, value_parser = parse_size)]
    blob_size: u64,
    /// Address-space limit of each nvJitLink worker process, bytes (0: none)
    #[arg(long, default_value_t = 64 << 30, value_parser = parse_size)]
    worker_mem: u64,
    /// Seconds one nvJitLink request may take before its worker is killed
    #[arg(long, default_value_t = 1800)]
    worker_timeout: u64,
    /// Exit after this long without a link (e.g. 30s, 15m, 2h; 0 or never: stay)
    /// [default: never; a daemon the shim starts gets 2h, or $NVLINKD_IDLE_EXIT]
    #[arg(long, value_parser = parse_duration)]
    idle_exit: Option<Duration>,
    /// How long to wait for the shim (its first message, each file it is asked
    /// for) before its link counts as abandoned
    #[arg(long, value_parser = parse_duration, default_value = "60s")]
    reply_timeout: Duration,
    /// Most input bytes one link may read; larger links are left to the real nvlink
    #[arg(long, default_value_t = 8 << 30, value_parser = parse_size)]
    max_link_input: u64,
    /// Most bytes of remote shims' file replies the daemon holds at once, all
    /// links together (pieces being gathered, files links read by path); a
    /// link whose reply does not fit is left to the real nvlink
    #[arg(long, default_value_t = 1 << 30, value_parser = parse_size)]
    max_reply_memory: u64,
    /// On stop, how long links still computing may finish before they are abandoned
    /// (their shims then run the real nvlink)
    #[arg(long, value_parser = parse_duration, default_value = "500ms")]
    shutdown_grace: Duration,
    /// Shared cache tier on a Remote Execution API server (BuildGrid, bazel-remote,
    /// Buildbarn, ...): grpc://HOST:PORT or grpcs://HOST:PORT
    #[arg(long)]
    remote_cache: Option<String>,
    /// REAPI instance name of the shared cache
    #[arg(long, default_value = "")]
    remote_instance: String,
    /// File holding the bearer token sent to the shared cache (`authorization: Bearer`)
    #[arg(long)]
    remote_token_file: Option<PathBuf>,
    /// PEM CA certificate(s) the grpcs:// shared cache is checked against [default: system roots]
    #[arg(long)]
    remote_ca: Option<PathBuf>,
    /// File of the fleet's key (secret bytes, e.g. 32 random): entries written to the
    /// shared cache are authenticated with it, and entries it does not authenticate
    /// are misses (`remote_cache_rejected`). Every daemon sharing a cache needs the same file
    #[arg(long)]
    remote_cache_key: Option<PathBuf>,
    /// Deadline of each shared-cache call (a lookup as a whole, too); after
    /// repeated failures the tier is skipped for 30s
    #[arg(long, value_parser = parse_duration, default_value = "2s")]
    remote_timeout: Duration,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics (no authentication:
    /// bind an internal address)
    #[arg(long)]
    metrics_listen: Option<String>,
    /// Do not link the other archs of a multi-arch nvcc step ahead of its calls
    #[arg(long)]
    no_speculate: bool,
    /// Remember recent links and relink them in the background when one of
    /// their input files changes (the next identical link is a cache hit)
    #[arg(long)]
    watch: bool,
    /// Most speculative links computing at once [default: --jobs, or the number of CPUs]
    #[arg(long)]
    max_speculative: Option<usize>,
    /// Most TCP connections at once (the listener's; also at most half the open-file
    /// limit), a quarter of them from one address; more are closed at once. The unix
    /// socket takes as many (at most a quarter of the limit), a few from another user
    #[arg(long, default_value_t = 512)]
    max_connections: usize,
    /// Most remote links at once (a token or client certificate at most half of
    /// them, where there are several); a link over it waits for one to end
    /// (--reply-timeout, at most 10s), then is refused and runs elsewhere
    /// [default: 4 x --jobs]
    #[arg(long)]
    max_remote_links: Option<usize>,
    /// Check every link computed in process against the real nvlink, once per
    /// content key: `background` (after answering, at idle priority), `sync`
    /// (before answering; a difference answers nvlink's result) or `off`
    #[arg(long, default_value = "background", value_parser = parse_verify)]
    verify: nvlinkd_core::verify::VerifyMode,
    /// Confine the real nvlink run for remote links and verification, ptxas and
    /// the nvJitLink/NVVM workers (Landlock and seccomp): `auto` (as far as the
    /// kernel allows), `require` (refuse to start without Landlock) or `off`
    #[arg(long, default_value = "auto")]
    confine: nvlinkd_core::confine::Mode,
    /// Run confined processes as this unprivileged user (a daemon running as root)
    #[arg(long, value_name = "USER")]
    sandbox_user: Option<String>,
    /// Log lines as `text` or `json` (one object per line, for log pipelines)
    #[arg(long, value_enum, default_value_t = daemon::LogFormat::Text)]
    log_format: daemon::LogFormat,
    /// Detached by `nvlinkd start`: log to the log file only, not to stderr
    #[arg(long, hide = true)]
    detached: bool,
}

impl ServeArgs {
    /// The confinement policy, checked against this host.
    fn confinement(&self) -> Result<nvlinkd_core::confine::Policy, String> {
        let user = self.sandbox_user.as_deref().map(nvlinkd_core::confine::SandboxUser::lookup).transpose()?;
        let exe = std::env::current_exe().ok();
        let policy = nvlinkd_core::confine::Policy { mode: self.confine, user, exe };
        let summary = policy.check()?;
        tracing::info!("{summary}");
        Ok(policy)
    }
}

fn parse_verify(s: &str) -> Result<nvlinkd_core::verify::VerifyMode, String> {
    s.parse()
}

/// A size in bytes: a plain number, or with a unit — `K`, `M`, `G`, `T` and
/// `KiB`, `MiB`, `GiB`, `TiB` (powers of 1024), `KB`, `MB`, `GB`, `TB`
/// (powers of 1000), `B`; `512MiB`, `10G`, `1.5GiB`.
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("not a size: '{s}' (e.g. 512MiB, 10G, 1073741824)"))?;
    let scale: f64 = match unit.trim() {
        "" | "B" => 1.0,
        "K" | "k" | "KiB" => 1024.0,
        "M" | "MiB" => 1024.0 * 1024.0,
        "G" | "GiB" => 1024.0 * 1024.0 * 1024.0,
        "T" | "TiB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        u => return Err(format!("unknown unit '{u}' in '{s}' (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")),
    };
    let bytes = n * scale;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(format!("'{s}': too large"));
    }
    Ok(bytes.round() as u64)
}

/// `1500ms`, `30s`, `15m`, `2h`, `1d`, or plain seconds; `never` is zero (for
/// `--idle-exit`: no idle exit).
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if s == "never" {
        return Ok(Duration::ZERO);
    }
    let split = s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("not a duration: '{s}' (e.g. 30s, 15m, 2h)"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "" | "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86400.0,
        _ => return Err(format!("unknown unit in '{s}' (ms, s, m, h, d)")),
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("'{s}': {e}"))
}

fn format_duration(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

impl ServeArgs {
    /// The shared cache's settings, files read (a token file's first line is the token).
    fn remote_options(&self) -> Result<Option<reapi::RemoteOptions>, String> {
        let Some(url) = &self.remote_cache else { return Ok(None) };
        let read = |f: &PathBuf, what: &str| std::fs::read(f).map_err(|e| format!("{what} {}: {e}", f.display()));
        // The tier's token and the fleet key are secrets: another user who
        // could read them could write entries every daemon of the farm serves.
        let token = match &self.remote_token_file {
            Some(f) => {
                let t = String::from_utf8_lossy(&net::auth::read_private(f, "--remote-token-file")?)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_owned();
                if t.is_empty() {
                    return Err(format!("--remote-token-file {}: no token in it", f.display()));
                }
                Some(t)
            }
            None => None,
        };
        let ca_pem = self.remote_ca.as_ref().map(|f| read(f, "--remote-ca")).transpose()?;
        let fleet_key = match &self.remote_cache_key {
            Some(f) => {
                let bytes = net::auth::read_private(f, "--remote-cache-key")?;
                // A secret as long as a token's at least: a guessable key
                // lets any writer of the tier forge entries for the farm.
                let length = bytes.trim_ascii().len();
                if length < net::auth::MIN_SECRET {
                    return Err(format!(
                        "--remote-cache-key {}: the key is {length} bytes; a fleet key needs at least {} (as a \
                         token does): e.g. head -c 32 /dev/urandom | base64 > {0}",
                        f.display(),
                        net::auth::MIN_SECRET
                    ));
                }
                Some(reapi::FleetKey::from_file_bytes(&bytes))
            }
            None => None,
        };
        Ok(Some(reapi::RemoteOptions {
            url: url.clone(),
            instance: self.remote_instance.clone(),
            token,
            ca_pem,
            timeout: self.remote_timeout.max(Duration::from_millis(10)),
            fleet_key,
        }))
    }

    fn socket(&self) -> PathBuf {
        self.socket.clone().unwrap_or_else(control::default_socket)
    }
    fn cache_dir(&self) -> PathBuf {
        self.cache_dir.clone().unwrap_or_else(nvlinkd_proto::paths::cache_dir)
    }
    /// The toolkits: `--cuda-home`, each a toolkit with an nvlink, else the
    /// one this `nvlinkd` stands for (`toolkit::find`: its overlay's,
    /// `$CUDA_HOME`, the nvlink on `PATH`, `/usr/local/cuda`). A daemon never
    /// runs without one: its every link would fall back, silently.
    fn usable_toolkits(&self) -> Result<Vec<PathBuf>, String> {
        toolkit::usable(&self.cuda_home)
    }
    /// The remote listener's security, read and checked before anything starts.
    fn remote(&self) -> Result<Option<net::listener::Remote>, String> {
        let Some(listen) = self.listen.clone() else { return Ok(None) };
        net::listener::Remote::configure(
            listen,
            self.tls_cert.as_deref().zip(self.tls_key.as_deref()),
            self.token_file.as_deref(),
            self.client_ca.as_deref(),
            self.insecure,
        )
        .map(Some)
    }
    /// The same settings as `serve` arguments, for `start`.
    fn to_args(&self) -> Vec<String> {
        let mut a = vec!["--socket".into(), self.socket().display().to_string()];
        a.extend(["--cache-dir".into(), self.cache_dir().display().to_string()]);
        if let Some(l) = &self.listen {
            a.extend(["--listen".into(), l.clone()]);
        }
        for h in &self.cuda_home {
            a.extend(["--cuda-home".into(), h.display().to_string()]);
        }
        for (flag, v) in [
            ("--tls-cert", &self.tls_cert),
            ("--tls-key", &self.tls_key),
            ("--token-file", &self.token_file),
            ("--client-ca", &self.client_ca),
        ] {
            if let Some(v) = v {
                a.extend([flag.into(), v.display().to_string()]);
            }
        }
        if self.insecure {
            a.push("--insecure".into());
        }
        if let Some(j) = self.jobs {
            a.extend(["--jobs".into(), j.to_string()]);
        }
        a.extend([
            "--cache-mem".into(),
            self.cache_mem.to_string(),
            "--cache-size".into(),
            self.cache_size.to_string(),
            "--heap-reserve".into(),
            self.heap_reserve.to_string(),
            "--blob-mem".into(),
            self.blob_mem.to_string(),
            "--blob-size".into(),
            self.blob_size.to_string(),
            "--worker-mem".into(),
            self.worker_mem.to_string(),
            "--worker-timeout".into(),
            self.worker_timeout.to_string(),
            "--reply-timeout".into(),
            format_duration(self.reply_timeout),
            "--max-link-input".into(),
            self.max_link_input.to_string(),
            "--max-reply-memory".into(),
            self.max_reply_memory.to_string(),
            "--shutdown-grace".into(),
            format_duration(self.shutdown_grace),
        ]);
        if let Some(idle) = self.idle_exit {
            a.extend(["--idle-exit".into(), format_duration(idle)]);
        }
        if let Some(r) = &self.remote_cache {
            a.extend(["--remote-cache".into(), r.clone(), "--remote-instance".into(), self.remote_instance.clone()]);
            if let Some(f) = &self.remote_token_file {
                a.extend(["--remote-token-file".into(), f.display().to_string()]);
            }
            if let Some(f) = &self.remote_ca {
                a.extend(["--remote-ca".into(), f.display().to_string()]);
            }
            if let Some(f) = &self.remote_cache_key {
                a.extend(["--remote-cache-key".into(), f.display().to_string()]);
            }
            a.extend(["--remote-timeout".into(), format_duration(self.remote_timeout)]);
        }
        if let Some(m) = &self.metrics_listen {
            a.extend(["--metrics-listen".into(), m.clone()]);
        }
        if self.no_speculate {
            a.push("--no-speculate".into());
        }
        if self.watch {
            a.push("--watch".into());
        }
        a.extend(["--verify".into(), format!("{:?}", self.verify).to_lowercase()]);
        a.extend(["--confine".into(), format!("{:?}", self.confine).to_lowercase()]);
        if let Some(u) = &self.sandbox_user {
            a.extend(["--sandbox-user".into(), u.clone()]);
        }
        a.extend(["--max-connections".into(), self.max_connections.to_string()]);
        if let Some(n) = self.max_remote_links {
            a.extend(["--max-remote-links".into(), n.to_string()]);
        }
        if let Some(n) = self.max_speculative {
            a.extend(["--max-speculative".into(), n.to_string()]);
        }
        a.extend(["--log-format".into(), format!("{:?}", self.log_format).to_lowercase()]);
        // Nobody reads a detached daemon's stderr: it logs to its file only.
        a.push("--detached".into());
        a
    }
}

/// The daemon's logging and signals, for `serve --help` and `start --help`.
const LOG_HELP: &str = "The daemon logs to <cache dir>/nvlinkd.log, and `serve` also to stderr (a \
                        daemon detached by `start` does not); NVLINKD_LOG sets what it logs (tracing \
                        filter syntax: error, warn, info [default], debug, trace, or e.g. \
                        nvlinkd_core=debug).\n\nSIGHUP reopens the log file and reloads --tls-cert, \
                        --tls-key, --client-ca and --token-file (a bad file keeps the old one, with a \
                        warning); SIGTERM and SIGINT stop it as `nvlinkd stop` does.";

#[derive(Subcommand)]
enum Command {
    /// Run the daemon in the foreground
    #[command(after_help = LOG_HELP)]
    Serve(ServeArgs),
    /// Start a detached daemon (does nothing if one is running)
    #[command(after_help = LOG_HELP)]
    Start(ServeArgs),
    /// Stop the daemon (links still computing get --shutdown-grace)
    Stop {
        /// Unix socket of the daemon [default: $NVLINKD_SOCKET or the per-user runtime dir]
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Is a daemon running?
    Status {
        /// Unix socket of the daemon [default: $NVLINKD_SOCKET or the per-user runtime dir]
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Print the daemon's counters
    Stats {
        /// Unix socket of the daemon [default: $NVLINKD_SOCKET or the per-user runtime dir]
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Print every counter as one JSON object (default: the main ones, in words)
        #[arg(long)]
        json: bool,
    },
    /// Print what the daemon does as it happens, one JSON object per line, until
    /// interrupted (link_started, link_queued, link_admitted, phase_started,
    /// phase_progress, phase_finished, diagnostic, link_finished,
    /// link_cancelled; every field in docs/events.md)
    Events {
        /// Unix socket of the daemon [default: $NVLINKD_SOCKET or the per-user runtime dir]
        #[arg(long)]
        socket: Option<PathBuf>,
        /// One JSON object per line (the only format; accepted for scripts)
        #[arg(long)]
        json: bool,
        /// Only links whose working directory is DIR or below it
        #[arg(long, value_name = "DIR")]
        cwd: Option<PathBuf>,
        /// Only links that write PATH (relative: to --cwd, or to this directory)
        #[arg(long, value_name = "PATH")]
        output: Option<PathBuf>,
        /// No speculative links (other archs, serve --watch relinks)
        #[arg(long)]
        no_speculative: bool,
    },
    /// Cancel a running link by its id (the `link` of its events): its shim
    /// prints that it was cancelled and exits 1
    Cancel {
        /// Unix socket of the daemon [default: $NVLINKD_SOCKET or the per-user runtime dir]
        #[arg(long)]
        socket: Option<PathBuf>,
        /// The link's id
        link: u64,
    },
    /// Run one nvlink invocation in this process, without a daemon (for debugging);
    /// the toolkit is found as for serve (the overlay's, $CUDA_HOME, PATH, /usr/local/cuda)
    Exec {
        /// Report which engine ran on stderr
        #[arg(long)]
        explain: bool,
        /// nvlink's arguments
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Keep links' outputs fresh: link now through the daemon, and again
    /// whenever one of their input files changes (run it in the links' working
    /// directory); prints one JSON line per (re)link; ends on Ctrl-C. Several
    /// links: their argument lists separated by `--` (`watch -- A… -- B…`).
    /// `--list` and `--forget` show and drop the links `serve --watch` keeps
    /// fresh
    Watch {
        /// Unix socket of the daemon [default: $NVLINKD_SOCKET or the per-user runtime dir]
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Print the links the daemon keeps fresh (`serve --watch`), one JSON object per line
        #[arg(long, conflicts_with_all = ["forget", "args"])]
        list: bool,
        /// Forget a link the daemon keeps fresh (its `id` in --list), or `all`
        #[arg(long, value_name = "ID|all", conflicts_with = "args")]
        forget: Vec<String>,
        /// nvlink's arguments (several links: separated by `--`)
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required_unless_present_any = ["list", "forget"])]
        args: Vec<String>,
    },
    /// Run libnvJitLink for a daemon (started by the daemon; see core/src/worker.rs)
    #[command(hide = true)]
    Worker {
        /// The libnvJitLink to load
        #[arg(long)]
        lib: PathBuf,
        /// Its release, MAJOR.MINOR (the versioned entry points to resolve)
        #[arg(long)]
        release: String,
        /// Address-space limit in bytes (0: none)
        #[arg(long, default_value_t = 0)]
        mem: u64,
    },
    /// Build a toolkit overlay whose bin/nvlink is the shim (--prefix), or make
    /// the toolkit's own bin/nvlink the shim (--in-place; builds keep the
    /// toolkit's paths and so its bytes)
    Install {
        /// The CUDA toolkit to link for (the directory holding bin/nvcc and bin/nvlink)
        #[arg(long)]
        cuda_home: PathBuf,
        /// Directory of the overlay to create or update (its bin/nvcc links through nvlinkd)
        #[arg(long, required_unless_present = "in_place", conflicts_with = "in_place")]
        prefix: Option<PathBuf>,
        /// Replace the toolkit's own bin/nvlink with the shim, keeping the real one in bin/.nvlinkd/
        #[arg(long)]
        in_place: bool,
    },
    /// Undo `install --in-place`: restore the toolkit's real nvlink
    Uninstall {
        /// The toolkit installed in place
        #[arg(long)]
        cuda_home: PathBuf,
    },
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime")
}

fn report(r: Result<String, String>) -> ExitCode {
    match r {
        Ok(msg) => {
            // What a daemon said (a version, a path, a message) is shown,
            // never obeyed by the terminal.
            if !msg.is_empty() {
                println!("{}", control::printable(&msg));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("nvlinkd: {}", control::printable(&e));
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    // `nvlinkd confine ... -- TOOL ARGS`: the daemon's way to start a tool
    // confined without forking itself (core/src/confine.rs); kept off clap,
    // on the path of every confined start.
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("confine") {
        let why = nvlinkd_core::confine::confine_and_exec(&argv[2..]);
        eprintln!("nvlinkd: {why}");
        return ExitCode::from(126);
    }
    let argv = match Cli::command().find_subcommand("serve").map(|serve| cmd::config::expand(argv, serve)) {
        Some(Ok(argv)) => argv,
        Some(Err(e)) => {
            eprintln!("nvlinkd: {e}");
            return ExitCode::from(2);
        }
        None => std::env::args().collect(),
    };
    let cli = Cli::parse_from(argv);
    let socket_or_default = |s: Option<PathBuf>| s.unwrap_or_else(control::default_socket);
    match cli.command {
        Command::Serve(a) => {
            // A listener that would serve anyone refuses to start before anything else.
            let remote = match a.remote() {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("nvlinkd: {e}");
                    return ExitCode::from(2);
                }
            };
            let toolkits = match a.usable_toolkits() {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("nvlinkd: {e}");
                    return ExitCode::from(2);
                }
            };
            // Then the heap, while this is the only thread (core/src/heap.rs).
            let jobs = a.jobs.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2));
            nvlinkd_core::heap::warm_daemon(a.heap_reserve, jobs);
            let cache_dir = a.cache_dir();
            if let Err(e) = daemon::private_cache_dir(&cache_dir) {
                eprintln!("nvlinkd: {e}");
                return ExitCode::from(2);
            }
            let logging = daemon::init_logging(&cache_dir, a.log_format, !a.detached);
            let remote_cache = match a.remote_options() {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("nvlinkd: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let confine = match a.confinement() {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("nvlinkd: {e}");
                    return ExitCode::from(2);
                }
            };
            let opts = daemon::ServeOptions {
                remote_cache,
                metrics_listen: a.metrics_listen.clone(),
                socket: a.socket(),
                cache_dir: cache_dir.clone(),
                remote,
                linker: LinkerConfig {
                    toolkits,
                    cache_dir,
                    jobs: a.jobs,
                    cache_mem: a.cache_mem,
                    cache_size: a.cache_size,
                    worker_exe: std::env::current_exe().ok(),
                    worker_mem: a.worker_mem,
                    verify: a.verify,
                    confine,
                    worker_timeout: Some(std::time::Duration::from_secs(a.worker_timeout.max(1))),
                },
                limits: service::Limits {
                    reply_timeout: a.reply_timeout,
                    max_link_input: a.max_link_input,
                    max_reply_memory: a.max_reply_memory,
                    blob_mem: a.blob_mem,
                    blob_size: a.blob_size,
                },
                shutdown_grace: a.shutdown_grace,
                idle_exit: a.idle_exit.filter(|d| !d.is_zero()),
                events: events::Hub::default(),
                speculation: daemon::Speculation {
                    multi_arch: !a.no_speculate,
                    watch: a.watch,
                    max_running: a.max_speculative.unwrap_or(jobs),
                },
                max_connections: a.max_connections,
                max_remote_links: a.max_remote_links.unwrap_or(4 * jobs),
                log_file: logging.file.clone(),
                log_to_stderr: !a.detached,
            };
            let rt = runtime();
            let served = rt.block_on(daemon::serve(opts));
            // Dropping the runtime would wait for every blocking thread, and an
            // abandoned link may still be computing on one: leave them behind.
            rt.shutdown_background();
            match served {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("nvlinkd: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Start(mut a) => match a.remote().and_then(|_| a.usable_toolkits()) {
            Err(e) => report(Err(e)),
            Ok(roots) => {
                // The daemon gets the toolkits found here, whatever its environment.
                a.cuda_home = roots;
                report(runtime().block_on(control::start(&a.socket(), a.to_args())))
            }
        },
        Command::Stop { socket } => report(runtime().block_on(control::stop(&socket_or_default(socket)))),
        Command::Status { socket } => report(runtime().block_on(control::status(&socket_or_default(socket)))),
        Command::Stats { socket, json } => report(runtime().block_on(control::stats(&socket_or_default(socket), json))),
        Command::Events { socket, json: _, cwd, output, no_speculative } => {
            let cwd = cwd.map(|c| std::path::absolute(&c).unwrap_or(c));
            let output = output.map(|o| match &cwd {
                Some(_) if o.is_relative() => o,
                _ => std::path::absolute(&o).unwrap_or(o),
            });
            let filter = nvlinkd_proto::v1::EventsRequest {
                cwd: cwd.map(|c| c.to_string_lossy().into_owned()).unwrap_or_default(),
                output: output.map(|o| o.to_string_lossy().into_owned()).unwrap_or_default(),
                no_speculative,
            };
            match runtime().block_on(control::events(&socket_or_default(socket), filter)) {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("nvlinkd: {}", control::printable(&e));
                    ExitCode::FAILURE
                }
            }
        }
        Command::Cancel { socket, link } => {
            report(runtime().block_on(control::cancel(&socket_or_default(socket), link)))
        }
        Command::Install { cuda_home, prefix: Some(prefix), in_place: false } => {
            report(install::install(&cuda_home, &prefix))
        }
        Command::Install { cuda_home, .. } => report(install::install_in_place(&cuda_home)),
        Command::Uninstall { cuda_home } => report(install::uninstall(&cuda_home)),
        Command::Exec { explain, args } => exec::run(args, explain),
        Command::Watch { socket, list: true, .. } => {
            report(runtime().block_on(cmd::watch::recipes(&socket_or_default(socket), Vec::new())))
        }
        Command::Watch { socket, forget, args, .. } if !forget.is_empty() && args.is_empty() => {
            report(runtime().block_on(cmd::watch::recipes(&socket_or_default(socket), forget)))
        }
        Command::Watch { socket, args, .. } => runtime().block_on(cmd::watch::run(&socket_or_default(socket), args)),
        Command::Worker { lib, release, mem } => {
            let Some(lib) = nvlinkd_core::worker::LibSpec::with_release(lib, &release) else {
                eprintln!("nvlinkd worker: bad --release {release}");
                return ExitCode::from(2);
            };
            ExitCode::from(nvlinkd_core::worker::serve(&lib, mem) as u8)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_units() {
        assert_eq!(parse_size("1073741824"), Ok(1 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("10G"), Ok(10 << 30));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("2KB"), Ok(2000));
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("64 KiB"), Ok(64 << 10));
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999TB").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert!(parse_duration("2 weeks").is_err());
        assert!(parse_duration("").is_err());
        assert_eq!(parse_duration("never"), Ok(Duration::ZERO));
        assert!(parse_duration("-1s").is_err());
        // `start` hands the value to `serve` in this form.
        let d = Duration::from_millis(7_200_000);
        assert_eq!(parse_duration(&format_duration(d)), Ok(d));
    }
}
