//! The declarations of a PTX module: which kernels and functions it defines,
//! which symbols it needs from elsewhere, which variables it defines.
//!
//! LTO objects carry a PTX member beside their LTO IR; its declarations tell
//! the link plan the kernel names (for host-reference pruning) and whether the
//! LTO modules form a closed program, without reading LLVM bitcode.

/// Symbols declared by a PTX module.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PtxSymbols {
    pub kernels: Vec<String>,
    /// Functions defined here (not `.extern`).
    pub functions: Vec<String>,
    /// Functions and variables declared `.extern`.
    pub externs: Vec<String>,
    /// Variables defined here (`.global`, `.const`).
    pub variables: Vec<String>,
}

/// The identifier at the start of `s` (PTX identifiers: letters, digits, `_ $ %`).
fn ident(s: &str) -> Option<String> {
    let s = s.trim_start();
    let end = s.find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '%'))).unwrap_or(s.len());
    (end > 0).then(|| s[..end].to_owned())
}

/// The name after a `.func`/`.entry` keyword: skips a return-parameter group
/// `( ... )` when present.
fn function_name(after: &str) -> Option<String> {
    let rest = after.trim_start();
    let rest = match rest.strip_prefix('(') {
        Some(r) => &r[r.find(')')? + 1..],
        None => rest,
    };
    ident(rest)
}

pub fn symbols(text: &str) -> PtxSymbols {
    let mut out = PtxSymbols::default();
    for line in text.lines() {
        let line = line.split("//").next().unwrap_or("").trim();
        if !line.starts_with('.') {
            continue;
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let is_extern = words.first() == Some(&".extern");
        if let Some(at) = line.find(".entry") {
            if let Some(n) = function_name(&line[at + ".entry".len()..]) {
                out.kernels.push(n);
            }
        } else if let Some(at) = line.find(".func") {
            if let Some(n) = function_name(&line[at + ".func".len()..]) {
                if is_extern {
                    out.externs.push(n);
                } else {
                    out.functions.push(n);
                }
            }
        } else if words.iter().any(|w| *w == ".global" || *w == ".const") && line.ends_with(';') {
            // `.visible .global .align 4 .u32 hits;` / `.const .align 4 .b8 coeff[16];`
            let decl = line.trim_end_matches(';');
            let decl = decl.split('=').next().unwrap_or(decl).trim();
            let last = decl.split_whitespace().last().unwrap_or("");
            if let Some(n) = ident(last.split('[').next().unwrap_or(last)) {
                if is_extern {
                    out.externs.push(n);
                } else {
                    out.variables.push(n);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declarations() {
        let ptx = "\
.version 9.5
.target sm_90
.extern .func (.param .b32 func_retval0) _Z5scalef
(
.param .b32 _Z5scalef_param_0
)
;
.visible .global .align 4 .u32 hits;
.visible .const .align 4 .b8 coeff[16];
.global .align 4 .b8 lookup[64] = {1, 0, 0, 0};
.visible .entry _Z10accumulatePfPKfi(
.visible .func  (.param .b32 func_retval0) _Z5helperf(
.weak .func _Z4weakv()
";
        let s = symbols(ptx);
        assert_eq!(s.kernels, vec!["_Z10accumulatePfPKfi"]);
        assert_eq!(s.externs, vec!["_Z5scalef"]);
        assert_eq!(s.functions, vec!["_Z5helperf", "_Z4weakv"]);
        assert_eq!(s.variables, vec!["hits", "coeff", "lookup"]);
    }
}
