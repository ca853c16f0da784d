//! nvlink's (and its ptxas's) message lines as structured diagnostics, for
//! the event stream and `nvlinkd watch`: what an editor needs for a problems
//! panel without parsing nvlink's text itself. The text stays nvlink's, byte
//! for byte, in `message`; the fields are read from it.
//!
//! A line `nvlink error   : Undefined reference to '_Z1fi' in 'liba.a:a.o'`
//! becomes
//!
//! ```text
//! {"severity":"error","tool":"nvlink","code":"undefined_reference",
//!  "message":"Undefined reference to '_Z1fi' in 'liba.a:a.o'",
//!  "symbol":"_Z1fi","symbol_demangled":"f(int)",
//!  "object":"liba.a","member":"a.o","object_path":"/src/liba.a"}
//! ```
//!
//! `code` names the message (a stable name per message text of nvlink;
//! `other` for the rest); `symbol` and `object` are there where the message
//! names them, `member` where the object is an archive's member
//! (`archive:member`, as nvlink writes it), `first_defined` where the message
//! names a second object, `object_path` where the object is a file of the
//! link's working directory. `source_file` and `line` come from that file's
//! line tables (`-lineinfo`, `-G`; `nvlinkd_core::input::lines`): where the
//! object defines the symbol, else where its code first uses it. Under LTO
//! nvlink names the object `lto.cubin` (and its ptxas names none), the module
//! NVVM made of every input: `object` (and `member`) is then the input whose
//! LTO code names the symbol ([`Diagnostic::locate_lto`]; read from the PTX
//! nvcc keeps beside the LTO IR), `object_path` its path, and `source_file`
//! and `line` are absent; where no input is found (LTO IR alone), `object`
//! stays `lto.cubin`, which is no file.

use std::path::Path;

/// One message line, structured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Diagnostic {
    /// `error`, `warning`, `info` or `fatal`.
    pub severity: &'static str,
    /// The tool that printed the line: `nvlink` or `ptxas`.
    pub tool: &'static str,
    /// The message's stable name ([`PATTERNS`]), `other` for any other.
    pub code: &'static str,
    /// The message, as nvlink printed it after `severity : `.
    pub message: String,
    pub symbol: Option<String>,
    pub object: Option<String>,
    pub member: Option<String>,
    /// The object named "first defined in" (multiple definitions).
    pub first_defined: Option<String>,
}

/// What a `'%s'` of a message names.
#[derive(Clone, Copy)]
enum Field {
    Symbol,
    Object,
    FirstDefined,
    /// Quoted, but none of the above (an option, an arch, a library name).
    Other,
}

use Field::*;

/// nvlink's and ptxas's messages that name a symbol or a file: its code, the
/// message's text with `'%s'` for each quoted value, and what each names.
/// Matched in order; the first whose literal parts fit wins.
const PATTERNS: &[(&str, &str, &[Field])] = &[
    ("undefined_reference", "Undefined reference to '%s' in '%s'", &[Symbol, Object]),
    ("multiple_definition", "Multiple definition of '%s' in '%s', first defined in '%s'", &[Symbol, Object, FirstDefined]),
    ("prototype_mismatch", "Prototype doesn't match for '%s' in '%s', first defined in '%s'", &[Symbol, Object, FirstDefined]),
    ("address_taken_no_calls", "Function '%s' has address taken but no calls to it found", &[Symbol]),
    ("stack_limit", "Function '%s' uses %d bytes stack but limited to %d", &[Symbol]),
    ("not_global_everywhere", "Function '%s' not declared __global__ in all source files", &[Symbol]),
    ("reserved_smem_not_allowed", "Function '%s' uses reserved shared memory when not allowed.", &[Symbol]),
    ("weak_not_exported", "Weak non-exported function '%s' followed by weak exported results in non-exported being used; make sure weak definitions are consistent", &[Symbol]),
    ("exported_calls_non_exported", "Exported function '%s' calls non-exported function '%s'", &[Symbol, Other]),
    ("weak_not_replaced", "Could not replace weak symbol '%s'", &[Symbol]),
    ("common_symbol_size", "Common symbol '%s' in file '%s' has larger size than initialization", &[Symbol, Object]),
    ("unresolved_extern", "Unresolved extern function '%s'", &[Symbol]),
    ("unresolved_extern", "Unresolved extern variable '%s'", &[Symbol]),
    ("partial_lto", "requested LTO but '%s' not built for LTO so doing partial LTO", &[Object]),
    ("arch_not_found", "SM Arch ('%s') not found in '%s'", &[Other, Object]),
    ("cannot_open_input", "Could not open input file '%s'", &[Object]),
    ("cannot_open_output", "Could not open output file '%s'", &[Other]),
    ("library_not_found", "Library file '%s' not found in paths", &[Other]),
    ("library_not_recognized", "Library file '%s' not recognized", &[Object]),
    ("no_fatbinary", "Could not find fatbinary in '%s'", &[Object]),
    ("unsupported_file_type", "Unsupported file type '%s'", &[Object]),
    ("input_abi_mismatch", "Input file '%s' abi does not match", &[Object]),
    ("input_arch_mismatch", "Input file '%s' arch does not match target '%s'", &[Object, Other]),
    ("input_size_mismatch", "Input file '%s' size does not match target '%s'", &[Object, Other]),
    ("input_newer_than_toolkit", "Input file '%s' newer than toolkit (%d vs %d)", &[Object]),
    ("input_needs_recompile", "Input file '%s' must be recompiled with toolkit >= Cuda %s", &[Object]),
    ("input_not_relocatable", "Input file '%s' not ET_REL", &[Object]),
    ("no_host_code", "Input file '%s' has no host code, which could cause later host link error if there is a reference to it", &[Object]),
    ("skipping_incompatible", "Skipping incompatible '%s' when searching for -l%s", &[Object]),
    ("unknown_option", "Unknown option '%s'", &[Other]),
    ("no_input_files", "No input files specified; use option --help for more information", &[]),
];

impl Diagnostic {
    /// The diagnostic of one output line, if it is a message of nvlink or
    /// ptxas (`nvlink error   : …`, `ptxas fatal   : …`).
    pub fn parse(line: &str) -> Option<Diagnostic> {
        let (tool, rest) =
            ["nvlink", "ptxas"].into_iter().find_map(|t| Some((t, line.strip_prefix(t)?.strip_prefix(' ')?)))?;
        let (kind, message) = rest.split_once(':')?;
        let severity = match kind.trim() {
            "error" => "error",
            "warning" => "warning",
            "info" => "info",
            "fatal" => "fatal",
            _ => return None,
        };
        let message = message.strip_prefix(' ').unwrap_or(message);
        let mut d = Diagnostic { severity, tool, code: "other", message: message.to_owned(), ..Default::default() };
        for (code, pattern, fields) in PATTERNS {
            let Some(values) = quoted_values(pattern, message) else { continue };
            d.code = code;
            for (field, value) in fields.iter().zip(values) {
                match field {
                    Symbol => d.symbol = Some(value),
                    Object => d.object = Some(value),
                    FirstDefined => d.first_defined = Some(value),
                    Other => {}
                }
            }
            break;
        }
        // An archive's member: `archive:member`, as nvlink names it.
        if let Some((archive, member)) = d.object.as_deref().and_then(split_member) {
            (d.object, d.member) = (Some(archive), Some(member));
        }
        Some(d)
    }

    /// Under LTO, the input (or archive member) whose LTO code names this
    /// diagnostic's symbol, in place of nvlink's `lto.cubin` or ptxas's no
    /// object. `args`: the link's command line, run in `cwd` (its named
    /// inputs are read; libraries found by `-l` are not).
    pub fn locate_lto(&mut self, cwd: &Path, args: &[String]) {
        let lto_module = match self.object.as_deref() {
            Some(o) => o == "lto.cubin",
            None => self.tool == "ptxas",
        };
        let Some(symbol) = self.symbol.as_deref().filter(|_| lto_module) else { return };
        let Ok(parsed) = nvlinkd_core::cli::parse::parse(args, &nvlinkd_core::fs::LocalFs, cwd) else { return };
        for input in &parsed.inputs {
            let Some(bytes) = read_bounded(&cwd.join(input)) else { continue };
            if bytes.starts_with(b"!<arch>\n") {
                if let Some(member) = nvlinkd_core::input::lines::lto_member_naming(&bytes, symbol) {
                    (self.object, self.member) = (Some(input.clone()), Some(member));
                    return;
                }
            } else if nvlinkd_core::input::lines::lto_code_names(&bytes, symbol) {
                (self.object, self.member) = (Some(input.clone()), None);
                return;
            }
        }
    }

    /// The event's fields: every field of the module docs that is known.
    /// `cwd`: the link's working directory (for `object_path`).
    /// The object's line tables are read only if `lines` (a link's first
    /// [`SOURCE_LINE_LOOKUPS`] diagnostics: each reads its object again).
    pub fn event(&self, cwd: Option<&Path>, lines: bool) -> nvlinkd_proto::v1::DiagnosticEvent {
        let object_path = self.object.as_ref().and_then(|o| {
            let p = cwd.map(|c| c.join(o)).filter(|p| o != "lto.cubin" && p.is_file())?;
            Some(p.to_string_lossy().into_owned())
        });
        let source = object_path
            .as_deref()
            .zip(self.symbol.as_deref())
            .filter(|_| lines)
            .and_then(|(path, symbol)| source_line(Path::new(path), self.member.as_deref(), symbol));
        let (source_file, line) = source.map(|s| (s.file, s.line)).unzip();
        nvlinkd_proto::v1::DiagnosticEvent {
            severity: self.severity.to_owned(),
            tool: self.tool.to_owned(),
            code: self.code.to_owned(),
            message: self.message.clone(),
            symbol_demangled: self.symbol.as_deref().and_then(demangle),
            symbol: self.symbol.clone(),
            object: self.object.clone(),
            object_path,
            member: self.member.clone(),
            first_defined: self.first_defined.clone(),
            source_file,
            line,
        }
    }
}

/// How many of a link's diagnostics get `source_file` and `line` (a link
/// with thousands of undefined references would read its objects that often).
pub const SOURCE_LINE_LOOKUPS: usize = 64;

/// The largest object whose line tables are read for a diagnostic.
const SOURCE_LINE_MAX_BYTES: u64 = 256 << 20;

/// The first [`SOURCE_LINE_MAX_BYTES`] of the file at `path`.
fn read_bounded(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path).ok()?.take(SOURCE_LINE_MAX_BYTES).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// Where the object (or archive member) at `path` defines or uses `symbol`.
fn source_line(path: &Path, member: Option<&str>, symbol: &str) -> Option<nvlinkd_core::input::lines::SourceLine> {
    let bytes = read_bounded(path)?;
    match member {
        Some(m) => nvlinkd_core::input::lines::locate_in_member(&bytes, m, symbol),
        None => nvlinkd_core::input::lines::locate(&bytes, symbol),
    }
}

/// Every diagnostic of a link's output (stderr first, as nvlink prints its
/// messages there; then stdout).
pub fn of_output(stdout: &[u8], stderr: &[u8]) -> Vec<Diagnostic> {
    let (err, out) = (String::from_utf8_lossy(stderr), String::from_utf8_lossy(stdout));
    err.lines().chain(out.lines()).filter_map(Diagnostic::parse).collect()
}

/// The longest message line read for its fields (longer ones are `other`):
/// the matching below tries each occurrence of a pattern's literal pieces.
const PARSE_MAX: usize = 1024;

/// The values of the quoted `'%s'` in `message` if it is `pattern`, where a
/// placeholder (`%s`, `%d`) stands for any text, the earliest that lets the
/// rest match (names may hold quotes themselves).
fn quoted_values(pattern: &str, message: &str) -> Option<Vec<String>> {
    if message.len() > PARSE_MAX {
        return None;
    }
    let mut values = Vec::new();
    matches(pattern, message, &mut values).then_some(values)
}

fn matches(pat: &str, text: &str, values: &mut Vec<String>) -> bool {
    let Some(at) = pat.find('%') else { return pat == text };
    let (literal, spec, rest_pat) =
        (&pat[..at], pat.get(at + 1..at + 2).unwrap_or(""), pat.get(at + 2..).unwrap_or(""));
    let Some(text) = text.strip_prefix(literal) else { return false };
    let quoted = spec == "s" && literal.ends_with('\'');
    let next = rest_pat.find('%').map_or(rest_pat, |i| &rest_pat[..i]);
    let ends: Vec<usize> =
        if next.is_empty() { vec![text.len()] } else { text.match_indices(next).map(|(i, _)| i).collect() };
    for end in ends {
        let value = &text[..end];
        if spec == "d" && (value.is_empty() || !value.chars().all(|c| c.is_ascii_digit() || c == '-')) {
            continue;
        }
        let mark = values.len();
        if quoted {
            values.push(value.to_owned());
        }
        if matches(rest_pat, &text[end..], values) {
            return true;
        }
        values.truncate(mark);
    }
    false
}

/// `archive.a:member.o` → (`archive.a`, `member.o`).
fn split_member(object: &str) -> Option<(String, String)> {
    let (archive, member) = object.rsplit_once(':')?;
    (archive.ends_with(".a") && !member.is_empty() && !member.contains('/'))
        .then(|| (archive.to_owned(), member.to_owned()))
}

/// The longest name demangled, and the longest demangled name: symbols come
/// from the link's objects (the client's bytes), so both are bounded, and
/// the demangler's own recursion limits apply.
const DEMANGLE_MAX: usize = 4096;

/// `_Z1fi` → `f(int)`; None for names that are not Itanium C++ names or not
/// demangled within the bounds.
fn demangle(symbol: &str) -> Option<String> {
    if !symbol.starts_with("_Z") || symbol.len() > DEMANGLE_MAX {
        return None;
    }
    let sym = cpp_demangle::Symbol::new(symbol.as_bytes()).ok()?;
    let mut out = Bounded(String::new());
    sym.structured_demangle(&mut out, &cpp_demangle::DemangleOptions::default()).ok()?;
    Some(out.0)
}

/// A string that refuses to grow past [`DEMANGLE_MAX`].
struct Bounded(String);

impl std::fmt::Write for Bounded {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        if self.0.len() + s.len() > DEMANGLE_MAX {
            return Err(std::fmt::Error);
        }
        self.0.push_str(s);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Diagnostic {
        Diagnostic::parse(line).unwrap_or_else(|| panic!("not a diagnostic: {line}"))
    }

    /// The lines nvlink 13.5 printed for an undefined reference (plain, in an
    /// archive given by path and by -l), a multiple definition and partial LTO.
    #[test]
    fn nvlinks_messages_name_their_symbol_object_and_member() {
        let d = parse("nvlink error   : Undefined reference to '_Z1fi' in 'a.o'");
        assert_eq!(
            (d.severity, d.tool, d.code, d.symbol.as_deref(), d.object.as_deref(), d.member.as_deref()),
            ("error", "nvlink", "undefined_reference", Some("_Z1fi"), Some("a.o"), None)
        );
        assert_eq!(d.message, "Undefined reference to '_Z1fi' in 'a.o'");
        let d = parse("nvlink error   : Undefined reference to '_Z1fi' in './liba.a:a.o'");
        assert_eq!((d.object.as_deref(), d.member.as_deref()), (Some("./liba.a"), Some("a.o")));
        let d = parse("nvlink error   : Multiple definition of '_Z1fi' in 'c.o', first defined in 'b.o'");
        assert_eq!(
            (d.code, d.symbol.as_deref(), d.object.as_deref(), d.first_defined.as_deref()),
            ("multiple_definition", Some("_Z1fi"), Some("c.o"), Some("b.o"))
        );
        let d = parse("nvlink info    : requested LTO but 'b.o' not built for LTO so doing partial LTO");
        assert_eq!((d.severity, d.code, d.object.as_deref()), ("info", "partial_lto", Some("b.o")));
        let d = parse("ptxas fatal   : Unresolved extern function '_Z1fi'");
        assert_eq!(
            (d.tool, d.severity, d.code, d.symbol.as_deref()),
            ("ptxas", "fatal", "unresolved_extern", Some("_Z1fi"))
        );
        let d = parse("nvlink warning : Function '_ZN1D1fEi' has address taken but no calls to it found");
        assert_eq!((d.code, d.symbol.as_deref()), ("address_taken_no_calls", Some("_ZN1D1fEi")));
        let d = parse("nvlink fatal   : merge_elf failed");
        assert_eq!((d.code, d.symbol, d.object), ("other", None, None));
        assert_eq!(Diagnostic::parse("ptxas info    : Used 8 registers").map(|d| d.code), Some("other"));
        assert!(Diagnostic::parse("nvlink: something").is_none());
        assert!(Diagnostic::parse("nvlinker error : x").is_none());
    }

    #[test]
    fn symbols_are_demangled_within_bounds() {
        let f = parse("nvlink error   : Undefined reference to '_ZN1D1fEi' in 'a.o'").event(None, true);
        assert_eq!(f.symbol_demangled.as_deref(), Some("D::f(int)"));
        let f = parse("nvlink error   : Undefined reference to 'plain_c' in 'a.o'").event(None, true);
        assert!(f.symbol_demangled.is_none(), "{f:?}");
        // Not a name, or too long: no demangled name, no panic.
        assert_eq!(demangle("_Z"), None);
        assert_eq!(demangle(&format!("_Z{}", "1a".repeat(DEMANGLE_MAX))), None);
        // Substitutions that would expand past the bound.
        let bomb = format!("_Z1fIJ{}EEvv", "S_".repeat(1000));
        let _ = demangle(&bomb);
    }

    #[test]
    fn a_quoted_value_may_hold_quotes_and_separators() {
        let d = parse("nvlink error   : Undefined reference to 'it's' in 'dir with ' in '/b.o'");
        assert_eq!((d.symbol.as_deref(), d.object.as_deref()), (Some("it's"), Some("dir with ' in '/b.o")));
    }
}
