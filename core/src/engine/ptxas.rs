//! The toolkit's ptxas, run as a process.
//!
//! Used for the compile steps nvlink does with its embedded ptxas: PTX modules
//! compiled at link time (`-arch sm_XY -m64 -c`, a relocatable cubin carrying the
//! same tool note nvlink's embedded ptxas writes) and the whole-program compile
//! of LTO (`-arch sm_XY -m64`, whose output is byte for byte nvlink's `-dlto`
//! output). A separate process keeps a crash in the compiler out of the daemon;
//! its start-up (tens of milliseconds) is small beside the compile.
//!
//! ptxas writes into a scratch directory; a full or read-only disk there is a
//! fault of the daemon's environment, never a compile result (see
//! `engine::process`). It runs under the link's [`Cancel`] and the daemon's
//! time limit, like the worker processes: a cancelled link kills its ptxas at
//! once, and a killed ptxas never yields an artifact.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use super::process::{self, Scratch};
use crate::confine::Policy;
use crate::declined::{Declined, Reason};
use crate::toolkit::Toolkit;
use crate::worker::Cancel;

/// Compile `ptx` with `args` (the input and `-o` are added). A scratch
/// directory that fails for lack of space or permission is replaced by the
/// system's temporary directory; a ptxas that could not do its work for
/// reasons of the environment (see [`super::process`]) never yields an
/// artifact, so nothing it produced is cached.
pub fn compile(
    tk: &Toolkit,
    ptx: &[u8],
    args: &[String],
    scratch_parent: &Path,
    cancel: &Cancel,
    limit: Duration,
    confine: &Policy,
) -> Result<Vec<u8>, Declined> {
    let (cubin, warnings) = compile_with_warnings(tk, ptx, args, scratch_parent, cancel, limit, confine)?;
    if !warnings.is_empty() {
        // Messages would have to be nvlink's; let nvlink speak.
        return Err(Declined::new(Reason::Tool, "ptxas printed messages"));
    }
    Ok(cubin)
}

/// [`compile`], also answering ptxas's warnings (`ptxas warning : …` lines on
/// stderr, which nvlink's embedded ptxas prints the same); any other message
/// declines.
pub fn compile_with_warnings(
    tk: &Toolkit,
    ptx: &[u8],
    args: &[String],
    scratch_parent: &Path,
    cancel: &Cancel,
    limit: Duration,
    confine: &Policy,
) -> Result<(Vec<u8>, Vec<String>), Declined> {
    let parents = process::scratch_parents(scratch_parent);
    let compiled = process::retry_in_scratch("ptxas", &parents, |parent| {
        if cancel.is_cancelled() {
            return Err(Failure::Tool(Declined::new(Reason::Worker, "the link was cancelled")));
        }
        compile_in(tk, ptx, args, parent, cancel, limit, confine)
    });
    compiled.map_err(|failure| match failure {
        Failure::Environment(why) => Declined::new(Reason::Environment, format!("ptxas environment fault: {why}")),
        Failure::Tool(declined) => declined,
    })
}

enum Failure {
    Environment(String),
    Tool(Declined),
}

impl process::ScratchFailure for Failure {
    fn environment(why: String) -> Self {
        Failure::Environment(why)
    }
    fn as_environment(&self) -> Option<&str> {
        match self {
            Failure::Environment(why) => Some(why),
            Failure::Tool(_) => None,
        }
    }
}

fn compile_in(
    tk: &Toolkit,
    ptx: &[u8],
    args: &[String],
    scratch_parent: &Path,
    cancel: &Cancel,
    limit: Duration,
    confine: &Policy,
) -> Result<(Vec<u8>, Vec<String>), Failure> {
    let env = |what: &str, e: std::io::Error| Failure::Environment(format!("{what}: {e}"));
    let _ = std::fs::create_dir_all(scratch_parent);
    let scratch = Scratch::new(scratch_parent).map_err(|e| env("scratch", e))?;
    let input = scratch.0.join("module.ptx");
    let output = scratch.0.join("module.cubin");
    // ptxas reads text: a trailing NUL (fatbin members carry one) is not PTX.
    let text = ptx.strip_suffix(&[0]).unwrap_or(ptx);
    std::fs::write(&input, text).map_err(|e| env("scratch", e))?;
    // ptxas parses a client's PTX: confined to the toolkit and its scratch; a
    // background link's at idle CPU priority (`sched.rs`).
    confine.hand_over(&[&scratch.0]).map_err(|e| env("sandbox user", e))?;
    let mut read = crate::confine::toolkit_reads(&tk.root);
    read.extend(tk.ptxas().canonicalize().ok().and_then(|p| p.parent().map(Path::to_owned)));
    let idle = cancel.priority() == crate::sched::Priority::Background;
    let mut cmd = confine.command(&tk.ptxas(), &read, &[&scratch.0], idle).map_err(Failure::Environment)?;
    let child = cmd
        .args(args)
        .arg(&input)
        .arg("-o")
        .arg(&output)
        .env("TMPDIR", &scratch.0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| env("cannot run ptxas", e))?;
    let out = cancel.supervise(child, limit).map_err(|e| env("ptxas", e))?;
    if out.status.code().is_none() {
        // Cancelled, over the time limit, or a crash: no artifact, and no
        // second run elsewhere (it would take as long, or crash the same way).
        return Err(Failure::Tool(Declined::new(Reason::Tool, format!("ptxas killed: {:?}", out.status))));
    }
    if let Some(why) = process::blames_environment(&out.stdout, &out.stderr, &scratch.0) {
        return Err(Failure::Environment(why));
    }
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(Failure::Tool(Declined::new(
            Reason::Tool,
            format!("ptxas failed: {}", err.lines().next().unwrap_or("")),
        )));
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let warnings: Vec<String> = stderr.lines().map(str::to_owned).collect();
    if !out.stdout.is_empty() || !stderr.ends_with('\n') && !stderr.is_empty() {
        return Err(Failure::Tool(Declined::new(Reason::Tool, "ptxas printed messages")));
    }
    if warnings.iter().any(|w| !w.starts_with("ptxas warning : ")) {
        // Messages would have to be nvlink's; let nvlink speak.
        return Err(Failure::Tool(Declined::new(Reason::Tool, "ptxas printed messages other than warnings")));
    }
    match process::read_tool_output(&output) {
        Ok(cubin) if !cubin.is_empty() => Ok((cubin, warnings)),
        Ok(_) => Err(Failure::Environment("ptxas exited 0 and its output is empty".into())),
        Err(e) => Err(env("ptxas output", e)),
    }
}

/// A whole-program compile's artifact: ptxas's cubin and the warnings it
/// printed, framed as `u32 n_warning_bytes`, the warnings (one per line, each
/// ending in a newline), then the cubin.
pub struct Warned<'a> {
    pub cubin: &'a [u8],
    pub warnings: Vec<String>,
}

impl<'a> Warned<'a> {
    pub fn encode(cubin: &[u8], warnings: &[String]) -> Vec<u8> {
        let text: String = warnings.iter().map(|w| format!("{w}\n")).collect();
        let mut v = Vec::with_capacity(4 + text.len() + cubin.len());
        v.extend_from_slice(&(text.len() as u32).to_le_bytes());
        v.extend_from_slice(text.as_bytes());
        v.extend_from_slice(cubin);
        v
    }

    /// The parts of an encoded artifact; `None` for bytes `encode` did not write.
    pub fn decode(bytes: &'a [u8]) -> Option<Warned<'a>> {
        let n = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
        let text = std::str::from_utf8(bytes.get(4..4usize.checked_add(n)?)?).ok()?;
        let cubin = &bytes[4 + n..];
        if cubin.is_empty() || !text.is_empty() && !text.ends_with('\n') {
            return None;
        }
        Some(Warned { cubin, warnings: text.lines().map(str::to_owned).collect() })
    }
}

#[cfg(test)]
mod tests {
    use super::Warned;

    #[test]
    fn a_compile_artifact_keeps_its_cubin_and_warnings() {
        let w =
            vec!["ptxas warning : Stack size for entry function '_Z1kv' cannot be statically determined".to_owned()];
        for warnings in [Vec::new(), w] {
            let bytes = Warned::encode(b"\x7fELF cubin", &warnings);
            let back = Warned::decode(&bytes).expect("decodes");
            assert_eq!((back.cubin, back.warnings), (&b"\x7fELF cubin"[..], warnings));
        }
        assert!(Warned::decode(b"\x7fELF").is_none(), "a bare cubin is not an artifact of this kind");
        assert!(Warned::decode(&[0, 0, 0, 0]).is_none(), "no cubin");
        assert!(Warned::decode(&[3, 0, 0, 0, b'a', b'b', b'c', 1]).is_none(), "a warning without its newline");
    }
}
