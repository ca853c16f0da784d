//! `nvlinkd watch -- <nvlink arguments> [-- <nvlink arguments>]…`: keep
//! links' outputs fresh; `nvlinkd watch --list|--forget ID|all`: the links
//! `serve --watch` keeps fresh.
//!
//! For tools that relink without a build system (an IDE's "link on save", a
//! test loop). Run in the links' working directory, it asks the local daemon
//! to watch each link (the `Watch` RPC: the daemon reads and watches the
//! input files itself, see `speculate/watch.rs`); the daemon links at once
//! and again after every change of an input, and streams each result here.
//! This command writes the outputs exactly as the shim does for nvlink (each
//! to a temporary file beside it, then renamed over it), sends nvlink's own
//! messages to stderr, and prints one JSON object per (re)link on stdout:
//!
//! ```text
//! {"event":"relinked","schema":1,"link":12,"target":0,"relink":1,"changed":["/src/a.o"],"exit_code":0,
//!  "engine":"in_process","ms":41.2,"outputs":["/src/out.cubin"],"write_errors":[],"fallback":false,
//!  "fallback_reason":null,"diagnostics":[]}
//! ```
//!
//! (`event` is `linked` for the first link of a target; `link` joins the
//! line with the event stream; `target` is the index of the argument list;
//! `diagnostics` are those of the event stream, docs/events.md.) A link the
//! daemon cannot serve itself (`"fallback": true`: an input only nvlink may
//! read, a worker that crashed) is run with the real nvlink here, as the
//! shim would (found as the shim finds it: `NVLINKD_REAL_NVLINK`, the install
//! record, `$CUDA_HOME/bin/nvlink`), and its diagnostics are read from its
//! output. The command ends on Ctrl-C (or when the daemon stops).
//!
//! It trusts the daemon no more than the shim does: it talks only to a daemon
//! of its own user or root (`control::connect`), and writes only the outputs
//! its own command line names (`-o`, `--register-link-binaries` replaced, the
//! `-time` file appended to: the shim's `Policy`); any other path the daemon
//! names is a write error of the line, never written.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use nvlinkd_proto::paths::{OverlayRecord, ENV_REAL_NVLINK};
use nvlinkd_proto::policy::Policy;
use nvlinkd_proto::shared::RELEVANT_ENV;
use nvlinkd_proto::v1::{LinkResult, OutputFile, Start, WatchEvent};

use crate::cmd::control;
use crate::observe::events::{diagnostic_fields, SCHEMA};

pub async fn run(socket: &Path, args: Vec<String>) -> ExitCode {
    match watch(socket, args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nvlinkd watch: {}", control::printable(&e));
            ExitCode::FAILURE
        }
    }
}

/// The real nvlink, as the shim finds it.
fn real_nvlink(record: Option<&OverlayRecord>, toolkit: Option<&Path>) -> Option<PathBuf> {
    std::env::var_os(ENV_REAL_NVLINK)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| record.and_then(|r| r.real_nvlink.clone()))
        .or_else(|| toolkit.map(|t| t.join("bin/nvlink")))
}

/// The release identity of an nvlink, from its `--version` banner.
fn release_of(nvlink: &Path) -> Option<String> {
    let out = std::process::Command::new(nvlink).arg("--version").output().ok()?;
    nvlinkd_core::toolkit::identity_of_banner(&String::from_utf8_lossy(&out.stdout))
}

/// `--list` (no ids) or `--forget ID|all`: the recipes of `serve --watch`,
/// one JSON object per line.
pub async fn recipes(socket: &Path, forget: Vec<String>) -> Result<String, String> {
    let mut req = nvlinkd_proto::v1::RecipesRequest::default();
    for f in &forget {
        match f.as_str() {
            "all" => req.forget_all = true,
            id => req.forget.push(id.parse().map_err(|_| format!("--forget: not an id or `all`: {id}"))?),
        }
    }
    let mut client = control::connect(socket).await?;
    let reply = client.recipes(req).await.map_err(|s| s.message().to_string())?.into_inner();
    if !forget.is_empty() {
        return Ok(String::new());
    }
    let lines: Vec<String> = reply
        .recipes
        .iter()
        .map(|r| {
            serde_json::json!({
                "id": r.id,
                "cwd": r.cwd,
                "args": r.args,
                "outputs": r.outputs,
                "relinks": r.relinks,
                "followed": r.followed,
            })
            .to_string()
        })
        .collect();
    Ok(lines.join("\n"))
}

/// The argument lists of `watch -- A… -- B…`.
fn targets(args: Vec<String>) -> Vec<Vec<String>> {
    args.split(|a| a == "--").filter(|t| !t.is_empty()).map(<[String]>::to_vec).collect()
}

async fn watch(socket: &Path, args: Vec<String>) -> Result<(), String> {
    let targets = targets(args);
    if targets.is_empty() {
        return Err("no link to watch (nvlink's arguments after --)".into());
    }
    let cwd = std::env::current_dir().map_err(|e| format!("no working directory: {e}"))?;
    let md = std::fs::metadata(&cwd).map_err(|e| format!("{}: {e}", cwd.display()))?;
    let record = OverlayRecord::of_current_exe();
    let toolkit = record
        .as_ref()
        .and_then(|r| r.cuda_home.clone())
        .or_else(|| std::env::var_os("CUDA_HOME").filter(|v| !v.is_empty()).map(PathBuf::from));
    let nvlink = real_nvlink(record.as_ref(), toolkit.as_deref());
    // The release the daemon must link with: that of the nvlink this watch
    // stands for (empty: the daemon's default toolkit).
    let release = nvlink.as_deref().and_then(release_of).unwrap_or_default();
    let mut client = control::connect(socket).await?;
    let library_path = std::env::var("LIBRARY_PATH").ok();
    let policies: Vec<Policy> =
        targets.iter().map(|a| Policy::new(a, &cwd, library_path.as_deref(), toolkit.as_deref())).collect();
    let mut streams = tokio_stream::StreamMap::new();
    for (i, args) in targets.iter().enumerate() {
        let start = Start {
            args: args.clone(),
            cwd: cwd.to_string_lossy().into_owned(),
            env: RELEVANT_ENV.iter().filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v))).collect(),
            toolkit_release: release.clone(),
            cwd_dev: md.dev(),
            cwd_ino: md.ino(),
            ..Default::default()
        };
        let events = client.watch(start).await.map_err(|s| format!("link {i}: {}", s.message()))?.into_inner();
        streams.insert(i, events);
    }
    loop {
        tokio::select! {
            m = tokio_stream::StreamExt::next(&mut streams) => match m {
                Some((i, Ok(ev))) => report(&ev, i, &targets[i], &policies[i], &cwd, nvlink.as_deref()),
                Some((i, Err(s))) => return Err(format!("link {i}: {}", s.message())),
                None => return Err("the daemon ended the watch (stopped?)".into()),
            },
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

/// Write one result's outputs (or run the real nvlink for a fallback) and
/// print its event line.
fn report(ev: &WatchEvent, target: usize, args: &[String], policy: &Policy, cwd: &Path, nvlink: Option<&Path>) {
    let empty = LinkResult::default();
    let r = ev.result.as_ref().unwrap_or(&empty);
    let mut written = Vec::new();
    let mut errors = Vec::new();
    let mut exit_code = r.exit_code;
    let diagnostics;
    if r.fallback {
        // nvlink writes its outputs itself, and prints its own messages (to
        // stderr here: stdout is for the events), read for the line too.
        let ran = nvlink.ok_or_else(|| "no real nvlink known (set NVLINKD_REAL_NVLINK)".to_string()).and_then(|n| {
            std::process::Command::new(n).args(args).output().map_err(|e| format!("{}: {e}", n.display()))
        });
        match ran {
            Ok(out) => {
                let mut err = std::io::stderr().lock();
                let _ = err.write_all(&out.stdout);
                let _ = err.write_all(&out.stderr);
                exit_code = out.status.code().unwrap_or(-1);
                diagnostics = diagnostic_fields(&out.stdout, &out.stderr, Some(cwd), args);
            }
            Err(e) => {
                errors.push(e);
                diagnostics = Vec::new();
            }
        }
    } else {
        diagnostics = diagnostic_fields(&r.stdout, &r.stderr, Some(cwd), args);
        (written, errors) = write_outputs(&r.outputs, policy);
        // nvlink's own messages, as it would print them (stdout kept for
        // events), control characters escaped.
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(control::printable(&String::from_utf8_lossy(&r.stdout)).as_bytes());
        let _ = err.write_all(control::printable(&String::from_utf8_lossy(&r.stderr)).as_bytes());
    }
    let line = serde_json::json!({
        "event": if ev.relink == 0 { "linked" } else { "relinked" },
        "schema": SCHEMA,
        "link": ev.link,
        "target": target,
        "relink": ev.relink,
        "changed": ev.changed,
        "exit_code": exit_code,
        "engine": ev.engine,
        "ms": (ev.ms * 10.0).round() / 10.0,
        "outputs": written,
        "write_errors": errors,
        "fallback": r.fallback,
        "fallback_reason": r.fallback.then_some(&r.fallback_reason),
        "diagnostics": diagnostics,
    });
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Write the outputs the link's command line names (`policy`); the paths
/// written, and an error for each output not written (another path the
/// daemon named is refused, not written).
fn write_outputs(outputs: &[OutputFile], policy: &Policy) -> (Vec<String>, Vec<String>) {
    let (mut written, mut errors) = (Vec::new(), Vec::new());
    for f in outputs {
        let path = Path::new(&f.path);
        if !policy.may_write(path, f.append) {
            errors.push(format!("{}: not an output of this link; not written", control::printable(&f.path)));
            continue;
        }
        let done = if f.append { append(path, &f.data) } else { nvlinkd_fs::write_atomically(path, &f.data) };
        match done {
            Ok(()) => written.push(f.path.clone()),
            Err(e) => errors.push(format!("{}: {e}", f.path)),
        }
    }
    (written, errors)
}

fn append(path: &Path, data: &[u8]) -> std::io::Result<()> {
    std::fs::OpenOptions::new().create(true).append(true).open(path)?.write_all(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `watch` writes only the outputs its own command line names: a path
    /// the daemon adds (a shell's rc file, any file of the user's) is a write
    /// error of the line, and the file is untouched.
    #[test]
    fn watch_writes_only_the_outputs_its_command_line_names() {
        let dir = std::env::temp_dir().join(format!("nvlinkd-watch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bashrc = dir.join(".bashrc");
        std::fs::write(&bashrc, b"# mine\n").unwrap();
        let args: Vec<String> =
            ["--arch=sm_90", "a.o", "-o", "out.cubin", "-time", "t.csv"].iter().map(|a| a.to_string()).collect();
        let policy = Policy::new(&args, &dir, None, None);
        let file = |path: &Path, append: bool| OutputFile {
            path: path.display().to_string(),
            data: b"bytes".to_vec().into(),
            append,
            ..Default::default()
        };
        let outputs = [
            file(&dir.join("out.cubin"), false),
            file(&dir.join("t.csv"), true),
            file(&bashrc, true),
            file(&dir.join("notes.txt"), false),
            // The -time file replaced, the -o file appended to: not as nvlink would.
            file(&dir.join("t.csv"), false),
            file(&dir.join("out.cubin"), true),
        ];
        let (written, errors) = write_outputs(&outputs, &policy);
        assert_eq!(written.len(), 2, "{written:?} {errors:?}");
        assert_eq!(errors.len(), 4, "{errors:?}");
        assert!(errors.iter().all(|e| e.contains("not an output of this link")), "{errors:?}");
        assert_eq!(std::fs::read(&bashrc).unwrap(), b"# mine\n");
        assert!(!dir.join("notes.txt").exists());
        assert_eq!(std::fs::read(dir.join("out.cubin")).unwrap(), b"bytes");
        assert_eq!(std::fs::read(dir.join("t.csv")).unwrap(), b"bytes");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
