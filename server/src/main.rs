//! `nvlinkd`: the device-link daemon and its control commands.

mod control;
mod daemon;
mod exec;
mod install;
mod service;
mod stream_fs;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use nvlinkd_core::LinkerConfig;

#[derive(Parser)]
#[command(name = "nvlinkd", version, about = "CUDA device-link daemon behind the nvlink shim")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Clone)]
struct ServeArgs {
    /// Unix socket to listen on [default: $NVLINKD_SOCKET or the per-user runtime dir]
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Cache directory (and log file) [default: $NVLINKD_CACHE_DIR or ~/.cache/nvlinkd]
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Also serve remote shims on HOST:PORT
    #[arg(long)]
    listen: Option<String>,
    /// Toolkit used when a request names none [default: $CUDA_HOME]
    #[arg(long)]
    cuda_home: Option<PathBuf>,
    /// Worker threads for parallel compilation [default: number of CPUs]
    #[arg(long)]
    jobs: Option<usize>,
    /// Bytes of cached results kept in memory
    #[arg(long, default_value_t = 512 << 20)]
    cache_mem: u64,
    /// Bytes of cached results kept on disk
    #[arg(long, default_value_t = 10 << 30)]
    cache_size: u64,
    /// Address-space limit of each nvJitLink worker process, bytes (0: none)
    #[arg(long, default_value_t = 64 << 30)]
    worker_mem: u64,
    /// Seconds one nvJitLink request may take before its worker is killed
    #[arg(long, default_value_t = 1800)]
    worker_timeout: u64,
}

impl ServeArgs {
    fn socket(&self) -> PathBuf {
        self.socket.clone().unwrap_or_else(control::default_socket)
    }
    fn cache_dir(&self) -> PathBuf {
        self.cache_dir.clone().unwrap_or_else(nvlinkd_proto::paths::cache_dir)
    }
    /// The same settings as `serve` arguments, for `start`.
    fn to_args(&self) -> Vec<String> {
        let mut a = vec!["--socket".into(), self.socket().display().to_string()];
        a.extend(["--cache-dir".into(), self.cache_dir().display().to_string()]);
        if let Some(l) = &self.listen {
            a.extend(["--listen".into(), l.clone()]);
        }
        if let Some(h) = &self.cuda_home {
            a.extend(["--cuda-home".into(), h.display().to_string()]);
        }
        if let Some(j) = self.jobs {
            a.extend(["--jobs".into(), j.to_string()]);
        }
        a.extend([
            "--cache-mem".into(),
            self.cache_mem.to_string(),
            "--cache-size".into(),
            self.cache_size.to_string(),
            "--worker-mem".into(),
            self.worker_mem.to_string(),
            "--worker-timeout".into(),
            self.worker_timeout.to_string(),
        ]);
        a
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon in the foreground
    Serve(ServeArgs),
    /// Start a detached daemon (does nothing if one is running)
    Start(ServeArgs),
    /// Stop the daemon after its in-flight links finish
    Stop {
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Is a daemon running?
    Status {
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Print the daemon's counters
    Stats {
        #[arg(long)]
        socket: Option<PathBuf>,
        /// One JSON object (the only format)
        #[arg(long)]
        json: bool,
    },
    /// Run one nvlink invocation in this process, without a daemon (for debugging)
    Exec {
        /// Report which engine ran on stderr
        #[arg(long)]
        explain: bool,
        /// nvlink's arguments
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
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
        #[arg(long)]
        cuda_home: PathBuf,
        #[arg(long, required_unless_present = "in_place", conflicts_with = "in_place")]
        prefix: Option<PathBuf>,
        #[arg(long)]
        in_place: bool,
    },
    /// Undo `install --in-place`: restore the toolkit's real nvlink
    Uninstall {
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
            println!("{msg}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("nvlinkd: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let socket_or_default = |s: Option<PathBuf>| s.unwrap_or_else(control::default_socket);
    match cli.command {
        Command::Serve(a) => {
            let cache_dir = a.cache_dir();
            let _guard = daemon::init_logging(&cache_dir);
            let opts = daemon::ServeOptions {
                socket: a.socket(),
                cache_dir: cache_dir.clone(),
                listen: a.listen.clone(),
                linker: LinkerConfig {
                    default_toolkit: a.cuda_home.clone().or_else(|| std::env::var_os("CUDA_HOME").map(PathBuf::from)),
                    cache_dir,
                    jobs: a.jobs,
                    cache_mem: a.cache_mem,
                    cache_size: a.cache_size,
                    worker_exe: std::env::current_exe().ok(),
                    worker_mem: a.worker_mem,
                    worker_timeout: Some(std::time::Duration::from_secs(a.worker_timeout.max(1))),
                },
            };
            match runtime().block_on(daemon::serve(opts)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("nvlinkd: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Start(a) => report(runtime().block_on(control::start(&a.socket(), a.to_args()))),
        Command::Stop { socket } => report(runtime().block_on(control::stop(&socket_or_default(socket)))),
        Command::Status { socket } => report(runtime().block_on(control::status(&socket_or_default(socket)))),
        Command::Stats { socket, json: _ } => report(runtime().block_on(control::stats(&socket_or_default(socket)))),
        Command::Install { cuda_home, prefix: Some(prefix), in_place: false } => {
            report(install::install(&cuda_home, &prefix))
        }
        Command::Install { cuda_home, .. } => report(install::install_in_place(&cuda_home)),
        Command::Uninstall { cuda_home } => report(install::uninstall(&cuda_home)),
        Command::Exec { explain, args } => exec::run(args, explain),
        Command::Worker { lib, release, mem } => {
            let Some((major, minor)) =
                release.split_once('.').and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
            else {
                eprintln!("nvlinkd worker: bad --release {release}");
                return ExitCode::from(2);
            };
            let lib = nvlinkd_core::worker::LibSpec { path: lib, major, minor };
            ExitCode::from(nvlinkd_core::worker::serve(&lib, mem) as u8)
        }
    }
}
