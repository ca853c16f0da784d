//! The `--register-link-binaries` file: the registration functions nvcc's
//! generated host code must call, one per linked module.
//!
//! ```text
//! #define NUM_PRELINKED_OBJECTS 2
//! DEFINE_REGISTER_FUNC(_144e65d5_4_a_cu_514b6f4c)
//! DEFINE_REGISTER_FUNC(_06fbca3b_4_b_cu_587774ad)
//! ```
//! Host objects name their module in `__nv_module_id`; device-only inputs
//! (cubins, PTX) get an id made from their absolute path.

use std::path::{Path, PathBuf};

use crate::cli::spec::{Mode, Spec};
use crate::fs::InputFs;
use crate::request::OutputFile;

/// The module id nvlink makes up for an input without host code:
/// its absolute path with every byte outside `[A-Za-z0-9]` replaced by `_`.
pub(crate) fn synthetic_module_id(absolute: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    // Byte by byte, as nvlink maps it: `é` (two bytes in UTF-8) is `__`.
    absolute.as_os_str().as_bytes().iter().map(|&b| if b.is_ascii_alphanumeric() { b as char } else { '_' }).collect()
}

/// `data` (a registration file) with `prefix` removed from the start of every
/// module id: nvlink ran on files under a directory the caller does not have
/// (a sandbox), whose synthetic ids are `synthetic_module_id(dir)` followed
/// by the caller's own (the mapping is byte by byte, so the id of
/// `dir` + `path` is the id of `dir` then the id of `path`).
pub(crate) fn strip_id_prefix(data: &[u8], prefix: &str) -> Vec<u8> {
    let from = format!("DEFINE_REGISTER_FUNC({prefix}");
    let (from, to) = (from.as_bytes(), b"DEFINE_REGISTER_FUNC(");
    let mut out = Vec::with_capacity(data.len());
    let mut i = 0;
    while i < data.len() {
        if data[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(data[i]);
            i += 1;
        }
    }
    out
}

/// The file's contents for these module ids, in link order.
pub(crate) fn render(ids: &[String]) -> String {
    let mut out = format!("#define NUM_PRELINKED_OBJECTS {}\n", ids.len());
    for id in ids {
        out.push_str(&format!("DEFINE_REGISTER_FUNC({id})\n"));
    }
    out
}

/// The file an in-process link writes at `path` for these module ids (in
/// load order), as nvlink does: whole-program LTO registers in reverse load
/// order; under `-dlto` an existing file is left as it is when there is
/// anything to list; `--emit-ptx` writes none.
pub fn output(path: &Path, spec: &Spec, mode: Mode, mut ids: Vec<String>, fs: &dyn InputFs) -> Option<OutputFile> {
    if mode == Mode::LtoWhole {
        ids.reverse();
    }
    let keep_existing = spec.lto && !ids.is_empty() && fs.stat(path).is_ok();
    if mode == Mode::LtoEmitPtx || keep_existing {
        return None;
    }
    Some(OutputFile { path: PathBuf::from(path), data: render(&ids).into_bytes().into(), append: false })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_like_nvlink() {
        assert_eq!(
            render(&["_a".into(), "_b".into()]),
            "#define NUM_PRELINKED_OBJECTS 2\nDEFINE_REGISTER_FUNC(_a)\nDEFINE_REGISTER_FUNC(_b)\n"
        );
        assert_eq!(synthetic_module_id(Path::new("/tmp/c/dp.ptx")), "_tmp_c_dp_ptx");
    }

    /// A sandbox's synthetic ids are its own id then the caller's: removing
    /// the first gives the ids nvlink writes for the caller's paths.
    #[test]
    fn sandbox_ids_lose_the_sandbox() {
        let root = Path::new("/var/c/tmp/nvlinkd_12_3_ab-c/root");
        let caller = Path::new("/w/p-q/scale.cubin");
        let sandboxed = root.join(caller.strip_prefix("/").unwrap());
        let prefix = synthetic_module_id(root);
        let file = render(&["_1b2_x_cu_9".into(), synthetic_module_id(&sandboxed)]);
        let want = render(&["_1b2_x_cu_9".into(), synthetic_module_id(caller)]);
        assert_eq!(String::from_utf8(strip_id_prefix(file.as_bytes(), &prefix)).unwrap(), want);
    }
}
