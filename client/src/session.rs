//! One link through the daemon: connect (starting a daemon if needed), stream
//! the request, serve file reads, write the outputs.
//!
//! Every failure to get a complete answer is returned as `Err(reason)`, and the
//! caller falls back to the real nvlink. No output is written before the daemon's
//! final answer arrives, so a fallback always starts from a clean slate. (A
//! local daemon may write an output's bytes itself, to a temporary file beside
//! it — `OutputFile.staged` — which the shim renames into place only then; the
//! daemon removes what the shim leaves when the stream ends.)

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use nvlinkd_fs::owner;
use nvlinkd_proto::paths;
use nvlinkd_proto::shared::{self, RELEVANT_ENV, SHIM_WINDOW_BYTES};
use nvlinkd_proto::v1::{
    client_message, file_error, file_reply, file_request, nvlinkd_client::NvlinkdClient, server_message, ClientMessage,
    FileError, FileReply, FileStat, LinkResult, OutputFile, Start,
};
use tokio::sync::mpsc;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::toolkit::Toolkit;
use nvlinkd_proto::policy::Policy;

/// How long a daemon the shim starts stays without a link (`$NVLINKD_IDLE_EXIT`).
const DEFAULT_IDLE_EXIT: &str = "2h";
/// Largest file the shim reads for the daemon (sent in `CHUNK_BYTES` pieces).
const MAX_FILE: u64 = 4 << 30;

/// `NVLINKD_TIMING=1`: print how long each phase of the shim took (stderr).
fn mark(what: &str) {
    use std::sync::OnceLock;
    static ON: OnceLock<Option<std::time::Instant>> = OnceLock::new();
    if let Some(t0) = ON.get_or_init(|| std::env::var_os("NVLINKD_TIMING").map(|_| std::time::Instant::now())) {
        eprintln!("nvlinkd-timing {:>8.3} ms {what}", t0.elapsed().as_secs_f64() * 1e3);
    }
}

/// Why the daemon's answer is not used.
pub struct Failure {
    pub reason: String,
    /// The daemon broke the protocol (asked for or sent what nvlink would not):
    /// said on stderr, not only with `NVLINKD_FALLBACK=never`.
    pub violation: bool,
    /// The daemon went away before its answer was complete (refused, reset,
    /// silent, the stream ended without a result): another replica of
    /// `NVLINKD_ADDR` may serve the link.
    pub lost: bool,
    /// The daemon handed the link back for a reason the user can fix
    /// (`LinkResult.fixable`): warned about once per daemon (`warn.rs`).
    pub fixable: Option<crate::warn::Fixable>,
}

impl From<String> for Failure {
    fn from(reason: String) -> Self {
        Failure { reason, violation: false, lost: false, fixable: None }
    }
}

fn violation(reason: String) -> Failure {
    Failure { reason, violation: true, lost: false, fixable: None }
}

/// The daemon is gone (see [`Failure::lost`]).
fn lost(reason: String) -> Failure {
    Failure { reason, violation: false, lost: true, fixable: None }
}

/// Longest wait for each message of the daemon ([`paths::ENV_TIMEOUT`]).
fn message_timeout() -> Duration {
    std::env::var(paths::ENV_TIMEOUT)
        .ok()
        .and_then(|v| v.trim().trim_end_matches('s').parse::<f64>().ok())
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .filter(|d| !d.is_zero())
        .unwrap_or(Duration::from_secs(600))
}

/// Most bytes of output files one link may hand the shim.
const MAX_OUTPUT: u64 = 4 << 30;

pub async fn run(args: &[String], tk: &Toolkit) -> Result<i32, Failure> {
    mark("start");
    let Some(list) = std::env::var(paths::ENV_ADDR).ok().filter(|a| !a.is_empty()) else {
        let channel = connect_or_start(tk).await?;
        mark("connected");
        let request = Prepared::new(args, tk)?;
        return link(channel, None, args, &request).await;
    };
    // Remote daemons (replicas) are managed by their owners; never start one.
    // Each address is tried in order, at most once per link: one that refuses
    // the connection, or dies or goes silent before its answer is complete,
    // costs a retry on the next. Nothing is written before a complete answer,
    // so a retry starts from a clean slate. An answer (nvlink's, a decline, a
    // protocol violation) is final.
    let token = token()?;
    // The request (its files hashed and announced) before any connection: a
    // daemon closes a connection that makes no call within seconds.
    let request = Prepared::new(args, tk)?;
    let mut failures = Vec::new();
    for target in remote_targets(&list) {
        let channel = match connect(&target).await {
            Ok(c) => c,
            Err(e) => {
                mark(&format!("next address: {e}"));
                failures.push(e);
                continue;
            }
        };
        mark("connected");
        match link(channel, token.clone(), args, &request).await {
            Err(f) if f.lost => {
                mark(&format!("next address: {}", f.reason));
                failures.push(f.reason);
            }
            answered => return answered,
        }
    }
    Err(if failures.is_empty() { format!("{} names no daemon", paths::ENV_ADDR) } else { failures.join("; ") }.into())
}

/// What a link sends and checks, the same for every daemon tried.
struct Prepared {
    cwd: PathBuf,
    policy: Policy,
    start: Start,
}

impl Prepared {
    fn new(args: &[String], tk: &Toolkit) -> Result<Prepared, Failure> {
        let cwd = std::env::current_dir().map_err(|e| format!("no working directory: {e}"))?;
        // The directory this process is in (not whatever has its name by
        // now): the daemon reads through the caller's files only where the
        // directory it opens by name is this one.
        let (dev, ino) = std::fs::metadata(".").map(|m| (m.dev(), m.ino())).unwrap_or((0, 0));
        let env: HashMap<String, String> =
            RELEVANT_ENV.iter().filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v))).collect();
        let policy = Policy::new(args, &cwd, env.get("LIBRARY_PATH").map(String::as_str), tk.cuda_home.as_deref());
        // A remote daemon reads the files by digest (a local one reads them itself).
        let remote = remote();
        // At most half the message bound, less the command line (the rest is asked for by path).
        let room = (nvlinkd_proto::MAX_MESSAGE_BYTES / 2).saturating_sub(args.iter().map(|a| a.len() + 8).sum());
        let files = if remote { crate::announce::files(&policy, &cwd, room) } else { Vec::new() };
        mark("files announced");
        let [mnt_ns_dev, mnt_ns_ino, root_dev, root_ino] = nvlinkd_fs::fs_view();
        let start = Start {
            args: args.to_vec(),
            cwd: cwd.to_string_lossy().into_owned(),
            env,
            cwd_dev: dev,
            cwd_ino: ino,
            mnt_ns_dev,
            mnt_ns_ino,
            root_dev,
            root_ino,
            answers_nvvm_stat: true,
            // Forwarded as set; the daemon treats an unknown class as foreground.
            priority: std::env::var(paths::ENV_PRIORITY).unwrap_or_default(),
            progress: progress_wanted(),
            toolkit_release: tk.release().unwrap_or_default(),
            files,
            // A local daemon writes large outputs itself: the shim renames them
            // instead of receiving their bytes (about 2 ms a 1 MB cubin here).
            accepts_staged: !remote,
        };
        mark("request ready");
        Ok(Prepared { cwd, policy, start })
    }
}

/// One link on one daemon's channel.
async fn link(channel: Channel, token: Token, args: &[String], request: &Prepared) -> Result<i32, Failure> {
    let mut client = NvlinkdClient::new(channel)
        .max_decoding_message_size(nvlinkd_proto::MAX_MESSAGE_BYTES)
        .max_encoding_message_size(nvlinkd_proto::MAX_MESSAGE_BYTES);
    // Over a network, outputs come back zstd-compressed (a cubin shrinks
    // about sixfold: a warm relink's answer is mostly its output); a local
    // daemon is not asked to spend the CPU. Decompression is bounded by the
    // message limit above.
    let remote = remote();
    if remote {
        client = client.accept_compressed(tonic::codec::CompressionEncoding::Zstd);
    }
    let (cwd, policy) = (&request.cwd, &request.policy);
    let start = request.start.clone();

    let timeout = message_timeout();
    let (tx, rx) = mpsc::channel::<ClientMessage>(8);
    tx.send(ClientMessage { msg: Some(client_message::Msg::Start(start)) })
        .await
        .map_err(|_| lost("request channel closed".to_string()))?;
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    if let Some(token) = token {
        request.metadata_mut().insert("authorization", token);
    }
    let mut inbound = tokio::time::timeout(timeout, client.link(request))
        .await
        .map_err(|_| lost("the daemon did not answer in time".to_string()))?
        .map_err(|s| lost(format!("link rejected: {}", s.message())))?
        .into_inner();
    mark("request sent");

    let mut progress = ProgressLine::new(start_progress(args));
    let mut outputs: Vec<Received> = Vec::new();
    // The output file whose pieces are arriving.
    let mut open: Option<Received> = None;
    let mut output_bytes = 0u64;
    loop {
        let next = tokio::select! {
            m = tokio::time::timeout(timeout, inbound.message()) => m,
            _ = progress.due() => {
                progress.show();
                continue;
            }
        };
        let msg = next
            .map_err(|_| lost(format!("the daemon sent nothing for {}s", timeout.as_secs_f64())))?
            .map_err(|s| lost(format!("daemon stream failed: {}", s.message())))?;
        let Some(msg) = msg.and_then(|m| m.msg) else {
            return Err(lost("daemon closed the link without a result".to_string()));
        };
        match msg {
            server_message::Msg::File(req) => {
                mark(&format!("file request {}", req.path));
                let path = Path::new(&req.path);
                let allowed = match req.op() {
                    file_request::Op::Stat => policy.may_stat(path),
                    file_request::Op::Read => policy.may_read(path),
                };
                if !allowed {
                    return Err(violation(format!("the daemon asked for {}, which nvlink would not read", req.path)));
                }
                // Through the working directory itself, as nvlink reads a relative name.
                for reply in serve_file(req.id, &in_cwd(path, cwd), req.op()) {
                    tx.send(ClientMessage { msg: Some(client_message::Msg::File(reply)) })
                        .await
                        .map_err(|_| lost("daemon stopped reading".to_string()))?;
                }
            }
            server_message::Msg::Output(piece) if !piece.staged.is_empty() => {
                if remote || piece.append || piece.more || open.is_some() {
                    return Err(violation(format!("the daemon staged {} where it may not", piece.path)));
                }
                if !policy.may_write(Path::new(&piece.path), false) {
                    return Err(violation(format!("the daemon asked to write {}, which nvlink would not", piece.path)));
                }
                let staged = nvlinkd_fs::Staged {
                    path: PathBuf::from(&piece.staged),
                    dev: piece.staged_dev,
                    ino: piece.staged_ino,
                    size: piece.staged_size,
                };
                if !nvlinkd_fs::is_staged_name(&staged.path, &nvlinkd_fs::output_target(Path::new(&piece.path))) {
                    return Err(violation(format!("the daemon staged {} as {}", piece.path, piece.staged)));
                }
                output_bytes += staged.size;
                if output_bytes > MAX_OUTPUT {
                    return Err(violation(format!("the daemon sent more than {MAX_OUTPUT} bytes of output")));
                }
                outputs.push(Received {
                    path: piece.path,
                    append: false,
                    pieces: Vec::new(),
                    held: 0,
                    spill: None,
                    staged: Some(staged),
                });
            }
            server_message::Msg::Output(piece) => {
                let more = piece.more;
                output_bytes += piece.data.len() as u64;
                if output_bytes > MAX_OUTPUT {
                    return Err(violation(format!("the daemon sent more than {MAX_OUTPUT} bytes of output")));
                }
                match &mut open {
                    Some(f) if f.path == piece.path && f.append == piece.append => {
                        f.take(piece.data).map_err(|e| lost(format!("cannot keep {}: {e}", f.path)))?
                    }
                    Some(f) => {
                        return Err(violation(format!("the daemon left {} incomplete for {}", f.path, piece.path)))
                    }
                    None => {
                        if !policy.may_write(Path::new(&piece.path), piece.append) {
                            let how = if piece.append { "append to" } else { "write" };
                            return Err(violation(format!(
                                "the daemon asked to {how} {}, which nvlink would not",
                                piece.path
                            )));
                        }
                        let mut f = Received::from(OutputFile { data: Bytes::new(), ..piece.clone() });
                        f.take(piece.data).map_err(|e| lost(format!("cannot keep {}: {e}", f.path)))?;
                        open = Some(f);
                    }
                }
                if !more {
                    if let Some(mut f) = open.take() {
                        f.seal().map_err(|e| lost(format!("cannot keep {}: {e}", f.path)))?;
                        outputs.push(f);
                    }
                }
            }
            server_message::Msg::Progress(p) => progress.phase(p.phase),
            server_message::Msg::Result(result) => {
                progress.done();
                mark("result");
                if let Some(f) = open {
                    return Err(violation(format!("the daemon left {} incomplete", f.path)));
                }
                for f in &result.outputs {
                    if !policy.may_write(Path::new(&f.path), f.append) {
                        return Err(violation(format!("the daemon asked to write {}, which nvlink would not", f.path)));
                    }
                }
                outputs.extend(result.outputs.iter().cloned().map(Received::from));
                if !result.fallback {
                    if !(0..=255).contains(&result.exit_code) {
                        return Err(violation(format!("exit status {} is not one nvlink returns", result.exit_code)));
                    }
                    if let Some(o) = policy.output().filter(|_| result.exit_code == 0) {
                        if !outputs.iter().any(|f| !f.append && Path::new(&f.path) == o) {
                            return Err(violation(format!("success without the output file {}", o.display())));
                        }
                    }
                }
                let code = finish(result, &outputs, args, cwd);
                mark("outputs written");
                return code;
            }
        }
    }
}

/// `NVLINKD_PROGRESS=1` (or any value but empty and `0`).
fn progress_wanted() -> bool {
    std::env::var(paths::ENV_PROGRESS).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// What the progress line names: the output file, or nothing.
fn start_progress(args: &[String]) -> Option<String> {
    if !progress_wanted() {
        return None;
    }
    let mut it = args.iter();
    let mut out = None;
    while let Some(a) = it.next() {
        if a == "-o" || a == "--output-file" {
            out = it.next().cloned();
        } else if let Some(v) = a.strip_prefix("--output-file=") {
            out = Some(v.to_owned());
        }
    }
    Some(out.unwrap_or_else(|| "link".into()))
}

/// `NVLINKD_PROGRESS=1`: one line on stderr for a link longer than a second
/// (nvlink itself prints no progress, so nothing by default). On a terminal
/// the line is rewritten in place with each phase and erased at the end;
/// elsewhere it is printed once.
struct ProgressLine {
    what: Option<String>,
    t0: tokio::time::Instant,
    phase: String,
    shown: bool,
    tty: bool,
}

impl ProgressLine {
    fn new(what: Option<String>) -> ProgressLine {
        use std::io::IsTerminal;
        ProgressLine {
            what,
            t0: tokio::time::Instant::now(),
            phase: String::new(),
            shown: false,
            tty: std::io::stderr().is_terminal(),
        }
    }

    /// Ready when the line is first due (never when off or shown).
    async fn due(&self) {
        if self.what.is_none() || self.shown {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep_until(self.t0 + Duration::from_secs(1)).await;
    }

    fn phase(&mut self, phase: String) {
        self.phase = phase;
        if self.shown && self.tty {
            self.show();
        }
    }

    fn show(&mut self) {
        let Some(what) = &self.what else { return };
        if self.shown && !self.tty {
            return;
        }
        let secs = self.t0.elapsed().as_secs_f64();
        let phase = if self.phase.is_empty() { String::new() } else { format!(", after {}", self.phase) };
        let line = format!("nvlinkd: linking {what} ({secs:.1} s{phase})");
        if self.tty {
            eprint!("\r\x1b[K{line}");
        } else {
            eprintln!("{line}");
        }
        self.shown = true;
    }

    fn done(&mut self) {
        if self.shown && self.tty {
            eprint!("\r\x1b[K");
        }
        self.what = None;
    }
}

/// The reply to one file request: a stat, an error, or the contents in
/// `CHUNK_BYTES` pieces.
fn serve_file(id: u64, path: &Path, op: file_request::Op) -> Vec<FileReply> {
    let err = |e: &std::io::Error| {
        let kind = match e.kind() {
            // ENOTDIR (`x.o/`, a file used as a directory): nvlink cannot
            // open it either, as for a missing file.
            std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory => file_error::Kind::NotFound,
            std::io::ErrorKind::PermissionDenied => file_error::Kind::PermissionDenied,
            std::io::ErrorKind::IsADirectory => file_error::Kind::IsDirectory,
            std::io::ErrorKind::FileTooLarge => file_error::Kind::TooLarge,
            std::io::ErrorKind::Unsupported => file_error::Kind::NotRegular,
            _ => file_error::Kind::Other,
        };
        file_reply::Result::Error(FileError { kind: kind as i32, message: e.to_string() })
    };
    let one = |result| vec![FileReply { id, result: Some(result), more: false }];
    match op {
        file_request::Op::Stat => match std::fs::metadata(path) {
            Ok(m) => one(file_reply::Result::Stat(FileStat { is_dir: m.is_dir(), size: m.len() })),
            Err(e) => one(err(&e)),
        },
        // At most [`MAX_FILE`] bytes; a FIFO, socket or device is not read at
        // all (`Unsupported`): the daemon declines the link and this shim runs
        // the real nvlink, which reads those its own way.
        file_request::Op::Read => match nvlinkd_fs::read_regular(path, MAX_FILE) {
            Ok(data) => nvlinkd_proto::pieces(&Bytes::from(data))
                .map(|(piece, more)| FileReply { id, result: Some(file_reply::Result::Data(piece)), more })
                .collect(),
            Err(e) => one(err(&e)),
        },
    }
}

/// An output file as it arrived: its pieces, in order, each a slice of the
/// message that carried it (never copied into one buffer: they are written
/// one after another).
struct Received {
    path: String,
    append: bool,
    pieces: Vec<Bytes>,
    /// Bytes held in `pieces`.
    held: u64,
    /// A large output arriving: staged beside its target as it comes.
    spill: Option<nvlinkd_fs::Stager>,
    /// Written by the daemon, or by the shim as it arrived (then `pieces` is empty).
    staged: Option<nvlinkd_fs::Staged>,
}

/// An output larger than this goes to a file beside its target as it
/// arrives, so that the shim's memory stays bounded (a piece is at most a
/// few MiB) whatever the output's size.
const SPILL_AT: u64 = 8 << 20;

impl From<OutputFile> for Received {
    fn from(f: OutputFile) -> Received {
        let held = f.data.len() as u64;
        Received { path: f.path, append: f.append, pieces: vec![f.data], held, spill: None, staged: None }
    }
}

impl Received {
    /// Keep the next piece: in memory, or on disk once the output is large
    /// (where a file can be made beside its target; else in memory).
    fn take(&mut self, data: Bytes) -> std::io::Result<()> {
        if let Some(spill) = &mut self.spill {
            return spill.write(&data);
        }
        self.held += data.len() as u64;
        self.pieces.push(data);
        if self.append || self.held <= SPILL_AT {
            return Ok(());
        }
        let Ok(target) = nvlinkd_fs::output_target_checked(Path::new(&self.path)) else { return Ok(()) };
        if !std::fs::metadata(&target).map_or(true, |m| m.is_file()) {
            return Ok(()); // a device or FIFO: written in place at the end
        }
        let Ok(mut spill) = nvlinkd_fs::Stager::new(&target) else { return Ok(()) };
        for p in self.pieces.drain(..) {
            spill.write(&p)?;
        }
        self.held = 0;
        self.spill = Some(spill);
        Ok(())
    }

    /// The last piece arrived.
    fn seal(&mut self) -> std::io::Result<()> {
        if let Some(spill) = self.spill.take() {
            self.staged = Some(spill.finish()?);
        }
        Ok(())
    }
}

/// Files the daemon staged that were not renamed into place: removed when
/// the shim leaves (on success every one is renamed; otherwise the daemon
/// would remove them too, once the stream ends).
struct Unused<'a>(&'a [Received]);

impl Drop for Unused<'_> {
    fn drop(&mut self) {
        self.0.iter().filter_map(|r| r.staged.as_ref()).for_each(nvlinkd_fs::discard);
    }
}

fn finish(result: LinkResult, outputs: &[Received], args: &[String], cwd: &Path) -> Result<i32, Failure> {
    let _unused = Unused(outputs);
    if !result.cancelled.is_empty() {
        // Superseded by a newer link of the same output: the daemon's one-line
        // message, no output, a failure, and no nvlink run (the newer link is
        // the one wanted).
        let _ = std::io::stderr().write_all(&result.stderr);
        return Ok(if result.exit_code == 0 { 1 } else { result.exit_code });
    }
    if result.fallback {
        let fixable = (!result.fixable.is_empty())
            .then(|| crate::warn::Fixable { what: result.fixable.clone(), daemon: result.daemon.clone() });
        return Err(Failure { fixable, ..Failure::from(format!("daemon declined: {}", result.fallback_reason)) });
    }
    for out in outputs {
        let path = PathBuf::from(&out.path);
        let here = in_cwd(&path, cwd);
        let written = match &out.staged {
            // The staged file too, through the working directory itself.
            Some(staged) => {
                place_staged(&here, &nvlinkd_fs::Staged { path: in_cwd(&staged.path, cwd), ..staged.clone() })
            }
            None if out.append => append(&here, &out.pieces),
            None => write_output(&here, &out.pieces),
        };
        if let Err(failed) = written {
            // nvlink's words: the file as the command line named it, no OS
            // error, after what it printed while linking.
            let _ = std::io::stdout().write_all(&result.stdout);
            let _ = std::io::stdout().flush();
            let _ = std::io::stderr().write_all(&result.stderr);
            match failed {
                WriteFailed::Open => {
                    let named = nvlinkd_fs::as_named(&path, &crate::policy::expanded(args, cwd), cwd);
                    eprintln!("nvlink fatal   : {}", nvlinkd_fs::cannot_open(out.append, &named))
                }
                // nvlink's `fwrite` of a whole-program LTO cubin says so.
                WriteFailed::Write if out.path == result.fwrite_output => eprintln!("nvlink fatal   : fwrite failed"),
                WriteFailed::Write => eprintln!("nvlink fatal   : Internal error: writing file"),
            }
            return Ok(1);
        }
    }
    let _ = std::io::stdout().write_all(&result.stdout);
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().write_all(&result.stderr);
    Ok(result.exit_code)
}

/// `path` under `cwd` (the name of this process's working directory) as a
/// name relative to the working directory itself, as nvlink opens a relative
/// output: through the directory, not through whatever has its name by now.
/// Byte for byte (a trailing `/` stays); other paths as they are.
fn in_cwd(path: &Path, cwd: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let (p, c) = (path.as_os_str().as_bytes(), cwd.as_os_str().as_bytes());
    match p.strip_prefix(c) {
        Some(rest) if c != b"/" && rest.starts_with(b"/") && rest.len() > 1 => {
            PathBuf::from(std::ffi::OsStr::from_bytes(&rest[1..]))
        }
        _ => path.to_owned(),
    }
}

/// How writing an output failed, in nvlink's terms.
enum WriteFailed {
    /// "Could not open output file": no such directory, a directory, no permission.
    Open,
    /// "Internal error: writing file": opened, but the write failed (`/dev/full`).
    Write,
}

fn append(path: &Path, pieces: &[Bytes]) -> Result<(), WriteFailed> {
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|_| WriteFailed::Open)?;
    pieces.iter().try_for_each(|p| f.write_all(p)).map_err(|_| WriteFailed::Write)
}

/// Write an output where nvlink's `fopen(path, "w")` would: through symlinks
/// the kernel follows for it (the link stays, its target gets the bytes; a
/// dangling one names the file created; another user's link in a sticky
/// directory is refused, `fs.protected_symlinks`), and into an existing device or FIFO (`-o /dev/null` writes to the
/// device, never replaces it). A regular file is replaced atomically.
///
/// A regular file that may be written but whose directory takes no new file
/// (nvlink needs only the file's own permission) is written in place.
fn write_output(path: &Path, pieces: &[Bytes]) -> Result<(), WriteFailed> {
    let target = nvlinkd_fs::output_target_checked(path).map_err(|_| WriteFailed::Open)?;
    match std::fs::metadata(&target) {
        Ok(m) if !m.is_file() && !m.is_dir() => write_in_place(&target, pieces),
        Ok(m) if m.is_file() && !replaceable(&m) => write_in_place(&target, pieces),
        Ok(m) if m.is_file() => match nvlinkd_fs::write_pieces_atomically(&target, pieces) {
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => write_in_place(&target, pieces),
            written => written.map_err(|e| failed(&e)),
        },
        _ => nvlinkd_fs::write_pieces_atomically(&target, pieces).map_err(|e| failed(&e)),
    }
}

/// How a write of an output failed: a full disk (or quota, or file size
/// limit) is nvlink's "Internal error: writing file", as its `fopen` of the
/// file succeeds before its write fails; anything else is its open failing.
/// (nvlink leaves a truncated file there; the shim leaves none.)
fn failed(e: &std::io::Error) -> WriteFailed {
    match e.raw_os_error() {
        Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG) => WriteFailed::Write,
        _ => WriteFailed::Open,
    }
}

/// Whether an existing output file may be replaced by a new one (renamed
/// over it) with nvlink's result: it is this user's, with no other name.
/// nvlink writes the file in place, so another user's file stays theirs and
/// a hard link to it sees the new bytes: such a file is written in place.
fn replaceable(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid cannot fail.
    m.uid() == unsafe { libc::geteuid() } && m.nlink() == 1
}

/// nvlink's own way: truncate and write the existing file.
fn write_in_place(target: &Path, pieces: &[Bytes]) -> Result<(), WriteFailed> {
    let mut f = std::fs::OpenOptions::new().write(true).truncate(true).open(target).map_err(|_| WriteFailed::Open)?;
    pieces.iter().try_for_each(|p| f.write_all(p)).and_then(|()| f.flush()).map_err(|_| WriteFailed::Write)
}

/// An output the daemon wrote beside its target: renamed into place with the
/// mode nvlink's file would have. Where nvlink would write into something
/// else (a device, a FIFO), or the rename is refused, its bytes are written as
/// [`write_output`] writes received ones.
fn place_staged(path: &Path, staged: &nvlinkd_fs::Staged) -> Result<(), WriteFailed> {
    let target = match nvlinkd_fs::output_target_checked(path) {
        Ok(t) => t,
        Err(_) => {
            nvlinkd_fs::discard(staged);
            return Err(WriteFailed::Open);
        }
    };
    let replaceable = match std::fs::metadata(&target) {
        Ok(m) => m.is_file() && replaceable(&m),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    };
    // Renamed where it was staged, if the output's directory is still that
    // one (a directory symlink may have been swapped since).
    if replaceable
        && nvlinkd_fs::staged_beside(staged, &target)
        && nvlinkd_fs::commit(staged, &target, nvlinkd_fs::output_mode(&target)).is_ok()
    {
        return Ok(());
    }
    // Copied through a small buffer, as nvlink writes: truncate and write
    // (the target is opened only once the staged file is known good).
    let mut open_failed = false;
    let copied = nvlinkd_fs::copy_staged(staged, || {
        let f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).open(&target);
        open_failed = f.is_err();
        f
    });
    nvlinkd_fs::discard(staged);
    match copied {
        Ok(_) => Ok(()),
        Err(_) if open_failed => Err(WriteFailed::Open),
        Err(_) => Err(WriteFailed::Write),
    }
}

/// HTTP/2 keepalive: a daemon whose connection died is noticed within
/// seconds, not at the message timeout.
fn tuned(endpoint: Endpoint) -> Endpoint {
    endpoint
        .initial_stream_window_size(SHIM_WINDOW_BYTES)
        .initial_connection_window_size(SHIM_WINDOW_BYTES)
        .max_frame_size(shared::FRAME_BYTES)
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(20))
        .keep_alive_while_idle(true)
}

async fn connect(addr: &Target) -> Result<Channel, String> {
    match addr {
        Target::Tcp { uri, tls } => {
            let mut endpoint = tuned(Endpoint::from_shared(uri.clone()).map_err(|e| format!("{uri}: {e}"))?);
            if *tls {
                let mut config = ClientTlsConfig::new();
                config = match env_file(paths::ENV_TLS_CA)? {
                    Some(pem) => config.ca_certificate(Certificate::from_pem(pem)),
                    None => config.with_native_roots(),
                };
                // A client certificate, for daemons that require one (mTLS).
                config = match (env_file(paths::ENV_TLS_CERT)?, env_file(paths::ENV_TLS_KEY)?) {
                    (Some(cert), Some(key)) => config.identity(Identity::from_pem(cert, key)),
                    (None, None) => config,
                    (Some(_), None) => {
                        return Err(format!("{} is set without {}", paths::ENV_TLS_CERT, paths::ENV_TLS_KEY))
                    }
                    (None, Some(_)) => {
                        return Err(format!("{} is set without {}", paths::ENV_TLS_KEY, paths::ENV_TLS_CERT))
                    }
                };
                endpoint = endpoint.tls_config(config).map_err(|e| format!("{uri}: {e}"))?;
            }
            endpoint.connect().await.map_err(|e| format!("cannot connect to {uri}: {e}"))
        }
        Target::Unix(path) => {
            // Only a daemon of this user's (or root's) answers a link: another
            // user's process behind the socket would get the inputs and write
            // the outputs.
            shared::connect_unix_own(tuned(shared::unix_endpoint()), path.clone())
                .await
                .map_err(|e| format!("cannot connect to {}: {e}", path.display()))
        }
    }
}

/// The contents of the file an environment variable names (None when unset or empty).
fn env_file(var: &str) -> Result<Option<Vec<u8>>, String> {
    let Some(file) = std::env::var_os(var).filter(|v| !v.is_empty()) else { return Ok(None) };
    std::fs::read(&file).map(Some).map_err(|e| format!("cannot read {var} {}: {e}", Path::new(&file).display()))
}

enum Target {
    Tcp { uri: String, tls: bool },
    Unix(PathBuf),
}

/// The daemons of `NVLINKD_ADDR`, in order: `https://HOST:PORT` (also written
/// as plain `HOST:PORT`), `http://HOST:PORT` only when so written.
fn remote_targets(list: &str) -> Vec<Target> {
    list.split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(|a| {
            if a.starts_with("http://") {
                Target::Tcp { uri: a.to_owned(), tls: false }
            } else if a.starts_with("https://") {
                Target::Tcp { uri: a.to_owned(), tls: true }
            } else {
                Target::Tcp { uri: format!("https://{a}"), tls: true }
            }
        })
        .collect()
}

/// The bearer token of `NVLINKD_TOKEN_FILE` (its first line that is not a
/// comment), from a file no other user can read or change
/// ([`owner::Rule::GROUP_SECRET`]): owned by this user or root, nothing for
/// others (group reading is allowed: CI runners and Kubernetes share a secret
/// with a group), in directories no other user can write unless sticky
/// ([`owner::secret_dirs`]: of the name, of each symlink on the way and of
/// the file: else the file could be swapped, or a link re-pointed). Another user who could read it would link on the farm as this
/// user.
fn token() -> Result<Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>, String> {
    use std::io::Read;
    let Some(file) = std::env::var_os(paths::ENV_TOKEN_FILE).filter(|v| !v.is_empty()) else { return Ok(None) };
    let shown = Path::new(&file).display();
    let cannot = |e: std::io::Error| format!("cannot read {} {shown}: {e}", paths::ENV_TOKEN_FILE);
    let mut f = std::fs::File::open(&file).map_err(cannot)?;
    let m = f.metadata().map_err(cannot)?;
    match owner::Rule::GROUP_SECRET.check(&m) {
        Err(why @ owner::Refusal::Owner { .. }) => return Err(format!("{} {shown} {why}", paths::ENV_TOKEN_FILE)),
        Err(why @ owner::Refusal::Mode { .. }) => {
            return Err(format!("{} {shown} {why}: chmod 600 {shown}", paths::ENV_TOKEN_FILE))
        }
        Ok(()) => {}
    }
    if let Some(above) = owner::secret_dirs(Path::new(&file)).map_err(cannot)? {
        return Err(format!(
            "{} {shown} is under {above}: keep it in a directory only this user or root can change",
            paths::ENV_TOKEN_FILE
        ));
    }
    let mut text = String::new();
    f.read_to_string(&mut text).map_err(cannot)?;
    let token = text.lines().map(str::trim).find(|l| !l.is_empty() && !l.starts_with('#')).unwrap_or_default();
    let mut value = format!("Bearer {token}")
        .parse::<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>()
        .map_err(|_| format!("{} holds no usable token", paths::ENV_TOKEN_FILE))?;
    value.set_sensitive(true);
    Ok(Some(value))
}

type Token = Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>;

/// Whether the shim links through remote daemons (`NVLINKD_ADDR`).
pub fn remote() -> bool {
    std::env::var(paths::ENV_ADDR).is_ok_and(|a| !a.is_empty())
}

/// The local daemon (unix socket), started if none answers.
async fn connect_or_start(tk: &Toolkit) -> Result<Channel, String> {
    let socket = paths::socket_path();
    // The default socket only in a runtime directory of this user's own: in
    // /tmp another user may have made `nvlinkd-$UID` first and wait there.
    // Said on every link (there is no private place to remember it in): the
    // links are nvlink's, only never faster, until the directory is dealt with.
    if std::env::var_os(paths::ENV_SOCKET).is_none_or(|s| s.is_empty()) && paths::private_runtime_dir().is_none() {
        let why = format!("{} is not this user's own directory", paths::runtime_dir().display());
        eprintln!(
            "nvlinkd: warning: {why} (another user made it, or others can write it), so the real nvlink links; \
             fix: remove it, or set XDG_RUNTIME_DIR or NVLINKD_SOCKET to a directory of your own"
        );
        return Err(why);
    }
    let target = Target::Unix(socket.clone());
    if socket.exists() {
        if let Ok(c) = connect(&target).await {
            return Ok(c);
        }
    }
    start_daemon(tk, &socket)?;
    connect(&target).await
}

/// Run `nvlinkd start` (it detaches the daemon and waits until it answers),
/// with this shim's toolkit. A shim that knows none (no overlay, no
/// `CUDA_HOME`) starts no daemon: one would link with a toolkit of its own
/// finding, not necessarily this nvlink's.
fn start_daemon(tk: &Toolkit, socket: &Path) -> Result<(), String> {
    let Some(home) = tk.cuda_home.as_ref().filter(|h| h.join("bin/nvlink").is_file()) else {
        return Err(match &tk.cuda_home {
            Some(h) => format!("no daemon started: {} is not a CUDA toolkit (no bin/nvlink)", h.display()),
            None => "no daemon started: this nvlink knows no CUDA toolkit (set CUDA_HOME)".to_string(),
        });
    };
    let bin = daemon_binary(tk).ok_or("no nvlinkd binary found to start a daemon")?;
    let mut cmd = std::process::Command::new(&bin);
    cmd.arg("start").arg("--socket").arg(socket);
    // A daemon nobody asked for does not stay forever.
    let idle = std::env::var(paths::ENV_IDLE_EXIT).ok().filter(|v| !v.is_empty());
    cmd.arg("--idle-exit").arg(idle.as_deref().unwrap_or(DEFAULT_IDLE_EXIT));
    cmd.arg("--cuda-home").arg(home);
    let status = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{} start failed ({status})", bin.display()))
    }
}

fn daemon_binary(tk: &Toolkit) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(paths::ENV_DAEMON_BIN).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    if let Some(p) = tk.daemon_bin.clone().filter(|p| p.is_file()) {
        return Some(p);
    }
    let sibling = std::env::current_exe().ok()?.parent()?.join("nvlinkd");
    if sibling.is_file() {
        return Some(sibling);
    }
    // Absolute PATH entries only: an empty or relative one names the build's
    // working directory, whose files are not this user's to run.
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(Path::new)
        .filter(|d| d.is_absolute())
        .map(|d| d.join("nvlinkd"))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outputs_under_the_working_directory_are_written_through_it() {
        let cwd = Path::new("/w/b");
        assert_eq!(in_cwd(Path::new("/w/b/out.cubin"), cwd), PathBuf::from("out.cubin"));
        assert_eq!(in_cwd(Path::new("/w/b/sub/x/"), cwd), PathBuf::from("sub/x/"));
        assert_eq!(in_cwd(Path::new("/w/bc/out.cubin"), cwd), PathBuf::from("/w/bc/out.cubin"));
        assert_eq!(in_cwd(Path::new("/w/b"), cwd), PathBuf::from("/w/b"));
        assert_eq!(in_cwd(Path::new("/x/out.cubin"), Path::new("/")), PathBuf::from("/x/out.cubin"));
    }

    #[test]
    fn outputs_are_named_as_the_command_line_named_them() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let cwd = Path::new("/w");
        let named = |path: &str, a: &[&str]| nvlinkd_fs::as_named(Path::new(path), &args(a), cwd);
        assert_eq!(named("/w/d/out.cubin", &["-o", "d/out.cubin"]), "d/out.cubin");
        assert_eq!(named("/w/./x.cubin", &["--output-file=./x.cubin"]), "./x.cubin");
        assert_eq!(named("/tmp/x.cubin", &["-o", "/tmp/x.cubin"]), "/tmp/x.cubin");
        assert_eq!(named("/w/reg.c", &["--register-link-binaries=reg.c", "-o", "x"]), "reg.c");
        // Named in an options file: relative to the working directory, or as is.
        assert_eq!(named("/w/d/y.cubin", &["-optf", "o.opts"]), "d/y.cubin");
        assert_eq!(named("/elsewhere/y.cubin", &["-optf", "o.opts"]), "/elsewhere/y.cubin");
    }
}
