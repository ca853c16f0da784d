//! Pass 7 of a link, the answer: an engine's result made nvlink's answer
//! (its messages as nvlink prints them, `-report-arch` tags, the `-time`
//! table, the output and registration files), and the checks nvlink makes
//! before it reads any input (`--uidx-file`, the `-time` file).

use crate::cli::spec::{Mode, Spec};
use crate::declined::{Declined, Reason};
use crate::diag::{Diagnostic, Filters, Report};
use crate::elf::{header_machine, EM_CUDA};
use crate::engine::inprocess;
use crate::fs::InputFs;
use crate::input::files::Named;
use crate::plan;
use crate::regbin;
use crate::request::{EngineKind, Outcome, OutputFile};
use crate::toolkit::Toolkit;

/// nvlink's answer to a link its link stage rejects: the plan's messages,
/// then the link errors; no output file, unless nvlink wrote one before
/// failing (and then no registration file), and the registration file
/// where nvlink writes it before failing (`LinkErrors::registers`).
pub(super) fn link_errors_outcome(
    fs: &dyn InputFs,
    spec: &Spec,
    mode: Mode,
    plan: &plan::Plan,
    errors: inprocess::LinkErrors,
) -> Outcome {
    let mut report = plan_report(spec, plan);
    for d in &errors.messages {
        report.emit_raw(&format!("{}\n", report_arch(spec, d.clone())));
    }
    let written = &spec.files.written;
    let mut outputs = match (errors.written, &written.output) {
        (Some(data), Some(o)) => vec![OutputFile { path: o.path.clone(), data: data.into(), append: false }],
        _ => Vec::new(),
    };
    if let (true, Some(r)) = (errors.registers, &written.register) {
        let order = if plan.partial_lto { Mode::Executable } else { mode };
        outputs.extend(regbin::output(&r.path, spec, order, plan.module_ids(), fs));
    }
    Outcome::answer(EngineKind::InProcess, errors.exit_code, report.stdout, report.stderr, outputs)
}

/// The plan's messages as nvlink prints them before a link's own (its input
/// warnings and notes, the link's and the tools' warnings), under the
/// command line's filters; what either answer of an in-process link starts with.
fn plan_report(spec: &Spec, plan: &plan::Plan) -> Report {
    let mut report = Report::new(Filters {
        no_warnings: spec.disable_warnings,
        warnings_as_errors: spec.warning_as_error,
        no_infos: spec.disable_infos,
    });
    for d in plan.warnings.iter().chain(&plan.notes) {
        report.emit_raw(&format!("{}\n", report_arch(spec, d.clone())));
    }
    emit_link_warnings(&mut report, spec, plan);
    emit_tool_warnings(&mut report, spec, plan);
    report
}

/// The answer of a link made in process: the plan's messages as nvlink
/// prints them, the output file and the `--register-link-binaries` file.
pub(super) fn in_process_outcome(
    fs: &dyn InputFs,
    spec: &Spec,
    mode: Mode,
    plan: &plan::Plan,
    output: Vec<u8>,
) -> Outcome {
    let report = plan_report(spec, plan);
    let mut outputs = Vec::new();
    if let Some(o) = &spec.files.written.output {
        outputs.push(OutputFile { path: o.path.clone(), data: output.into(), append: false });
    }
    if let Some(r) = &spec.files.written.register {
        let order = if plan.partial_lto { Mode::Executable } else { mode };
        outputs.extend(regbin::output(&r.path, spec, order, plan.module_ids(), fs));
    }
    Outcome::answer(EngineKind::InProcess, 0, report.stdout, report.stderr, outputs)
}

/// Whether the link registers a device-only input (a cubin, PTX or fatbin
/// file): its module id is made from the input's path, so the result depends
/// on names.
pub(super) fn device_only_registered(spec: &Spec, fs: &dyn InputFs) -> bool {
    spec.register_link_binaries.is_some()
        && spec.files.inputs.iter().any(|i| {
            matches!(i.given.rsplit('.').next(), Some("cubin" | "ptx" | "fatbin"))
                || fs.read(&i.path).map(|d| header_machine(&d) == Some(EM_CUDA)).unwrap_or(true)
        })
}

/// What nvlink answers to a `--uidx-file`, which it reads before any input:
/// a missing file, an empty one, or one without the uidx magic
/// (`\x7fUFTINDX`) are fatal. A real uidx file (and a directory, which nvlink
/// meets with "Memory allocation failure", and anything with `-time`) is left
/// to nvlink.
pub(super) fn uidx_fatal(fs: &dyn InputFs, spec: &Spec, uidx: &Named) -> Result<Diagnostic, Declined> {
    if spec.time.is_some() {
        return Err(Declined::new(Reason::Options, "--uidx-file with -time"));
    }
    let u = &uidx.given;
    match fs.read(&uidx.path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Ok(Diagnostic::fatal(format!("Could not open input file '{u}'")))
        }
        Err(e) => Err(Declined::new(Reason::Options, format!("--uidx-file {u}: {e}"))),
        Ok(data) if data.is_empty() => Ok(Diagnostic::fatal(format!("Could not read file '{u}'"))),
        Ok(data) if !data.starts_with(b"\x7fUFTINDX") => Ok(Diagnostic::fatal("Internal error: not uidx input")),
        Ok(_) => Err(Declined::new(Reason::Options, format!("--uidx-file {u}: a uidx file (nvlink's use of it)"))),
    }
}

/// Whether the link's `-time` file is still to be created (nvlink then writes
/// the table's header first); `Ok(false)` without `-time` or with `-time -`.
/// nvlink creates anything but an existing regular file, header first, before
/// it links: a directory (`-time ''` names the working directory) fails
/// there, and the shim's write of the header fails the same way (`Cannot
/// open file ''`, exit 1, no other output). Another error of its stat is
/// left to nvlink.
pub(super) fn time_file_is_new(fs: &dyn InputFs, spec: &Spec) -> Result<bool, Declined> {
    let Some(time) = &spec.files.written.time else { return Ok(false) };
    let t = &time.given;
    match fs.stat(&time.path) {
        Ok(st) => Ok(st.is_dir),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(Declined::new(Reason::Options, format!("-time {t}: {e}"))),
    }
}

/// nvlink's `-time` table added to an in-process answer: on stdout (`-time
/// -`), header first, or appended to the file (the header only when the link
/// creates it; nvlink opens an existing file only to append rows), written
/// before the other outputs as nvlink writes it first.
pub(super) fn with_time_table(mut o: Outcome, spec: &Spec, file_is_new: bool, rows: &[inprocess::TimeRow]) -> Outcome {
    let Some(t) = spec.time.as_deref() else { return o };
    let table = inprocess::time_rows(rows, spec.arch.as_deref().unwrap_or_default());
    if t == "-" {
        let mut stdout = format!("{}{table}", inprocess::TIME_HEADER).into_bytes();
        stdout.append(&mut o.stdout);
        o.stdout = stdout;
        return o;
    }
    let data = if file_is_new { format!("{}{table}", inprocess::TIME_HEADER) } else { table };
    if let Some(file) = spec.files.written.time.as_ref().filter(|_| !data.is_empty()) {
        o.outputs.insert(0, OutputFile { path: file.path.clone(), data: data.into_bytes().into(), append: true });
    }
    o
}

/// Why a toolkit's links go to its own nvlink (`Release::in_process_proven`).
pub(super) fn unproven(tk: &Toolkit) -> Declined {
    let (major, minor) = (tk.release.major, tk.release.minor);
    Declined::new(Reason::Release, format!("the in-process engine is not proven on CUDA {major}.{minor}"))
}

/// nvlink's link-stage warnings (`Plan::link_warnings`), already as it
/// prints them (`-w` does not hide them), tagged by `-report-arch`.
fn emit_link_warnings(report: &mut Report, spec: &Spec, plan: &plan::Plan) {
    for d in &plan.link_warnings {
        report.emit_raw(&format!("{}\n", report_arch(spec, d.clone())));
    }
}

/// `-report-arch`: every message nvlink prints once its options are read (not
/// the option parser's own) ends with ` (target: <--arch as given>)`, so that
/// the messages of nvcc's one-call-per-arch device links can be told apart.
/// The tools' own lines (ptxas's warnings under `-dlto -g`): printed whatever
/// `-w`, `-Werror` or `--disable-infos` say, tagged by `-report-arch`.
fn emit_tool_warnings(report: &mut Report, spec: &Spec, plan: &plan::Plan) {
    for line in &plan.tool_warnings {
        match (spec.report_arch, spec.arch.as_deref()) {
            (true, Some(arch)) => report.emit_raw(&format!("{line} (target: {arch})\n")),
            _ => report.emit_raw(&format!("{line}\n")),
        }
    }
}

pub(super) fn report_arch(spec: &Spec, mut d: Diagnostic) -> Diagnostic {
    if let (true, Some(arch)) = (spec.report_arch, spec.arch.as_deref()) {
        d.message = format!("{} (target: {arch})", d.message);
    }
    d
}
