//! Predicting the links a build is about to ask for.
//!
//! nvcc (and CMake through it) device-links a multi-arch build with one nvlink
//! call per target arch, one after the other: the same inputs, `-report-arch`,
//! `--arch` of that target and an output named after it
//! (`…_dlink.compute_80.cubin`, then `…_dlink.compute_90.cubin`). The inputs
//! say which archs are coming: every host object carries its device code in a
//! fatbin with one member per `-gencode` target. [`sibling_archs`] predicts
//! the other archs' command lines from the first one, so that the daemon can
//! link them in the background while nvcc is still waiting for the first.
//!
//! A prediction is never trusted for its bytes. A speculative link is an
//! ordinary link of the predicted command line, computed by the same engines
//! from the same files, and its result is stored as an ordinary whole-link
//! cache entry under the predicted request's own key; the real call later
//! computes *its* key from *its* command line and files, and is served from
//! the entry only when the two keys are equal. A wrong guess costs CPU time,
//! never bytes. Nothing speculative is written to the caller's files (the
//! outputs of a speculative link go only into the cache).
//!
//! [`watched_inputs`] lists what a link reads from the caller's files, for
//! the daemon's `--watch` (relink when one of them changes).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::cli::options::Opt;
use crate::cli::parse::{parse, ArgPos};
use crate::cli::spec::{Mode, Spec};
use crate::cli::target::arch_name;
use crate::elf::Elf;
use crate::fatbin::{self, MemberKind};
use crate::fs::InputFs;
use crate::input::host::HostObject;
use crate::request::Request;

/// Most sibling archs predicted from one link.
pub const MAX_SIBLINGS: usize = 8;

/// The links predicted from one real link of a multi-arch build.
#[derive(Debug)]
pub struct Siblings {
    /// Names the build step independently of the arch: the working directory,
    /// the arguments with the arch-dependent values left out, and the
    /// identities of the inputs. Calls of one nvcc step for several archs share
    /// it; a rebuild (new or rewritten inputs) does not.
    pub family: [u8; 32],
    /// The arch of the link the prediction started from (`sm_80`).
    pub arch: String,
    /// The predicted links of the other archs, with their arch.
    pub links: Vec<(String, Request)>,
}

/// Whether `spec` is a per-arch device link of nvcc's (what multi-arch
/// speculation predicts from): a device link with `-report-arch`, `--arch`
/// of a real target, an output file, no `-time` table and no options file.
fn per_arch_device_link(spec: &Spec) -> bool {
    spec.report_arch
        && spec.target().is_some()
        && spec.output.is_some()
        && spec.time.is_none()
        && !spec.parsed.options.iter().any(|o| o.id == Opt::OptionsFile || o.at.is_none())
        && matches!(spec.mode(), Ok(Mode::Executable | Mode::Relocatable | Mode::LtoWhole | Mode::LtoPartial))
}

/// The archs (`sm_90`, `sm_90a`) for which a host object carries linkable
/// device code (SASS or LTO IR); `None` for anything that is not a host
/// object with a fatbin.
fn host_object_archs(data: &[u8]) -> Option<BTreeSet<String>> {
    let elf = Elf::parse(data).ok()?;
    if elf.is_cubin() {
        return None;
    }
    let fatbin = HostObject::read(&elf).relfatbin?;
    let members = fatbin::parse_first(fatbin).ok()?;
    let archs: BTreeSet<String> = members
        .iter()
        .filter(|m| matches!(m.kind, MemberKind::Cubin | MemberKind::LtoIr))
        .map(|m| arch_name("sm", m.arch, m.suffix()))
        .collect();
    (!archs.is_empty()).then_some(archs)
}

/// `text` with every `old` arch token (`sm_80`, `compute_80`, `lto_80`)
/// replaced by the same kind of token for `new`; a token only counts when no
/// letter or digit follows it (`sm_80` is not in `sm_800`).
fn swap_arch_tokens(text: &str, old_sm: &str, new_sm: &str) -> String {
    let mut out = text.to_owned();
    for kind in ["sm_", "compute_", "lto_"] {
        let (old, new) = (format!("{kind}{old_sm}"), format!("{kind}{new_sm}"));
        let mut result = String::with_capacity(out.len());
        let mut rest = out.as_str();
        while let Some(i) = rest.find(&old) {
            let after = &rest[i + old.len()..];
            let whole = !after.starts_with(|c: char| c.is_ascii_alphanumeric());
            result.push_str(&rest[..i]);
            result.push_str(if whole { &new } else { &old });
            rest = after;
        }
        result.push_str(rest);
        out = result;
    }
    out
}

/// Replace an option's value in argv, wherever it sits.
fn substitute(args: &mut [String], at: ArgPos, old: &str, new: &str) {
    crate::engine::process::substitute(args, at, old, new)
}

/// The other archs' links of the nvcc step `req` belongs to, when `req` is a
/// per-arch device link (see [`per_arch_device_link`]) whose host-object
/// inputs all carry device code for further archs: the same request with the
/// arch swapped in `--arch` and in the output's name.
///
/// Under `-dlto` nvlink leaves an existing `--register-link-binaries` file
/// alone, and the whole-link key says whether it exists. nvcc's later calls
/// find the file the first call wrote, so the predicted links name
/// `existing_register` (a file the daemon keeps) instead: their keys then say
/// "exists", as the real later calls' keys will.
///
/// `known` is asked about the step's family before any input is read: a
/// family already predicted (nvcc's later calls of the same step) is `None`
/// at the cost of a few stats.
pub fn sibling_archs(
    req: &Request,
    fs: &dyn InputFs,
    existing_register: &Path,
    known: &dyn Fn(&[u8; 32]) -> bool,
) -> Option<Siblings> {
    if req.speculative || !req.shared_fs {
        return None;
    }
    let spec =
        parse(&req.args, fs, &req.cwd).ok().and_then(|p| Spec::from_parsed(p, &req.cwd, library_path(req)).ok())?;
    if !per_arch_device_link(&spec) {
        return None;
    }
    let own = spec.target()?.name();
    let own_sm = own.strip_prefix("sm_")?.to_owned();
    // The step: the arguments with the arch-dependent values blanked, and
    // the inputs' identities.
    let mut family = blake3::Hasher::new();
    family.update(req.cwd.as_os_str().as_encoded_bytes());
    let mut plain = req.args.clone();
    for o in &spec.parsed.options {
        if let (Some(at), Some(v)) = (o.at, o.value.as_deref()) {
            if matches!(o.id, Opt::Arch | Opt::OutputFile | Opt::RegisterLinkBinaries) {
                substitute(&mut plain, at, v, "");
            }
        }
    }
    for a in &plain {
        family.update(a.as_bytes()).update(b"\0");
    }
    for input in &spec.files.inputs {
        let id = fs.identity(&input.path)?;
        family.update(format!("{}\0{id:?}\0", input.given).as_bytes());
    }
    let family = *family.finalize().as_bytes();
    if known(&family) {
        return None;
    }
    // The archs every host object carries (nvcc compiled them with one list).
    let mut common: Option<BTreeSet<String>> = None;
    for input in &spec.files.inputs {
        let Some(archs) = fs.read(&input.path).ok().and_then(|d| host_object_archs(&d)) else {
            continue;
        };
        common = Some(match common {
            None => archs,
            Some(c) => c.intersection(&archs).cloned().collect(),
        });
    }
    let others: Vec<String> = common?.into_iter().filter(|a| *a != own).take(MAX_SIBLINGS).collect();
    let existing_register = existing_register.to_string_lossy();
    let mut links = Vec::new();
    for arch in others {
        let Some(sm) = arch.strip_prefix("sm_") else { continue };
        let mut args = req.args.clone();
        for o in &spec.parsed.options {
            let (Some(at), Some(v)) = (o.at, o.value.as_deref()) else { continue };
            match o.id {
                Opt::Arch => substitute(&mut args, at, v, &arch),
                Opt::OutputFile => substitute(&mut args, at, v, &swap_arch_tokens(v, &own_sm, sm)),
                Opt::RegisterLinkBinaries if spec.lto => substitute(&mut args, at, v, &existing_register),
                _ => {}
            }
        }
        // Only a command line nvlink takes as the same kind of link.
        let predicted =
            parse(&args, fs, &req.cwd).ok().and_then(|p| Spec::from_parsed(p, &req.cwd, library_path(req)).ok());
        if !predicted.is_some_and(|p| per_arch_device_link(&p) && p.target().map(|t| t.name()) == Some(arch.clone())) {
            continue;
        }
        links.push((arch, Request { args, speculative: true, ..req.clone() }));
    }
    Some(Siblings { family, arch: own, links })
}

/// The caller's `LIBRARY_PATH`, as the request carries it.
fn library_path(req: &Request) -> Option<&str> {
    req.env.get("LIBRARY_PATH").map(String::as_str)
}

/// The caller's files a link reads (absolute): its inputs, every existing
/// candidate of each `-l` search, and its options files. `None` for links the daemon does
/// not relink on its own (no output, `-time` tables, not a device link).
pub fn watched_inputs(req: &Request, fs: &dyn InputFs) -> Option<Vec<PathBuf>> {
    let spec =
        parse(&req.args, fs, &req.cwd).ok().and_then(|p| Spec::from_parsed(p, &req.cwd, library_path(req)).ok())?;
    if spec.output.is_none()
        || spec.time.is_some()
        || !matches!(
            spec.mode(),
            Ok(Mode::Executable | Mode::Relocatable | Mode::LtoWhole | Mode::LtoPartial | Mode::LtoEmitPtx)
        )
    {
        return None;
    }
    // Every file that may change the answer: the inputs, the options files,
    // and each library candidate that exists (which one links is decided by
    // reading them, see `load.rs`).
    let mut files: Vec<PathBuf> = spec.files.input_paths();
    files.extend(spec.files.options_files.iter().map(|n| n.path.clone()));
    for search in &spec.files.libraries {
        for candidate in &search.candidates {
            match fs.stat(&candidate.path) {
                Ok(st) if st.is_dir => break,
                Ok(_) => files.push(candidate.path.clone()),
                Err(_) => {}
            }
        }
    }
    files.sort();
    files.dedup();
    Some(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_tokens_are_swapped_whole() {
        let rows = [
            ("/tmp/tmpxft_1-5_d.compute_80.cubin", "/tmp/tmpxft_1-5_d.compute_90.cubin"),
            ("out.sm_80.cubin", "out.sm_90.cubin"),
            ("lto_80/x", "lto_90/x"),
            ("out.sm_800.cubin", "out.sm_800.cubin"),
            ("out.sm_80a.cubin", "out.sm_80a.cubin"),
            ("out.cubin", "out.cubin"),
            ("sm_80-sm_80", "sm_90-sm_90"),
        ];
        for (given, want) in rows {
            assert_eq!(swap_arch_tokens(given, "80", "90"), want, "{given}");
        }
    }
}
