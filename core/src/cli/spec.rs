//! The typed link specification and nvlink's mode dispatch.
//!
//! nvlink has no single mode switch: `-ghls` selects a host-linker-script mode
//! (H: `lcs-aug`, I: `lcs-abs`) that skips device linking entirely; otherwise the
//! device link runs, shaped by `-r` (B), `-dlto` (C), `-dlto -r` or
//! `--force-partial-lto` (D), `-dlto --emit-ptx` (E), or neither (A); see
//! docs/nvlink-behaviour.md ("The command line and its modes"). [`Spec::from_parsed`]
//! types the options and [`Spec::mode`] applies nvlink's option-level checks
//! in its order and with its messages.

use std::path::Path;

use super::options::Opt;
use super::parse::{parse_number, Parsed};
use super::target::{arch_number, Target};
use crate::diag::Diagnostic;
use crate::input::files::{LinkFiles, Named, Written};

/// The host linker script flavour of `-ghls`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostScript {
    /// `lcs-aug`: the CUDA SECTIONS block alone.
    Aug,
    /// `lcs-abs`: the host linker's default script plus the block.
    Abs,
}

/// What a valid command line asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Help,
    Version,
    HostLinkerScript(HostScript),
    /// Mode A: executable device link.
    Executable,
    /// Mode B: `-r`.
    Relocatable,
    /// Mode C: whole-program LTO.
    LtoWhole,
    /// Mode D: partial LTO (`-dlto -r`, `--force-partial-lto`).
    LtoPartial,
    /// Mode E: `-dlto --emit-ptx`.
    LtoEmitPtx,
}

/// Whether `value` (an argument, or an `-Xptxas` value) names a file of
/// options a tool reads in any of its words: `--options-file`, `-optf`
/// (nvlink's and ptxas's), ptxas's `--apply-controls`, alone (the file
/// follows) or with `=F`; words are split on
/// whitespace and commas, as nvlink splits the values it hands its tools,
/// and the value after an `=` counts too (`-Xptxas=--options-file=F`).
pub fn names_options_file(value: &str) -> bool {
    let flag = |w: &str| {
        let name = w.trim_start_matches('-');
        let name = name.split_once('=').map_or(name, |(n, _)| n);
        w.starts_with('-') && matches!(name, "options-file" | "optf" | "apply-controls")
    };
    value
        .split(|c: char| c.is_whitespace() || c == ',')
        .any(|w| flag(w) || w.split_once('=').is_some_and(|(_, v)| flag(v)))
}

impl Spec {
    /// Whether the link's ptxas reads an options file of its own, whose
    /// contents no key holds and no sandbox mirrors.
    pub fn ptxas_reads_options_file(&self) -> bool {
        self.xptxas.iter().any(|v| names_options_file(v))
    }
}

impl Mode {
    /// Modes C to E: nvlink loads libNVVM (from `-nvvmpath`).
    pub fn is_lto(self) -> bool {
        matches!(self, Mode::LtoWhole | Mode::LtoPartial | Mode::LtoEmitPtx)
    }
}

/// Everything nvlink's options say, typed.
#[derive(Clone, Debug, Default)]
pub struct Spec {
    pub parsed: Parsed,
    pub arch: Option<String>,
    pub cpu_arch: Option<String>,
    pub output: Option<String>,
    pub inputs: Vec<String>,
    pub library_paths: Vec<String>,
    pub libraries: Vec<String>,
    pub relocatable: bool,
    pub lto: bool,
    pub emit_ptx: bool,
    pub ghls: Option<HostScript>,
    pub register_link_binaries: Option<String>,
    pub nvvmpath: Option<String>,
    pub xnvvm: Vec<String>,
    pub xptxas: Vec<String>,
    pub maxrregcount: Option<i64>,
    pub ofast_compile: Option<String>,
    pub split_compile: Option<i64>,
    pub split_compile_extended: Option<i64>,
    pub debug: bool,
    pub suppress_debug_info: bool,
    pub device_stack_protector: Option<String>,
    pub disable_infos: bool,
    pub disable_warnings: bool,
    pub warning_as_error: bool,
    pub extra_warnings: bool,
    pub dump_callgraph: bool,
    pub dump_callgraph_no_demangle: bool,
    pub ignore_host_info: bool,
    pub use_host_info: bool,
    pub keep_system_libraries: bool,
    pub kernels_used: Vec<String>,
    pub variables_used: Vec<String>,
    pub link_as_tools_patch: bool,
    pub nvvm_latest: bool,
    pub preserve_relocs: bool,
    pub report_arch: bool,
    pub suppress_arch_warning: bool,
    pub suppress_stack_size_warning: bool,
    pub time: Option<String>,
    pub uidx_file: Option<String>,
    pub verbose: bool,
    pub verbose2: bool,
    pub help: bool,
    pub version: bool,
    pub host_ccbin: Option<String>,
    pub force_partial_lto: bool,
    pub force_whole_lto: bool,
    pub shared: bool,
    pub tool_name: Option<String>,
    pub verbose_tkinfo: Option<bool>,
    /// Hidden options nvlinkd accepts but does not reproduce in process.
    pub unmodelled: Vec<Opt>,
    /// A numeric value whose effect is not measured ([`Parsed::unmeasured`]):
    /// the real nvlink answers the whole link.
    pub unmeasured: Option<String>,
    /// Every file the link reads, named once (`input/files.rs`).
    pub files: LinkFiles,
}

impl Spec {
    /// Collect the options into fields (last one wins for single values),
    /// and name every file the link reads against the caller's working
    /// directory `cwd` and `LIBRARY_PATH` ([`Spec::files`]).
    pub fn from_parsed(parsed: Parsed, cwd: &Path, library_path: Option<&str>) -> Result<Spec, Diagnostic> {
        let mut s = Spec { inputs: parsed.inputs.clone(), unmeasured: parsed.unmeasured.clone(), ..Default::default() };
        // An empty number is nvlink's 0, one past 64 bits its refusal (the
        // link is routed: `unmeasured`).
        let routed = parsed.unmeasured.is_some();
        let number = |v: &str| match parse_number(v) {
            Err(_) if v.is_empty() || routed => Ok(0),
            n => n,
        };
        for o in &parsed.options {
            let v = o.value.clone();
            let text = || v.clone().unwrap_or_default();
            match o.id {
                Opt::OfastCompile => s.ofast_compile = v,
                Opt::Xnvvm => s.xnvvm.push(text()),
                Opt::Xptxas => s.xptxas.push(text()),
                Opt::Arch => s.arch = v,
                Opt::CpuArch => s.cpu_arch = v,
                Opt::Debug => s.debug = true,
                Opt::DeviceStackProtector => s.device_stack_protector = v,
                Opt::DisableInfos => s.disable_infos = true,
                Opt::DisableWarnings => s.disable_warnings = true,
                Opt::Dlto | Opt::LinkTimeOpt => s.lto = true,
                Opt::DumpCallgraph => s.dump_callgraph = true,
                Opt::DumpCallgraphNoDemangle => s.dump_callgraph_no_demangle = true,
                Opt::EmitPtx => s.emit_ptx = true,
                Opt::ExtraWarnings => s.extra_warnings = true,
                Opt::GenHostLinkerScript => {
                    s.ghls = Some(if text() == "lcs-aug" { HostScript::Aug } else { HostScript::Abs })
                }
                Opt::Help => s.help = true,
                Opt::IgnoreHostInfo => s.ignore_host_info = true,
                Opt::KeepSystemLibraries => s.keep_system_libraries = true,
                // An empty list names nothing: nvlink acts as if the option
                // were absent (and prunes by the host references).
                Opt::KernelsUsed if names_any(&text()) => s.kernels_used.push(text()),
                Opt::KernelsUsed => {}
                Opt::Library => s.libraries.push(text()),
                Opt::LibraryPath => s.library_paths.push(text()),
                Opt::LinkAsToolsPatch => s.link_as_tools_patch = true,
                Opt::Machine => {}
                Opt::Maxrregcount => s.maxrregcount = Some(number(&text())?),
                Opt::NvvmLatest => s.nvvm_latest = true,
                Opt::Nvvmpath => s.nvvmpath = v,
                Opt::OptionsFile => {}
                Opt::OutputFile => s.output = v,
                Opt::PreserveRelocs => s.preserve_relocs = true,
                Opt::RegisterLinkBinaries => s.register_link_binaries = v,
                Opt::RelocatableLink => s.relocatable = true,
                Opt::ReportArch => s.report_arch = true,
                Opt::SplitCompile => s.split_compile = Some(number(&text())?),
                Opt::SplitCompileExtended => s.split_compile_extended = Some(number(&text())?),
                Opt::SuppressArchWarning => s.suppress_arch_warning = true,
                Opt::SuppressDebugInfo => s.suppress_debug_info = true,
                Opt::SuppressStackSizeWarning => s.suppress_stack_size_warning = true,
                Opt::Time => s.time = v,
                Opt::UidxFile => s.uidx_file = v,
                Opt::UseHostInfo => s.use_host_info = true,
                Opt::VariablesUsed if names_any(&text()) => s.variables_used.push(text()),
                Opt::VariablesUsed => {}
                Opt::Verbose => s.verbose = true,
                Opt::Verbose2 => s.verbose2 = true,
                Opt::Version => s.version = true,
                Opt::WarningAsError => s.warning_as_error = true,
                Opt::HostCcbin => s.host_ccbin = v,
                Opt::ForcePartialLto => s.force_partial_lto = true,
                Opt::ForceWholeLto => s.force_whole_lto = true,
                Opt::Shared => s.shared = true,
                Opt::ToolName => s.tool_name = v,
                Opt::VerboseTkinfo => s.verbose_tkinfo = v.map(|b| b == "true"),
                _ => s.unmodelled.push(o.id),
            }
        }
        let named = |v: Option<&str>| v.map(|given| Named::resolved(cwd, given));
        let written = Written {
            output: named(s.output.as_deref()),
            register: named(s.register_link_binaries.as_deref()),
            time: named(s.time.as_deref().filter(|t| *t != "-")),
            uidx: named(s.uidx_file.as_deref()),
        };
        s.files = LinkFiles::of(&parsed, &s.library_paths, &s.libraries, cwd, library_path, written);
        s.parsed = parsed;
        Ok(s)
    }

    /// The parse warnings (options given twice) as nvlink prints them, one
    /// line each.
    pub fn warnings_text(&self) -> Vec<u8> {
        self.parsed.warnings.iter().flat_map(|w| format!("{w}\n").into_bytes()).collect()
    }

    /// The mode, after nvlink's option-level checks.
    pub fn mode(&self) -> Result<Mode, Diagnostic> {
        if self.help {
            return Ok(Mode::Help);
        }
        if self.version {
            return Ok(Mode::Version);
        }
        if let Some(kind) = self.ghls {
            if !self.inputs.is_empty() {
                return Err(ghls_inputs_not_allowed());
            }
            return Ok(Mode::HostLinkerScript(kind));
        }
        // nvlink looks for the arch before the output file: with neither, it
        // names the missing arch.
        if self.arch.is_none() {
            return Err(Diagnostic::fatal("Unknown arch name '(null)'"));
        }
        // A virtual target (`compute_XY`, what `nvcc -arch=compute_XY -rdc`
        // links, or `lto_XY`) needs no `-o`: for `compute_XY` nvlink writes
        // only the registration file; `lto_XY` is refused below.
        let is_virtual = self.virtual_target() || self.arch.as_deref().is_some_and(|a| a.starts_with("lto_"));
        if self.output.is_none() && !is_virtual {
            return Err(Diagnostic::fatal("Must specify output file with -o option"));
        }
        let conflict = |a: &str, b: &str| Err(Diagnostic::fatal(format!("Conflicting options '{a}' and '{b}'")));
        if self.dump_callgraph && self.dump_callgraph_no_demangle {
            return conflict("-dump-callgraph", "-dump-callgraph-no-demangle");
        }
        if self.use_host_info && self.ignore_host_info {
            return conflict("-use-host-info", "-ignore-host-info");
        }
        if self.suppress_debug_info && !self.debug {
            return conflict("-suppress-debug-info", "no -g");
        }
        if !self.lto {
            // In nvlink's order of checks.
            for (given, name) in [
                (self.force_partial_lto, "-force-partial-lto"),
                (self.nvvm_latest, "-nvvm-latest"),
                (self.emit_ptx, "-emit-ptx"),
                (self.ofast_compile.is_some(), "--Ofast-compile"),
            ] {
                if given {
                    return conflict(name, "no -dlto");
                }
            }
        }
        if self.force_partial_lto && self.force_whole_lto {
            return conflict("-force-partial-lto", "-force-whole-lto");
        }
        // Without inputs nvlink says so first (the link plan's fatal).
        if self.lto && self.nvvmpath.is_none() && !self.inputs.is_empty() {
            return Err(Diagnostic::fatal("-nvvmpath should be specified with -lto"));
        }
        // Then, with inputs (without, the plan's "No input files" comes first),
        // the -Ofc level and a target nvlink cannot link for (`lto_XY`).
        if !self.inputs.is_empty() {
            if self.ofast_compile.as_deref().is_some_and(|l| !matches!(l, "0" | "min" | "mid" | "max")) {
                return Err(Diagnostic::fatal("Invalid argument for option '--Ofast-compile'"));
            }
            if let Some(arch) = self.arch.as_deref().filter(|a| a.starts_with("lto_")) {
                return Err(Diagnostic::fatal(format!(
                    "Link target of '{arch}' is virtual target that is not JIT-able; use 'sm_' target instead"
                )));
            }
        }
        Ok(match (self.lto, self.emit_ptx, self.relocatable || self.force_partial_lto) {
            (true, true, _) => Mode::LtoEmitPtx,
            (true, false, true) => Mode::LtoPartial,
            (true, false, false) => Mode::LtoWhole,
            (false, _, _) if self.relocatable => Mode::Relocatable,
            _ => Mode::Executable,
        })
    }

    /// Whether `--arch` names a virtual target (`compute_XY`): nvlink links
    /// no device code for it, it writes the registration file alone.
    pub fn virtual_target(&self) -> bool {
        self.arch.as_deref().is_some_and(|a| a.starts_with("compute_"))
    }

    /// The device target of `--arch sm_*` (None for `compute_*`/`lto_*`).
    pub fn target(&self) -> Option<Target> {
        Target::of_arch(self.arch.as_deref()?)
    }

    /// The SM number of `--arch` (`sm_90a` → 90).
    pub fn sm(&self) -> Option<u32> {
        arch_number(self.arch.as_deref()?)
    }
}

/// Whether a comma list names anything.
fn names_any(list: &str) -> bool {
    list.split(',').any(|n| !n.is_empty())
}

/// `-ghls` with inputs is rejected before anything runs.
fn ghls_inputs_not_allowed() -> Diagnostic {
    Diagnostic::fatal("Input files are not allowed with -ghls option; use --help for more information")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::parse::parse;
    use crate::fs::LocalFs;

    fn mode(args: &str) -> Result<Mode, String> {
        let args: Vec<String> = args.split_whitespace().map(str::to_owned).collect();
        let parsed = parse(&args, &LocalFs, std::path::Path::new("/")).map_err(|s| match s {
            crate::cli::parse::Stop::Fatal(d) => d.message,
            crate::cli::parse::Stop::TooLarge(why) => why,
        })?;
        Spec::from_parsed(parsed, std::path::Path::new("/"), None).map_err(|d| d.message)?.mode().map_err(|d| d.message)
    }

    /// nvlink's option-level checks, in its order: each row is one rule.
    #[test]
    fn mode_rules() {
        let conflict = |a: &str, b: &str| Err(format!("Conflicting options '{a}' and '{b}'"));
        let rows: &[(&str, Result<Mode, String>)] = &[
            // Help and version win over everything, even missing -o/-arch.
            ("--help -dlto", Ok(Mode::Help)),
            ("-V a.o", Ok(Mode::Version)),
            ("-h -V", Ok(Mode::Help)),
            // -ghls skips the device link; inputs are refused.
            ("-ghls=lcs-aug", Ok(Mode::HostLinkerScript(HostScript::Aug))),
            ("-ghls=lcs-abs -o x.ld", Ok(Mode::HostLinkerScript(HostScript::Abs))),
            ("-ghls=lcs-aug a.o", Err(ghls_inputs_not_allowed().message)),
            // A missing -arch is reported first, then a missing -o (checked
            // against the real nvlink: `nvlink a.o`, `nvlink -arch=sm_90 a.o`).
            ("a.o", Err("Unknown arch name '(null)'".into())),
            ("-arch=sm_90 a.o", Err("Must specify output file with -o option".into())),
            ("-o x a.o", Err("Unknown arch name '(null)'".into())),
            // Conflicts, in nvlink's order.
            (
                "-arch=sm_90 -o x -dump-callgraph -dump-callgraph-no-demangle",
                conflict("-dump-callgraph", "-dump-callgraph-no-demangle"),
            ),
            ("-arch=sm_90 -o x -use-host-info -ignore-host-info", conflict("-use-host-info", "-ignore-host-info")),
            ("-arch=sm_90 -o x -suppress-debug-info", conflict("-suppress-debug-info", "no -g")),
            ("-arch=sm_90 -o x -emit-ptx", conflict("-emit-ptx", "no -dlto")),
            ("-arch=sm_90 -o x -force-partial-lto", conflict("-force-partial-lto", "no -dlto")),
            (
                "-arch=sm_90 -o x -dlto -nvvmpath=/n -force-partial-lto -force-whole-lto",
                conflict("-force-partial-lto", "-force-whole-lto"),
            ),
            ("-arch=sm_90 -o x -dlto a.o", Err("-nvvmpath should be specified with -lto".into())),
            ("-arch=sm_90 -o x -dlto", Ok(Mode::LtoWhole)),
            // -Ofc's level is checked after -nvvmpath, and only with inputs.
            ("-arch=sm_90 -o x -dlto -Ofc=bogus a.o", Err("-nvvmpath should be specified with -lto".into())),
            ("-arch=sm_90 -o x -dlto -Ofc=bogus", Ok(Mode::LtoWhole)),
            (
                "-arch=sm_90 -o x -dlto -nvvmpath=/n -Ofc=MAX a.o",
                Err("Invalid argument for option '--Ofast-compile'".into()),
            ),
            ("-arch=sm_90 -o x -Ofc=bogus a.o", conflict("--Ofast-compile", "no -dlto")),
            // Virtual targets: compute_XY needs no -o; lto_XY cannot be linked.
            ("-arch=compute_90 a.o", Ok(Mode::Executable)),
            ("-arch=compute_90 -o x a.o", Ok(Mode::Executable)),
            (
                "-arch=lto_80 a.o",
                Err("Link target of 'lto_80' is virtual target that is not JIT-able; use 'sm_' target instead".into()),
            ),
            ("-arch=lto_80", Ok(Mode::Executable)),
            // The modes.
            ("-arch=sm_90 -o x a.o", Ok(Mode::Executable)),
            ("-arch=sm_90 -o x -g -suppress-debug-info a.o", Ok(Mode::Executable)),
            ("-arch=sm_90 -o x -r a.o", Ok(Mode::Relocatable)),
            ("-arch=sm_90 -o x -dlto -nvvmpath=/n a.o", Ok(Mode::LtoWhole)),
            ("-arch=sm_90 -o x -dlto -nvvmpath=/n -r a.o", Ok(Mode::LtoPartial)),
            ("-arch=sm_90 -o x -dlto -nvvmpath=/n -force-partial-lto a.o", Ok(Mode::LtoPartial)),
            ("-arch=sm_90 -o x -dlto -nvvmpath=/n -emit-ptx -r a.o", Ok(Mode::LtoEmitPtx)),
        ];
        for (args, want) in rows {
            assert_eq!(&mode(args), want, "nvlink {args}");
        }
    }

    #[test]
    fn targets_of_arch() {
        type Row = (&'static str, Option<(u32, Option<char>)>);
        let rows: &[Row] = &[
            ("sm_90", Some((90, None))),
            ("sm_90a", Some((90, Some('a')))),
            ("sm_100f", Some((100, Some('f')))),
            ("sm_121", Some((121, None))),
            ("compute_90", None),
            ("lto_90", None),
            ("sm_", None),
        ];
        for (arch, want) in rows {
            let spec = Spec { arch: Some(arch.to_string()), ..Default::default() };
            assert_eq!(spec.target().map(|t| (t.sm, t.suffix)), *want, "--arch {arch}");
        }
    }
}
