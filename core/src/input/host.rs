//! Host relocatable objects that carry device code (`nvcc -dc` output).
//!
//! The pieces nvlink reads from a host object:
//! - `__nv_relfatbin`: the fatbin with the object's relocatable device code;
//!   `.nv_fatbin` holds whole-program (non-`-rdc`) code, which is not linked;
//! - `__nv_module_id`: the module id, for `--register-link-binaries`;
//! - `.nvHRKE .nvHRKI .nvHRDE .nvHRDI .nvHRCE .nvHRCI`: NUL-separated name
//!   patterns of the kernels, device variables and constants the host code
//!   references (external / internal linkage), used to remove dead device code.

use crate::elf::Elf;

/// Device names host code refers to, as glob patterns (`_Z10accumulate*`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostRefs {
    pub kernels_external: Vec<String>,
    pub kernels_internal: Vec<String>,
    pub variables_external: Vec<String>,
    pub variables_internal: Vec<String>,
    pub constants_external: Vec<String>,
    pub constants_internal: Vec<String>,
}

impl HostRefs {
    pub(crate) fn kernel_patterns(&self) -> impl Iterator<Item = &str> {
        self.kernels_external.iter().chain(&self.kernels_internal).map(String::as_str)
    }
}

/// What nvlink uses from a host object.
#[derive(Clone, Debug, Default)]
pub struct HostObject<'a> {
    /// Contents of `__nv_module_id`: one NUL-terminated id per linked object.
    pub module_id_section: Option<&'a [u8]>,
    /// Contents of `__nv_relfatbin`, if present.
    pub relfatbin: Option<&'a [u8]>,
    /// Whether `.nv_fatbin` (whole-program device code) is present.
    pub has_nv_fatbin: bool,
    /// `None` when the object has no `.nvHR*` sections at all.
    pub host_refs: Option<HostRefs>,
}

fn patterns(data: &[u8]) -> Vec<String> {
    data.split(|&b| b == 0).filter(|s| !s.is_empty()).map(|s| String::from_utf8_lossy(s).into_owned()).collect()
}

impl<'a> HostObject<'a> {
    pub fn read(elf: &Elf<'a>) -> Self {
        let sec = |n: &str| elf.section_data_by_name(n);
        let module_id_section = sec("__nv_module_id");
        let hr = ["nvHRKE", "nvHRKI", "nvHRDE", "nvHRDI", "nvHRCE", "nvHRCI"].map(|n| sec(&format!(".{n}")));
        let host_refs = hr.iter().any(Option::is_some).then(|| {
            let get = |i: usize| hr[i].map(patterns).unwrap_or_default();
            HostRefs {
                kernels_external: get(0),
                kernels_internal: get(1),
                variables_external: get(2),
                variables_internal: get(3),
                constants_external: get(4),
                constants_internal: get(5),
            }
        });
        HostObject {
            module_id_section,
            relfatbin: sec("__nv_relfatbin"),
            has_nv_fatbin: elf.section(".nv_fatbin").is_some(),
            host_refs,
        }
    }
}

impl HostObject<'_> {
    /// The module ids, in order (an `ld -r` object carries several).
    pub(crate) fn module_ids(&self) -> Vec<String> {
        self.module_id_section.map(patterns).unwrap_or_default()
    }
}

/// Glob match as nvlink applies host-reference patterns: `*` matches any run
/// of characters, everything else matches itself.
pub(crate) fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    let (mut pi, mut ni) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ni < n.len() {
        if pi < p.len() && p[pi] != b'*' && p[pi] == n[ni] {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == b'*' {
        pi += 1;
    }
    pi == p.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("_Z10accumulate*", "_Z10accumulatePfPKfi"));
        assert!(!glob_match("_Z10accumulate*", "_Z13unused_kernelPf"));
        assert!(glob_match("__nv_static_51__x_*16memcpy_3d_device*", "__nv_static_51__x__Z16memcpy_3d_deviceIjEv"));
        assert!(glob_match("*", ""));
        assert!(!glob_match("a", ""));
        assert!(glob_match("a*b*c", "aXXbYYc"));
    }
}
