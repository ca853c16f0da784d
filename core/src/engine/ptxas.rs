//! The toolkit's ptxas, run as a process.
//!
//! Used for the compile steps nvlink does with its embedded ptxas: PTX modules
//! compiled at link time (`-arch sm_XY -m64 -c`, a relocatable cubin carrying the
//! same tool note nvlink's embedded ptxas writes) and the whole-program compile
//! of LTO (`-arch sm_XY -m64`, whose output is byte for byte nvlink's `-dlto`
//! output). A separate process keeps a crash in the compiler out of the daemon;
//! its start-up (tens of milliseconds) is small beside the compile.

use std::path::Path;
use std::process::Command;

use super::inprocess::Unsupported;
use super::process::Scratch;
use crate::toolkit::Toolkit;

/// Compile `ptx` with `args` (the input and `-o` are added).
pub fn compile(tk: &Toolkit, ptx: &[u8], args: &[String], scratch_parent: &Path) -> Result<Vec<u8>, Unsupported> {
    let scratch = Scratch::new(scratch_parent).map_err(|e| Unsupported(format!("scratch: {e}")))?;
    let input = scratch.0.join("module.ptx");
    let output = scratch.0.join("module.cubin");
    // ptxas reads text: a trailing NUL (fatbin members carry one) is not PTX.
    let text = ptx.strip_suffix(&[0]).unwrap_or(ptx);
    std::fs::write(&input, text).map_err(|e| Unsupported(format!("scratch: {e}")))?;
    let out = Command::new(tk.ptxas())
        .args(args)
        .arg(&input)
        .arg("-o")
        .arg(&output)
        .output()
        .map_err(|e| Unsupported(format!("cannot run ptxas: {e}")))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(Unsupported(format!("ptxas failed: {}", err.lines().next().unwrap_or(""))));
    }
    if !out.stderr.is_empty() || !out.stdout.is_empty() {
        // Messages would have to be nvlink's; let nvlink speak.
        return Err(Unsupported("ptxas printed messages".into()));
    }
    std::fs::read(&output).map_err(|e| Unsupported(format!("ptxas output: {e}")))
}
