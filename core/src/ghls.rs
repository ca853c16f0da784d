//! `--gen-host-linker-script` (`-ghls`): host linker scripts that keep the CUDA
//! sections, without any device linking.
//!
//! `lcs-aug` writes a fixed SECTIONS block. `lcs-abs` (the default) asks the
//! host compiler which flags it passes to its linker, has `ld --verbose` print
//! its default script for them, appends the block and checks the result with
//! `ld -T`. The shell commands are nvlink's, character for character (they are
//! printed with `-v`), so the result is what nvlink would produce on this host.

use std::path::Path;
use std::process::Command;

use crate::cli::spec::{HostScript, Spec};
use crate::declined::{Declined, Reason};
use crate::diag::Report;

/// The block nvlink appends (the trailing space after `__nv_relfatbin`'s braces is nvlink's).
pub const SECTIONS_BLOCK: &str = "SECTIONS\n{\n\t.nvFatBinSegment : { *(.nvFatBinSegment) }\n\t__nv_relfatbin : { *(__nv_relfatbin) } \n\t.nv_fatbin : { *(.nv_fatbin) }\n}\n";

/// The `ld --verbose` pipeline for `lcs-abs`, writing to `dest`.
pub(crate) fn extract_command(spec: &Spec, dest: &str) -> String {
    let cc = spec.host_ccbin.as_deref().unwrap_or("gcc");
    let kind = if spec.shared {
        " -shared "
    } else if spec.relocatable {
        " -r "
    } else {
        ""
    };
    format!(
        "ld --verbose $({cc} -### /dev/null {kind} -m64  2>&1 | grep collect2  | grep -wo -e -pie -e \"-z [^[:space:]]*\" -e \"-m [^[:space:]]*\" -e -r -e -shared  | tr \"\\n\" \" \" ) | grep -Fvx -e \"$(ld -V)\" | sed '1,2d;$d' > {dest}"
    )
}

/// The validation command for a script at `path`.
pub(crate) fn validate_command(path: &str) -> String {
    format!("ld -T {path} 2>&1 | grep 'no input files' > /dev/null")
}

/// What a `-ghls` run produced.
pub struct Script {
    /// Contents for `-o`, or `None` when the script went to stdout.
    pub file: Option<Vec<u8>>,
}

/// The shell pipeline could not run or validation failed: let nvlink say it.
fn host_script(why: impl Into<String>) -> Declined {
    Declined::new(Reason::HostScript, why)
}

fn sh(cmd: &str, cwd: &Path) -> Result<bool, Declined> {
    Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .current_dir(cwd)
        .status()
        .map(|s| s.success())
        .map_err(|e| host_script(format!("cannot run sh: {e}")))
}

/// Produce the script; messages and stdout go to `report`.
pub(crate) fn generate(
    spec: &Spec,
    kind: HostScript,
    cwd: &Path,
    scratch: &Path,
    report: &mut Report,
) -> Result<Script, Declined> {
    let out = spec.output.as_deref();
    match kind {
        HostScript::Aug => match out {
            Some(_) => Ok(Script { file: Some(SECTIONS_BLOCK.as_bytes().to_vec()) }),
            None => {
                report.print(SECTIONS_BLOCK);
                Ok(Script { file: None })
            }
        },
        HostScript::Abs => {
            let tmp = scratch.join("host-linker-script");
            let tmp_s = tmp.to_string_lossy().into_owned();
            let shown = out.unwrap_or("/dev/stdout");
            if spec.verbose {
                report.emit_raw(&format!("#$ {}\n", extract_command(spec, shown)));
            }
            if !sh(&extract_command(spec, &tmp_s), cwd)? {
                return Err(host_script("host linker script extraction failed"));
            }
            let mut script = std::fs::read(&tmp).map_err(|e| host_script(e.to_string()))?;
            script.extend_from_slice(SECTIONS_BLOCK.as_bytes());
            if out.is_none() {
                report.print(&String::from_utf8_lossy(&script));
                return Ok(Script { file: None });
            }
            std::fs::write(&tmp, &script).map_err(|e| host_script(e.to_string()))?;
            if spec.verbose {
                report.emit_raw(&format!("#$ {}\n", validate_command(shown)));
            }
            if !sh(&validate_command(&tmp_s), cwd)? {
                return Err(host_script("ld rejected the host linker script"));
            }
            Ok(Script { file: Some(script) })
        }
    }
}
