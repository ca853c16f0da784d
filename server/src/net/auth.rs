//! Who may call the remote listener: bearer tokens (`--token-file`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use super::incoming::LogLimit;

/// Who may call the remote listener: the BLAKE3 hashes of the bearer tokens
/// of `--token-file`. A presented token is hashed and compared with each in
/// constant time, so neither its contents nor its length leak through timing.
/// The file is read again on [`Auth::reload`] (SIGHUP); calls already
/// admitted are not affected.
pub struct Auth {
    file: PathBuf,
    tokens: RwLock<Arc<Vec<[u8; 32]>>>,
    /// The log lines of refused calls (at most one per `LOG_EVERY`).
    pub(crate) refusal_log: LogLimit,
}

impl Auth {
    /// The tokens of `file` (a file without any is an error).
    pub fn load(file: &Path) -> Result<Auth, String> {
        let tokens = read_tokens(file)?;
        Ok(Auth { file: file.to_owned(), tokens: RwLock::new(Arc::new(tokens)), refusal_log: LogLimit::default() })
    }

    /// Read the token file again: on success its tokens replace the old ones
    /// (the number of tokens is returned), else the old ones stay.
    pub fn reload(&self) -> Result<usize, String> {
        let tokens = read_tokens(&self.file)?;
        let n = tokens.len();
        *self.tokens.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(tokens);
        Ok(n)
    }

    /// Whether `metadata` carries `authorization: Bearer <one of the tokens>`.
    pub fn allows(&self, metadata: &tonic::metadata::MetadataMap) -> bool {
        self.identify(metadata).is_some()
    }

    /// The hash of the token `metadata` carries, if it is one of the tokens
    /// (who a call counts against, `link/admission.rs`).
    pub fn identify(&self, metadata: &tonic::metadata::MetadataMap) -> Option<[u8; 32]> {
        let token = metadata.get("authorization").and_then(|v| v.to_str().ok()).and_then(bearer)?;
        let presented = *blake3::hash(token.as_bytes()).as_bytes();
        let tokens = self.tokens.read().unwrap_or_else(|p| p.into_inner()).clone();
        // Every token is compared (no early exit): the time taken does not say which matched.
        let ok = tokens.iter().fold(false, |ok, t| ok | constant_time_eq::constant_time_eq_32(t, &presented));
        ok.then_some(presented)
    }

    /// How many tokens are in force.
    pub fn count(&self) -> usize {
        self.tokens.read().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// The hashed tokens of a token file: one per line, blank lines and `#`
/// comments skipped; at least one.
fn read_tokens(f: &Path) -> Result<Vec<[u8; 32]>, String> {
    let bytes = std::fs::read(f).map_err(|e| format!("cannot read --token-file {}: {e}", f.display()))?;
    let text = String::from_utf8(bytes).map_err(|_| format!("--token-file {} is not text", f.display()))?;
    let tokens: Vec<[u8; 32]> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|t| *blake3::hash(t.as_bytes()).as_bytes())
        .collect();
    if tokens.is_empty() {
        return Err(format!("--token-file {} holds no token", f.display()));
    }
    Ok(tokens)
}

fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token.trim()).filter(|t| !t.is_empty())
}
