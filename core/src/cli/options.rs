//! nvlink's option table: every option `nvlink --help` lists, plus the hidden
//! ones nvlink accepts, with the names, value kinds and allowed values of
//! nvlink 13.5.

/// Identifies an option independently of how it was spelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Opt {
    OfastCompile,
    Xnvvm,
    Xptxas,
    Arch,
    CpuArch,
    Debug,
    DeviceStackProtector,
    DisableInfos,
    DisableWarnings,
    Dlto,
    DumpCallgraph,
    DumpCallgraphNoDemangle,
    EmitPtx,
    ExtraWarnings,
    GenHostLinkerScript,
    Help,
    IgnoreHostInfo,
    KeepSystemLibraries,
    KernelsUsed,
    Library,
    LibraryPath,
    LinkAsToolsPatch,
    LinkTimeOpt,
    Machine,
    Maxrregcount,
    NvvmLatest,
    Nvvmpath,
    OptionsFile,
    OutputFile,
    PreserveRelocs,
    RegisterLinkBinaries,
    RelocatableLink,
    ReportArch,
    SplitCompile,
    SplitCompileExtended,
    SuppressArchWarning,
    SuppressDebugInfo,
    SuppressStackSizeWarning,
    Time,
    UidxFile,
    UseHostInfo,
    VariablesUsed,
    Verbose,
    Verbose2,
    Version,
    WarningAsError,
    // Hidden options (not in --help).
    HostCcbin,
    ForcePartialLto,
    ForceWholeLto,
    Shared,
    ToolName,
    VerboseTkinfo,
    Xlinker,
    DotFile,
    DontReserveNullPointer,
    DisableSmemReservation,
    AllowUndefinedGlobals,
    SyscallConstOffset,
    ForceRela,
    Uumn,
    CudaApiVersion,
    NvHost,
    EnableExtendedSmem,
    NoCache,
    War4860824,
    DeviceStackProtectorFrameSizeThreshold,
}

/// What follows an option.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arity {
    /// No value.
    Flag,
    /// One value; given again, the last one wins.
    Single,
    /// Comma-separated values; occurrences accumulate.
    List,
}

/// How a value is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueKind {
    Text,
    /// A decimal integer (nvlink: `'<v>': expected a number`).
    Number,
    /// One of the listed values (nvlink: `Value '<v>' is not defined for option '<long>'`).
    Enum(&'static [&'static str]),
    /// A number, and then one of the listed values (`-m`).
    NumberIn(&'static [&'static str]),
    /// `true` or `false` (nvlink: `'<v>': expected true or false`).
    Bool,
}

#[derive(Clone, Copy, Debug)]
pub struct OptionDef {
    pub id: Opt,
    /// Long name, used after `--`.
    pub long: &'static str,
    /// Short name, used after `-`.
    pub short: &'static str,
    pub arity: Arity,
    pub kind: ValueKind,
    /// Whether the value may be glued to the short name (`-Lpath`, `-lname`, `-m64`).
    pub attached: bool,
    /// Value used when the option is given without one (at the end of the
    /// command line, or followed by another option): `-ghls` means `lcs-abs`.
    pub default: Option<&'static str>,
    pub hidden: bool,
}

pub const ARCHS: &[&str] = &[
    "compute_100",
    "compute_100a",
    "compute_100f",
    "compute_103",
    "compute_103a",
    "compute_103f",
    "compute_107",
    "compute_107a",
    "compute_107f",
    "compute_110",
    "compute_110a",
    "compute_110f",
    "compute_120",
    "compute_120a",
    "compute_120f",
    "compute_121",
    "compute_121a",
    "compute_121f",
    "compute_75",
    "compute_80",
    "compute_86",
    "compute_87",
    "compute_88",
    "compute_89",
    "compute_90",
    "compute_90a",
    "lto_100",
    "lto_100a",
    "lto_100f",
    "lto_103",
    "lto_103a",
    "lto_103f",
    "lto_107",
    "lto_107a",
    "lto_107f",
    "lto_110",
    "lto_110a",
    "lto_110f",
    "lto_120",
    "lto_120a",
    "lto_120f",
    "lto_121",
    "lto_121a",
    "lto_121f",
    "lto_75",
    "lto_80",
    "lto_86",
    "lto_87",
    "lto_88",
    "lto_89",
    "lto_90",
    "lto_90a",
    "sm_100",
    "sm_100a",
    "sm_100f",
    "sm_103",
    "sm_103a",
    "sm_103f",
    "sm_107",
    "sm_107a",
    "sm_107f",
    "sm_110",
    "sm_110a",
    "sm_110f",
    "sm_120",
    "sm_120a",
    "sm_120f",
    "sm_121",
    "sm_121a",
    "sm_121f",
    "sm_75",
    "sm_80",
    "sm_86",
    "sm_87",
    "sm_88",
    "sm_89",
    "sm_90",
    "sm_90a",
];
pub const CPU_ARCHS: &[&str] = &["AARCH64", "ARMv7", "PPC64LE", "RISCV64", "X86", "X86_64", "unknown"];

const fn def(id: Opt, long: &'static str, short: &'static str, arity: Arity, kind: ValueKind) -> OptionDef {
    OptionDef { id, long, short, arity, kind, attached: false, hidden: false, default: None }
}
const fn flag(id: Opt, long: &'static str, short: &'static str) -> OptionDef {
    def(id, long, short, Arity::Flag, ValueKind::Text)
}
const fn attached(mut d: OptionDef) -> OptionDef {
    d.attached = true;
    d
}
const fn defaults_to(mut d: OptionDef, v: &'static str) -> OptionDef {
    d.default = Some(v);
    d
}
const fn hidden(mut d: OptionDef) -> OptionDef {
    d.hidden = true;
    d
}

use Arity::*;
use ValueKind::*;

/// In nvlink's registration order, which is the order `.note.nv.tkinfo` renders
/// options in (see `crate::cli::render`). Hidden options, never rendered, last.
pub static OPTIONS: &[OptionDef] = &[
    flag(Opt::SuppressStackSizeWarning, "suppress-stack-size-warning", "suppress-stack-size-warning"),
    flag(Opt::SuppressArchWarning, "suppress-arch-warning", "suppress-arch-warning"),
    def(Opt::OutputFile, "output-file", "o", Single, Text),
    flag(Opt::Debug, "debug", "g"),
    def(Opt::Arch, "arch", "arch", Single, Enum(ARCHS)),
    attached(def(Opt::Machine, "machine", "m", Single, NumberIn(&["64"]))),
    attached(def(Opt::Library, "library", "l", List, Text)),
    attached(def(Opt::LibraryPath, "library-path", "L", List, Text)),
    def(Opt::RegisterLinkBinaries, "register-link-binaries", "", Single, Text),
    flag(Opt::Verbose, "verbose", "v"),
    flag(Opt::Verbose2, "verbose2", "v2"),
    flag(Opt::PreserveRelocs, "preserve-relocs", "preserve-relocs"),
    flag(Opt::DisableWarnings, "disable-warnings", "w"),
    flag(Opt::WarningAsError, "warning-as-error", "Werror"),
    flag(Opt::DisableInfos, "disable-infos", "disable-infos"),
    flag(Opt::KeepSystemLibraries, "keep-system-libraries", "keep-system-libraries"),
    def(Opt::KernelsUsed, "kernels-used", "kernels-used", List, Text),
    def(Opt::VariablesUsed, "variables-used", "variables-used", List, Text),
    def(Opt::CpuArch, "cpu-arch", "cpu-arch", Single, Enum(CPU_ARCHS)),
    flag(Opt::ReportArch, "report-arch", "report-arch"),
    def(Opt::Time, "time", "time", Single, Text),
    flag(Opt::ExtraWarnings, "extra-warnings", "extrawarn"),
    flag(Opt::LinkTimeOpt, "link-time-opt", "lto"),
    flag(Opt::Dlto, "dlto", "dlto"),
    flag(Opt::NvvmLatest, "nvvm-latest", "nvvm-latest"),
    def(Opt::Nvvmpath, "nvvmpath", "nvvmpath", Single, Text),
    def(Opt::SplitCompile, "split-compile", "split-compile", Single, Number),
    def(Opt::SplitCompileExtended, "split-compile-extended", "split-compile-extended", Single, Number),
    // Checked by the mode, where nvlink checks it (`Spec::mode`).
    def(Opt::OfastCompile, "Ofast-compile", "Ofc", Single, Text),
    flag(Opt::SuppressDebugInfo, "suppress-debug-info", "suppress-debug-info"),
    flag(Opt::LinkAsToolsPatch, "link-as-tools-patch", "astoolspatch"),
    def(Opt::Xptxas, "Xptxas", "Xptxas", List, Text),
    def(Opt::Xnvvm, "Xnvvm", "Xnvvm", List, Text),
    def(Opt::Maxrregcount, "maxrregcount", "maxrregcount", Single, Number),
    flag(Opt::DumpCallgraph, "dump-callgraph", "dump-callgraph"),
    flag(Opt::DumpCallgraphNoDemangle, "dump-callgraph-no-demangle", "dump-callgraph-no-demangle"),
    flag(Opt::UseHostInfo, "use-host-info", "use-host-info"),
    flag(Opt::IgnoreHostInfo, "ignore-host-info", "ignore-host-info"),
    flag(Opt::RelocatableLink, "relocatable-link", "r"),
    def(Opt::DeviceStackProtector, "device-stack-protector", "device-stack-protector", Single, Bool),
    def(Opt::OptionsFile, "options-file", "optf", List, Text),
    flag(Opt::EmitPtx, "emit-ptx", "emit-ptx"),
    defaults_to(
        def(Opt::GenHostLinkerScript, "gen-host-linker-script", "ghls", Single, Enum(&["lcs-abs", "lcs-aug"])),
        "lcs-abs",
    ),
    def(Opt::UidxFile, "uidx-file", "uidx", Single, Text),
    flag(Opt::Help, "help", "h"),
    flag(Opt::Version, "version", "V"),
    hidden(def(Opt::HostCcbin, "host-ccbin", "host-ccbin", Single, Text)),
    hidden(flag(Opt::ForcePartialLto, "force-partial-lto", "force-partial-lto")),
    hidden(flag(Opt::ForceWholeLto, "force-whole-lto", "force-whole-lto")),
    hidden(flag(Opt::Shared, "shared", "shared")),
    hidden(def(Opt::ToolName, "tool-name", "tool-name", Single, Text)),
    hidden(def(Opt::VerboseTkinfo, "verbose-tkinfo", "verbose-tkinfo", Single, Bool)),
    hidden(def(Opt::Xlinker, "host-linker-options", "Xlinker", List, Text)),
    hidden(def(Opt::DotFile, "dot-file", "dot", Single, Text)),
    hidden(flag(Opt::DontReserveNullPointer, "dont-reserve-null-pointer", "dont-reserve-null-pointer")),
    hidden(def(Opt::DisableSmemReservation, "disable-smem-reservation", "disable-smem-reservation", Single, Bool)),
    hidden(flag(Opt::AllowUndefinedGlobals, "allow-undefined-globals", "allow-undefined-globals")),
    hidden(def(Opt::SyscallConstOffset, "syscall-const-offset", "syscall-const-offset", Single, Number)),
    hidden(flag(Opt::ForceRela, "force-rela", "force-rela")),
    hidden(flag(Opt::Uumn, "uumn", "uumn")),
    hidden(def(Opt::CudaApiVersion, "cuda-api-version", "cuda-api-version", Single, Text)),
    hidden(def(Opt::NvHost, "nv-host", "nv-host", Single, Text)),
    hidden(def(Opt::EnableExtendedSmem, "enable-extended-smem", "enable-extended-smem", Single, Bool)),
    hidden(flag(Opt::NoCache, "no-cache", "no-cache")),
    hidden(flag(Opt::War4860824, "war4860824", "war4860824")),
    hidden(def(
        Opt::DeviceStackProtectorFrameSizeThreshold,
        "device-stack-protector-frame-size-threshold",
        "device-stack-protector-frame-size-threshold",
        Single,
        Number,
    )),
];

pub(crate) fn by_long(name: &str) -> Option<&'static OptionDef> {
    OPTIONS.iter().find(|d| d.long == name)
}

pub(crate) fn by_short(name: &str) -> Option<&'static OptionDef> {
    OPTIONS.iter().find(|d| !d.short.is_empty() && d.short == name)
}

pub(crate) fn def_of(id: Opt) -> &'static OptionDef {
    // Every Opt has exactly one entry (checked by a test).
    OPTIONS.iter().find(|d| d.id == id).unwrap_or(&OPTIONS[0])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique() {
        for (i, a) in OPTIONS.iter().enumerate() {
            for b in &OPTIONS[i + 1..] {
                assert_ne!(a.id, b.id);
                assert_ne!(a.long, b.long);
                if !a.short.is_empty() {
                    assert_ne!(a.short, b.short, "{:?} {:?}", a.id, b.id);
                }
            }
        }
    }
}
