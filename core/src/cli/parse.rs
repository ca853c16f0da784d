//! nvlink's command-line grammar.
//!
//! An argument starting with `--` names an option by its long name, one
//! starting with `-` by its short name; anything else is an input file. A value
//! follows `=` or comes in the next argument; a few short options also take it
//! glued on (`-Lpath`, `-lname`, `-m64`). List options split their values on
//! commas and accumulate. `--options-file` splices the words of a file in place.
//! Errors are the fatal messages nvlink prints, word for word.

use std::path::Path;

use super::options::{by_long, by_short, Arity, Opt, OptionDef, ValueKind};
use crate::diag::Diagnostic;
use crate::fs::{absolute, InputFs};

/// One option as given, after value splitting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Occurrence {
    pub id: Opt,
    /// The value (one list element for list options), if the option takes one.
    pub value: Option<String>,
    /// Where on the command line it was (None: from an options file).
    pub at: Option<ArgPos>,
}

/// The argv positions of an option and its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArgPos {
    /// Index of the argument naming the option.
    pub option: usize,
    /// Index of the separate value argument, if the value was not attached.
    pub value: Option<usize>,
}

/// The command line, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    pub options: Vec<Occurrence>,
    pub inputs: Vec<String>,
    /// Warnings of the parse itself (redefined options). nvlink prints them
    /// before anything else, and `-w`/`-Werror` do not apply to them.
    pub warnings: Vec<Diagnostic>,
    /// The options files opened (`-optf`, nested ones too), as named, in
    /// the order opened; their words are in `options` and `inputs`.
    pub options_files: Vec<String>,
    /// A numeric value nvlink takes but whose effect is not measured (empty,
    /// negative, not plain decimal, past the bounds nvlink checks): the real
    /// nvlink answers the link.
    pub unmeasured: Option<String>,
}

/// Most `--options-file`s open at once: nvlink opens 15 nested files and
/// refuses the 16th, before opening it (a file that includes itself ends so).
const MAX_OPTIONS_FILE_DEPTH: usize = 15;

/// What one link's command line may expand to through options files before
/// the daemon stops parsing it: files opened, bytes split into words, words.
/// nvlink itself goes on (15 deep with every file naming eight others is 8^14
/// openings); a client's command line must not keep the daemon busy that long,
/// so such a link is left to the real nvlink of the caller ([`Stop::TooLarge`]).
const MAX_OPTIONS_FILES_OPENED: usize = 1024;
const MAX_OPTIONS_FILE_BYTES: usize = 64 << 20;
const MAX_WORDS: usize = 1 << 20;

/// Why a command line gave no [`Parsed`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stop {
    /// nvlink's own fatal message.
    Fatal(Diagnostic),
    /// Past what the daemon parses for one link (see [`MAX_WORDS`]); nvlink
    /// would go on.
    TooLarge(String),
}

impl From<Diagnostic> for Stop {
    fn from(d: Diagnostic) -> Stop {
        Stop::Fatal(d)
    }
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stop::Fatal(d) => d.fmt(f),
            Stop::TooLarge(why) => f.write_str(why),
        }
    }
}

struct Parser<'a> {
    fs: &'a dyn InputFs,
    cwd: &'a Path,
    out: Parsed,
    /// Options files opened, their bytes, and words seen, so far.
    opened: usize,
    bytes: usize,
    seen: usize,
}

pub fn parse(args: &[String], fs: &dyn InputFs, cwd: &Path) -> Result<Parsed, Stop> {
    let mut p = Parser { fs, cwd, out: Parsed::default(), opened: 0, bytes: 0, seen: 0 };
    match p.words(args, 0) {
        // A later fatal may be nvlink's, or nvlink may stop at the value
        // before it: its own nvlink answers.
        Err(Stop::Fatal(_)) if p.out.unmeasured.is_some() => {
            Err(Stop::TooLarge(p.out.unmeasured.take().unwrap_or_default()))
        }
        Err(e) => Err(e),
        Ok(()) => Ok(p.out),
    }
}

impl Parser<'_> {
    fn words(&mut self, args: &[String], depth: usize) -> Result<(), Stop> {
        self.seen += args.len();
        if self.seen > MAX_WORDS {
            return Err(Stop::TooLarge(format!("the command line expands past {MAX_WORDS} words")));
        }
        let mut i = 0;
        while i < args.len() {
            let arg = &args[i];
            let option_index = i;
            i += 1;
            let Some(stripped) = arg.strip_prefix('-').filter(|s| !s.is_empty()) else {
                self.out.inputs.push(arg.clone());
                continue;
            };
            let (def, spelled, mut value) = resolve(stripped)?;
            if def.arity == Arity::Flag {
                if value.is_some() {
                    return Err(Diagnostic::fatal(format!("no argument expected after '{spelled}'")).into());
                }
                let at = (depth == 0).then_some(ArgPos { option: option_index, value: None });
                self.out.options.push(Occurrence { id: def.id, value: None, at });
                continue;
            }
            let attached = value.is_some();
            if value.is_none() {
                match (args.get(i), def.default) {
                    (Some(next), Some(_)) if !next.starts_with('-') => {
                        i += 1;
                        value = Some(next.clone());
                    }
                    (_, Some(default)) => value = Some(default.to_owned()),
                    (Some(next), None) => {
                        i += 1;
                        value = Some(next.clone());
                    }
                    (None, None) => {
                        return Err(Diagnostic::fatal(format!("argument expected after '{spelled}'")).into())
                    }
                }
            }
            let value = value.unwrap_or_default();
            let separate = !attached && i > option_index + 1;
            let at = (depth == 0).then_some(ArgPos { option: option_index, value: separate.then_some(i - 1) });
            if def.id == Opt::OptionsFile {
                for file in value.split(',').filter(|f| !f.is_empty()) {
                    self.options_file(file, depth)?;
                }
                continue;
            }
            match def.arity {
                Arity::List => {
                    for v in value.split(',') {
                        if self.out.options.len() >= MAX_WORDS {
                            return Err(Stop::TooLarge(format!("the command line expands past {MAX_WORDS} values")));
                        }
                        check_value(def, v)?;
                        self.note_number(def, v);
                        self.out.options.push(Occurrence { id: def.id, value: Some(v.to_owned()), at });
                    }
                }
                _ => {
                    check_value(def, &value)?;
                    self.note_number(def, &value);
                    let previous = self.out.options.iter().rev().find(|o| o.id == def.id);
                    if previous.is_some_and(|p| p.value.as_deref() != Some(value.as_str())) {
                        self.out.warnings.push(Diagnostic::warning(format!(
                            "incompatible redefinition for option '{}', the last value of this option was used",
                            def.long
                        )));
                    }
                    self.out.options.push(Occurrence { id: def.id, value: Some(value), at });
                }
            }
        }
        Ok(())
    }

    /// Notes a value the real nvlink must answer for (`-tool-name`), or a
    /// numeric value whose effect on nvlink is not measured: only
    /// plain decimals from 0 to 256 (what nvcc and build systems pass) are
    /// linked here. nvlink takes an empty value, `0x10`, `010`, ` 5`, and
    /// refuses `-maxrregcount` or `-split-compile` past a bound between 256
    /// and 1000 ("Invalid argument"), and any value past 32 bits.
    fn note_number(&mut self, def: &OptionDef, v: &str) {
        let plain =
            !v.is_empty() && v.len() <= 3 && v.bytes().all(|b| b.is_ascii_digit()) && (v == "0" || !v.starts_with('0'));
        let numeric = matches!(def.kind, ValueKind::Number | ValueKind::NumberIn(_));
        if numeric && !(plain && v.parse::<u32>().is_ok_and(|n| n <= 256)) && self.out.unmeasured.is_none() {
            self.out.unmeasured = Some(format!("-{} '{v}': a value whose effect on nvlink is not measured", def.long));
        }
        // nvlink names itself after `-tool-name` in the messages that follow.
        if def.id == Opt::ToolName && self.out.unmeasured.is_none() {
            self.out.unmeasured = Some("-tool-name (nvlink's messages under that name)".to_owned());
        }
    }

    fn options_file(&mut self, file: &str, depth: usize) -> Result<(), Stop> {
        if depth >= MAX_OPTIONS_FILE_DEPTH {
            return Err(Diagnostic::fatal(format!("Too many options file opened '{file}'")).into());
        }
        self.opened += 1;
        if self.opened > MAX_OPTIONS_FILES_OPENED {
            return Err(Stop::TooLarge(format!("options files opened more than {MAX_OPTIONS_FILES_OPENED} times")));
        }
        if !self.out.options_files.iter().any(|f| f == file) {
            self.out.options_files.push(file.to_owned());
        }
        let bytes = self
            .fs
            .read(&absolute(self.cwd, file))
            .map_err(|_| Diagnostic::fatal(format!("Could not open options file '{file}'")))?;
        self.bytes += bytes.len();
        if self.bytes > MAX_OPTIONS_FILE_BYTES {
            return Err(Stop::TooLarge(format!("options files add up to more than {MAX_OPTIONS_FILE_BYTES} bytes")));
        }
        // Names are UTF-8 here (as the protocol's arguments): bytes that are
        // not would name other files, so nvlink answers.
        let Ok(text) = std::str::from_utf8(&bytes) else {
            return Err(Stop::TooLarge(format!("options file '{file}' is not UTF-8")));
        };
        // What is measured of nvlink's splitting: quotes that pair. A NUL, a
        // backslash (nvlink drops `\"` outside quotes, skips `\ ` at a word's
        // start, stops at one that ends the file: not all of it is measured)
        // or a quote left open are left to nvlink.
        let quotes = text.matches('"').count();
        if text.contains('\0') || text.contains('\\') || quotes % 2 == 1 {
            return Err(Stop::TooLarge(format!(
                "options file '{file}' quotes or escapes in a way nvlink's splitting of is not measured"
            )));
        }
        let words = split_words(text);
        self.words(&words, depth + 1)
    }
}

/// Find the option an argument (without its first `-`) names.
/// Returns the definition, the spelling to quote in messages, and a value given
/// with `=` or glued on.
fn resolve(stripped: &str) -> Result<(&'static OptionDef, String, Option<String>), Diagnostic> {
    // nvlink names an unknown option without the value given with `=`
    // (`--archh=sm_90`: '-archh'); a glued value is part of the name ('ox.cubin').
    let unknown = || Diagnostic::fatal(format!("Unknown option '{}'", split_eq(stripped).0));
    if let Some(long) = stripped.strip_prefix('-') {
        let (name, value) = split_eq(long);
        let def = by_long(name).ok_or_else(unknown)?;
        return Ok((def, format!("--{name}"), value));
    }
    let (name, value) = split_eq(stripped);
    if let Some(def) = by_short(name) {
        return Ok((def, format!("-{name}"), value));
    }
    // Glued value: the longest short name that allows it and prefixes the argument.
    let glued = super::options::OPTIONS
        .iter()
        .filter(|d| d.attached && stripped.len() > d.short.len() && stripped.starts_with(d.short))
        .max_by_key(|d| d.short.len());
    match glued {
        Some(def) => Ok((def, format!("-{}", def.short), Some(stripped[def.short.len()..].to_owned()))),
        None => Err(unknown()),
    }
}

fn split_eq(s: &str) -> (&str, Option<String>) {
    match s.split_once('=') {
        Some((n, v)) => (n, Some(v.to_owned())),
        None => (s, None),
    }
}

fn check_value(def: &OptionDef, v: &str) -> Result<(), Diagnostic> {
    match def.kind {
        ValueKind::Text => Ok(()),
        // nvlink takes an empty number (`-maxrregcount=`); one past 64 bits
        // it refuses as past 32 (routed: `Parser::note_number`).
        ValueKind::Number if v.is_empty() || integer_syntax(v) => Ok(()),
        ValueKind::Number => parse_number(v).map(|_| ()),
        ValueKind::NumberIn(allowed) => {
            // nvlink compares the number: `-m=0x40` is `-m=64`, and one past
            // 32 bits it refuses as such (both routed: not plain decimals).
            if !v.is_empty() {
                match parse_c_long(v) {
                    Some(n) if allowed.contains(&n.to_string().as_str()) || i32::try_from(n).is_err() => return Ok(()),
                    None if integer_syntax(v) => return Ok(()),
                    None => return Err(Diagnostic::fatal(format!("'{v}': expected a number"))),
                    Some(_) => {}
                }
            }
            check_value(&OptionDef { kind: ValueKind::Enum(allowed), ..*def }, v)
        }
        ValueKind::Bool if v == "true" || v == "false" => Ok(()),
        ValueKind::Bool => Err(Diagnostic::fatal(format!("'{v}': expected true or false"))),
        ValueKind::Enum(allowed) => {
            if allowed.contains(&v) {
                Ok(())
            } else {
                Err(Diagnostic::fatal(format!("Value '{v}' is not defined for option '{}'", def.long)))
            }
        }
    }
}

/// A number as nvlink reads option values (C `strtol(v, 0)`: decimal, `0x` hex,
/// leading-`0` octal, optional sign), the whole value consumed.
pub(crate) fn parse_number(v: &str) -> Result<i64, Diagnostic> {
    parse_c_long(v).ok_or_else(|| Diagnostic::fatal(format!("'{v}': expected a number")))
}

/// `v` as `strtol(v, &end, 0)` reads it: leading space skipped, then whether
/// a `-` sign came, the radix its prefix names (`0x` 16, a leading `0` 8,
/// else 10) and the digits after the prefix, unchecked.
fn c_long_parts(v: &str) -> (bool, u32, &str) {
    let t = v.trim_start();
    let (neg, t) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => (neg, 16, h),
        None if t.len() > 1 && t.starts_with('0') => (neg, 8, &t[1..]),
        None => (neg, 10, t),
    }
}

/// Whether `v` is a whole number as `strtol(v, &end, 0)` reads one, however
/// large (`parse_c_long` is the same within 64 bits).
fn integer_syntax(v: &str) -> bool {
    let (_, radix, digits) = c_long_parts(v);
    !digits.is_empty() && digits.chars().all(|c| c.is_digit(radix))
}

/// `strtol(v, &end, 0)` with `*end == 0` required.
pub(crate) fn parse_c_long(v: &str) -> Option<i64> {
    let (neg, radix, digits) = c_long_parts(v);
    if digits.is_empty() {
        return None;
    }
    let n = i64::from_str_radix(digits, radix).ok()?;
    Some(if neg { -n } else { n })
}

/// Split an options file into words: whitespace separates, quotes group
/// (one splitter for the daemon and the shim: `nvlinkd_fs::options_words`).
pub(crate) fn split_words(text: &str) -> Vec<String> {
    nvlinkd_fs::options_words(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::LocalFs;

    fn p(args: &[&str]) -> Result<Parsed, String> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        parse(&args, &LocalFs, Path::new("/")).map_err(|d| d.to_string())
    }

    #[test]
    fn spellings() {
        let a = p(&["-arch=sm_90", "--arch", "sm_80", "-Lx", "-L", "y,z", "-lfoo", "a.o", "-m64", "-r"]).unwrap();
        assert_eq!(a.inputs, vec!["a.o"]);
        let v: Vec<_> = a.options.iter().map(|o| (o.id, o.value.clone())).collect();
        assert_eq!(v[0], (Opt::Arch, Some("sm_90".into())));
        assert_eq!(v[1], (Opt::Arch, Some("sm_80".into())));
        assert_eq!(v[2], (Opt::LibraryPath, Some("x".into())));
        assert_eq!(v[3], (Opt::LibraryPath, Some("y".into())));
        assert_eq!(v[4], (Opt::LibraryPath, Some("z".into())));
        assert_eq!(v[5], (Opt::Library, Some("foo".into())));
        assert_eq!(v[6], (Opt::Machine, Some("64".into())));
        assert_eq!(v[7], (Opt::RelocatableLink, None));
    }

    #[test]
    fn errors_read_like_nvlink() {
        assert_eq!(p(&["-no-such-option"]).unwrap_err(), "nvlink fatal   : Unknown option 'no-such-option'");
        assert_eq!(p(&["--no-such-option"]).unwrap_err(), "nvlink fatal   : Unknown option '-no-such-option'");
        assert_eq!(p(&["--lto"]).unwrap_err(), "nvlink fatal   : Unknown option '-lto'");
        assert_eq!(p(&["-ox.cubin"]).unwrap_err(), "nvlink fatal   : Unknown option 'ox.cubin'");
        assert_eq!(p(&["--archh=sm_90"]).unwrap_err(), "nvlink fatal   : Unknown option '-archh'");
        assert_eq!(p(&["-archh=sm_90"]).unwrap_err(), "nvlink fatal   : Unknown option 'archh'");
        assert_eq!(p(&["-a=b=c"]).unwrap_err(), "nvlink fatal   : Unknown option 'a'");
        assert_eq!(p(&["-r=1"]).unwrap_err(), "nvlink fatal   : no argument expected after '-r'");
        assert_eq!(p(&["-L"]).unwrap_err(), "nvlink fatal   : argument expected after '-L'");
        assert_eq!(
            p(&["-arch", "sm_91"]).unwrap_err(),
            "nvlink fatal   : Value 'sm_91' is not defined for option 'arch'"
        );
        assert_eq!(p(&["-m32"]).unwrap_err(), "nvlink fatal   : Value '32' is not defined for option 'machine'");
        assert_eq!(p(&["--maxrregcount=abc"]).unwrap_err(), "nvlink fatal   : 'abc': expected a number");
        assert_eq!(p(&["-device-stack-protector=x"]).unwrap_err(), "nvlink fatal   : 'x': expected true or false");
        assert_eq!(p(&["-verbose-tkinfo=TRUE"]).unwrap_err(), "nvlink fatal   : 'TRUE': expected true or false");
        assert!(p(&["-device-stack-protector", "false"]).is_ok());
    }

    /// An options file that is not UTF-8 names files by bytes the protocol's
    /// strings cannot hold: left to nvlink, never read as other names.
    #[test]
    fn an_options_file_that_is_not_utf8_is_left_to_nvlink() {
        let dir = std::env::temp_dir().join(format!("nvlinkd-optf-bytes-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("o.opts"), b"-arch=sm_90 a\xffb.o").unwrap();
        let args = vec!["-optf".to_owned(), "o.opts".to_owned()];
        assert!(matches!(parse(&args, &LocalFs, &dir), Err(Stop::TooLarge(why)) if why.contains("not UTF-8")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// nvlink opens 15 nested options files and refuses the 16th by name,
    /// before opening it; any number of files one after another is fine.
    #[test]
    fn options_files_nest_fifteen_deep() {
        let dir = std::env::temp_dir().join(format!("nvlinkd-optf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let chain = |n: usize, last: &str| {
            for i in 1..=n {
                let next = if i < n { format!("-optf c{}.opts", i + 1) } else { last.to_owned() };
                std::fs::write(dir.join(format!("c{i}.opts")), next).unwrap();
            }
            let args = vec!["-optf".to_owned(), "c1.opts".to_owned()];
            parse(&args, &LocalFs, &dir).map_err(|d| d.to_string())
        };
        assert!(chain(15, "-arch=sm_90").is_ok());
        assert_eq!(chain(16, "-arch=sm_90").unwrap_err(), "nvlink fatal   : Too many options file opened 'c16.opts'");
        assert_eq!(
            chain(15, "-optf missing.opts").unwrap_err(),
            "nvlink fatal   : Too many options file opened 'missing.opts'"
        );
        std::fs::write(dir.join("self.opts"), "-optf self.opts").unwrap();
        let args: Vec<String> = ["-optf", "self.opts"].map(str::to_owned).to_vec();
        let got = parse(&args, &LocalFs, &dir).map_err(|d| d.to_string());
        assert_eq!(got.unwrap_err(), "nvlink fatal   : Too many options file opened 'self.opts'");
        std::fs::write(dir.join("leaf.opts"), "-w").unwrap();
        let siblings: Vec<String> = (0..20).flat_map(|_| ["-optf".to_owned(), "leaf.opts".to_owned()]).collect();
        assert!(parse(&siblings, &LocalFs, &dir).is_ok());
        // Empty names in the list are skipped (nvlink: `-optf ''`, `-optf ,x`
        // link); a missing name is not.
        let empty: Vec<String> = ["-optf", "", "-optf", ",leaf.opts,"].map(str::to_owned).to_vec();
        assert!(parse(&empty, &LocalFs, &dir).is_ok());
        let missing: Vec<String> = ["-optf", ",nope.opts"].map(str::to_owned).to_vec();
        assert_eq!(
            parse(&missing, &LocalFs, &dir).map_err(|d| d.to_string()).unwrap_err(),
            "nvlink fatal   : Could not open options file 'nope.opts'"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Options files that fan out (each names eight others, six deep: 37 448
    /// openings) stop the parse at the daemon's bound, where nvlink would go
    /// on; a wide list option too. Under the bounds, nvlink's answer.
    #[test]
    fn a_fan_out_of_options_files_stops_at_the_bound() {
        let dir = std::env::temp_dir().join(format!("nvlinkd-optf-fan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for level in 0..6 {
            let next = if level < 5 { format!("-optf f{}.opts ", level + 1).repeat(8) } else { "-w".into() };
            std::fs::write(dir.join(format!("f{level}.opts")), next).unwrap();
        }
        let args: Vec<String> = ["-optf", "f0.opts"].map(str::to_owned).to_vec();
        let stop = parse(&args, &LocalFs, &dir).unwrap_err();
        assert!(matches!(&stop, Stop::TooLarge(why) if why.contains("opened more than")), "{stop}");
        let args: Vec<String> = ["-optf", "f3.opts"].map(str::to_owned).to_vec();
        assert_eq!(parse(&args, &LocalFs, &dir).unwrap().options.len(), 64, "under the bound: 8 x 8 files");
        let wide = vec!["-L".to_owned(), vec!["d"; MAX_WORDS + 1].join(",")];
        assert!(matches!(parse(&wide, &LocalFs, &dir), Err(Stop::TooLarge(_))));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn words() {
        assert_eq!(split_words(" -arch sm_90\n \"a b.o\" \"c\"d "), vec!["-arch", "sm_90", "a b.o", "cd"]);
    }
}
