//! Diagnostics as nvlink prints them.
//!
//! nvlink writes every message to stderr as `nvlink <severity>: <text>`, the
//! severity left-aligned in eight columns (`nvlink fatal   : `, `nvlink error   : `,
//! `nvlink warning : `, `nvlink info    : `). A fatal message ends the run; errors
//! are collected and the run fails at the end of the stage that found them.
//!
//! [`Report`] is the per-request sink: it applies `-w`, `-Werror` and
//! `--disable-infos` the way nvlink does and remembers what the exit status must be.

use std::fmt;

/// How bad a message is; decides the prefix and whether the link fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Info,
    Warning,
    Error,
    Fatal,
}

impl Severity {
    fn label(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Error => "error",
            Severity::Fatal => "fatal",
        }
    }
}

/// One message, rendered by `Display` exactly as nvlink renders it (no newline).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    pub severity: Severity,
    pub message: String,
}

impl Diagnostic {
    pub fn new(severity: Severity, message: impl Into<String>) -> Self {
        Diagnostic { severity, message: message.into() }
    }
    pub fn fatal(message: impl Into<String>) -> Self {
        Self::new(Severity::Fatal, message)
    }
    pub fn error(message: impl Into<String>) -> Self {
        Self::new(Severity::Error, message)
    }
    pub fn warning(message: impl Into<String>) -> Self {
        Self::new(Severity::Warning, message)
    }
    pub fn info(message: impl Into<String>) -> Self {
        Self::new(Severity::Info, message)
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "nvlink {:<8}: {}", self.severity.label(), self.message)
    }
}

/// Exit status nvlink uses after a fatal message or after option errors.
pub const EXIT_FATAL: i32 = 1;
/// Exit status nvlink uses when the link stage reported errors (`exit(-1)`).
pub const EXIT_LINK_ERROR: i32 = 255;

/// The filters nvlink applies to messages, from its options.
#[derive(Clone, Copy, Debug, Default)]
pub struct Filters {
    /// `-w`: drop warnings.
    pub no_warnings: bool,
    /// `-Werror`: warnings count as errors.
    pub warnings_as_errors: bool,
    /// `--disable-infos`: drop infos.
    pub no_infos: bool,
}

/// What one request printed and whether it failed.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub filters: Filters,
    errors: usize,
}

impl Report {
    pub fn new(filters: Filters) -> Self {
        Report { filters, ..Default::default() }
    }

    /// Record a message, applying the filters. Returns whether it was printed.
    pub fn emit(&mut self, mut d: Diagnostic) -> bool {
        match d.severity {
            Severity::Info if self.filters.no_infos => return false,
            Severity::Warning if self.filters.no_warnings => return false,
            Severity::Warning if self.filters.warnings_as_errors => d.severity = Severity::Error,
            _ => {}
        }
        if d.severity >= Severity::Error {
            self.errors += 1;
        }
        self.stderr.extend_from_slice(d.to_string().as_bytes());
        self.stderr.push(b'\n');
        true
    }

    /// Text nvlink writes to stderr verbatim (`-v` command echoes).
    pub(crate) fn emit_raw(&mut self, text: &str) {
        self.stderr.extend_from_slice(text.as_bytes());
    }

    /// Text nvlink writes to stdout (help, version, `-v` statistics, `-ghls` to stdout).
    pub fn print(&mut self, text: &str) {
        self.stdout.extend_from_slice(text.as_bytes());
    }

    pub fn has_errors(&self) -> bool {
        self.errors > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_padded_like_nvlink() {
        assert_eq!(Diagnostic::fatal("x").to_string(), "nvlink fatal   : x");
        assert_eq!(Diagnostic::error("x").to_string(), "nvlink error   : x");
        assert_eq!(Diagnostic::warning("x").to_string(), "nvlink warning : x");
        assert_eq!(Diagnostic::info("x").to_string(), "nvlink info    : x");
    }

    #[test]
    fn filters_apply() {
        let mut r = Report::new(Filters { no_warnings: true, no_infos: true, ..Default::default() });
        assert!(!r.emit(Diagnostic::warning("w")));
        assert!(!r.emit(Diagnostic::info("i")));
        assert!(!r.has_errors());
        let mut r = Report::new(Filters { warnings_as_errors: true, ..Default::default() });
        r.emit(Diagnostic::warning("w"));
        assert!(r.has_errors());
        assert_eq!(r.stderr, b"nvlink error   : w\n");
    }
}
