//! nvlink's options as its `.note.nv.tkinfo` entry renders them.
//!
//! nvlink walks its option table in registration order (the order of
//! [`OPTIONS`], independent of argv order) and appends, for each option given:
//! `-<short> <value> ` for values (numbers normalized), `-<short>  ` for flags
//! (the same pattern with an empty value), `-<short> a,b ` for lists. Options
//! naming files (inputs, `-o`, `--register-link-binaries`, `-time`, `-optf`)
//! only appear in "verbose tkinfo" mode (`-g` or `--verbose-tkinfo true`), as
//! basenames; in that mode the entry's object name is the basename of `-o`.
//! Hidden options are never rendered.

use super::options::{Arity, Opt, ValueKind, OPTIONS};
use super::parse::{parse_c_long, Parsed};
use crate::finalize::tkinfo::Entry;
use crate::toolkit::Release;

fn basename(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

/// Whether nvlink renders file options (`-g` switches it on, `--verbose-tkinfo` overrides).
pub(crate) fn verbose_mode(parsed: &Parsed) -> bool {
    let mut on = false;
    for o in &parsed.options {
        match o.id {
            Opt::Debug => on = true,
            Opt::VerboseTkinfo => on = o.value.as_deref() == Some("true"),
            _ => {}
        }
    }
    on
}

/// The options string of nvlink's own entry.
pub(crate) fn options_string(parsed: &Parsed) -> String {
    let verbose = verbose_mode(parsed);
    let mut out = String::new();
    if verbose && !parsed.inputs.is_empty() {
        let names: Vec<&str> = parsed.inputs.iter().map(|i| basename(i)).collect();
        out.push_str(&names.join(","));
        out.push(' ');
    }
    for def in OPTIONS.iter().filter(|d| !d.hidden) {
        let given: Vec<&Option<String>> = parsed.options.iter().filter(|o| o.id == def.id).map(|o| &o.value).collect();
        if given.is_empty() {
            continue;
        }
        let file_option = matches!(def.id, Opt::OutputFile | Opt::RegisterLinkBinaries | Opt::Time | Opt::OptionsFile);
        if file_option && !verbose {
            continue;
        }
        if matches!(def.id, Opt::EmitPtx | Opt::GenHostLinkerScript | Opt::Help | Opt::Version | Opt::UidxFile) {
            continue;
        }
        let value = match (def.arity, def.id) {
            (_, Opt::OptionsFile) => String::new(),
            (Arity::Flag, _) => String::new(),
            (Arity::List, _) => {
                given.iter().filter_map(|v| v.as_deref()).filter(|v| !v.is_empty()).collect::<Vec<_>>().join(",")
            }
            (Arity::Single, _) => {
                let v = given.last().and_then(|v| v.as_deref()).unwrap_or("");
                match def.kind {
                    ValueKind::Number | ValueKind::NumberIn(_) => {
                        parse_c_long(v).map(|n| n.to_string()).unwrap_or_else(|| v.to_owned())
                    }
                    _ if file_option && v != "-" => basename(v).to_owned(),
                    _ => v.to_owned(),
                }
            }
        };
        out.push('-');
        out.push_str(def.short);
        out.push(' ');
        out.push_str(&value);
        out.push(' ');
    }
    out
}

/// nvlink's own tkinfo entry for a link with these options.
pub(crate) fn linker_entry(parsed: &Parsed, release: &Release) -> Entry {
    let verbose = verbose_mode(parsed);
    let output = parsed.options.iter().rev().find(|o| o.id == Opt::OutputFile).and_then(|o| o.value.as_deref());
    let tool = parsed
        .options
        .iter()
        .rev()
        .find(|o| o.id == Opt::ToolName)
        .and_then(|o| o.value.clone())
        .unwrap_or_else(|| "nvlink".to_owned());
    Entry {
        object: if verbose { output.map(basename).unwrap_or("").to_owned() } else { String::new() },
        tool,
        release: release.tools_line.clone(),
        build: release.build_line.clone(),
        options: options_string(parsed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::LocalFs;
    use std::path::Path;

    fn render(args: &[&str]) -> String {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        options_string(&super::super::parse::parse(&args, &LocalFs, Path::new("/")).unwrap())
    }

    #[test]
    fn nvcc_dlink_example() {
        // Observed in the real nvlink's output for nvcc's device-link command line.
        assert_eq!(
            render(&[
                "-m64",
                "--arch=sm_90",
                "-L/x/lib",
                "-cpu-arch=X86_64",
                "a.o",
                "b.o",
                "-lcudadevrt",
                "-o",
                "o.cubin",
                "--host-ccbin",
                "gcc"
            ]),
            "-arch sm_90 -m 64 -l cudadevrt -L /x/lib -cpu-arch X86_64 "
        );
        assert_eq!(
            render(&["--arch=sm_90", "a.o", "-o", "o", "-dlto", "-nvvmpath=/n"]),
            "-arch sm_90 -dlto  -nvvmpath /n "
        );
    }

    #[test]
    fn verbose_mode_renders_files_as_basenames() {
        assert_eq!(
            render(&["./x/a.o", "b.o", "-o", "d/o.cubin", "-g", "-arch", "sm_90"]),
            "a.o,b.o -o o.cubin -g  -arch sm_90 "
        );
        assert_eq!(render(&["-maxrregcount=0x28", "-arch", "sm_90", "-o", "o"]), "-arch sm_90 -maxrregcount 40 ");
    }
}
