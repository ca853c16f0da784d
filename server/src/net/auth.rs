//! Who may call the remote listener: bearer tokens (`--token-file`), each
//! with a name, and what each token's callers did.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use nvlinkd_core::stats::TokenFigures;

use super::incoming::LogLimit;

/// Who may call the remote listener: the BLAKE3 hashes of the bearer tokens
/// of `--token-file`, each with its name. A presented token is hashed and
/// compared with each in constant time, so neither its contents nor its
/// length leak through timing. The file is read again on [`Auth::reload`]
/// (SIGHUP); calls already admitted are not affected.
///
/// The file: one token per line, `name:secret`, or a bare `secret`, named
/// `token-N` after its line number; blank lines and `#` comments skipped. A
/// name is 1 to 64 letters, digits, `.`, `_` or `-` (it labels metrics and
/// log lines), and names are unique. A secret is at least [`MIN_SECRET`]
/// bytes: a shorter one is guessable, or a token cut short (a file being
/// rewritten while it is read). The secret is never logged or shown.
pub struct Auth {
    file: PathBuf,
    tokens: RwLock<Arc<Vec<Token>>>,
    /// The log lines of refused calls (at most one per `LOG_EVERY`).
    pub(crate) refusal_log: LogLimit,
    /// Remote links per token name, kept across reloads (a token removed
    /// keeps its counts: counters never go back).
    figures: Mutex<BTreeMap<Arc<str>, TokenFigures>>,
}

/// One token of the file.
struct Token {
    hash: [u8; 32],
    name: Arc<str>,
}

/// A call's token, once found among the tokens in force.
#[derive(Clone, Debug)]
pub struct Identified {
    /// The BLAKE3 hash of the secret (who a call counts against, `link/admission.rs`).
    pub hash: [u8; 32],
    pub name: Arc<str>,
}

impl Auth {
    /// The tokens of `file` (a file without any is an error).
    pub fn load(file: &Path) -> Result<Auth, String> {
        let tokens = read_tokens(file)?;
        let auth = Auth {
            file: file.to_owned(),
            tokens: RwLock::new(Arc::new(Vec::new())),
            refusal_log: LogLimit::default(),
            figures: Mutex::new(BTreeMap::new()),
        };
        auth.put(tokens);
        Ok(auth)
    }

    /// Read the token file again: on success its tokens replace the old ones
    /// (their names are returned), else the old ones stay.
    pub fn reload(&self) -> Result<Vec<Arc<str>>, String> {
        let tokens = read_tokens(&self.file)?;
        let names = tokens.iter().map(|t| t.name.clone()).collect();
        self.put(tokens);
        Ok(names)
    }

    /// Put `tokens` in force; each name has its figures from now on.
    fn put(&self, tokens: Vec<Token>) {
        let mut figures = self.figures.lock().unwrap_or_else(|p| p.into_inner());
        for t in &tokens {
            figures.entry(t.name.clone()).or_default();
        }
        *self.tokens.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(tokens);
    }

    /// Whether `metadata` carries `authorization: Bearer <one of the tokens>`.
    pub fn allows(&self, metadata: &tonic::metadata::MetadataMap) -> bool {
        self.identify(metadata).is_some()
    }

    /// The token `metadata` carries, if it is one of the tokens in force.
    pub fn identify(&self, metadata: &tonic::metadata::MetadataMap) -> Option<Identified> {
        let token = metadata.get("authorization").and_then(|v| v.to_str().ok()).and_then(bearer)?;
        let presented = *blake3::hash(token.as_bytes()).as_bytes();
        let tokens = self.tokens.read().unwrap_or_else(|p| p.into_inner()).clone();
        // Every token is compared (no early exit): the time taken does not
        // say whether one matched. (Which one matched, only a caller holding
        // a valid token could learn.) The first line with the secret names it.
        let mut found: Option<&Token> = None;
        for t in tokens.iter() {
            if constant_time_eq::constant_time_eq_32(&t.hash, &presented) && found.is_none() {
                found = Some(t);
            }
        }
        found.map(|t| Identified { hash: presented, name: t.name.clone() })
    }

    /// How many tokens are in force.
    pub fn count(&self) -> usize {
        self.tokens.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// A remote link of token `name` ended: `received` bytes of files came
    /// from its shim, `sent` bytes of answer went back.
    pub fn count_link(&self, name: &Arc<str>, received: u64, sent: u64) {
        let mut figures = self.figures.lock().unwrap_or_else(|p| p.into_inner());
        let f = figures.entry(name.clone()).or_default();
        f.links += 1;
        f.bytes_received += received;
        f.bytes_sent += sent;
    }

    /// A remote link of token `name` was refused (no slot in time).
    pub fn count_refused(&self, name: &Arc<str>) {
        self.figures.lock().unwrap_or_else(|p| p.into_inner()).entry(name.clone()).or_default().refused += 1;
    }

    /// Every token's figures, by name (those in force, and any removed that
    /// counted something), for `stats --json` and `/metrics`.
    pub fn figures(&self) -> Vec<(String, TokenFigures)> {
        let figures = self.figures.lock().unwrap_or_else(|p| p.into_inner());
        figures.iter().map(|(n, f)| (n.to_string(), *f)).collect()
    }
}

/// The shortest secret a token file may hold, in bytes.
pub const MIN_SECRET: usize = 16;

/// Whether `name` may name a token: 1 to 64 of `[A-Za-z0-9._-]`.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// The tokens of a token file (see [`Auth`]): at least one. An error names
/// the file and line, never a secret.
fn read_tokens(f: &Path) -> Result<Vec<Token>, String> {
    let bytes = std::fs::read(f).map_err(|e| format!("cannot read --token-file {}: {e}", f.display()))?;
    let text = String::from_utf8(bytes).map_err(|_| format!("--token-file {} is not text", f.display()))?;
    let mut tokens: Vec<Token> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = |what: &str| format!("--token-file {} line {}: {what}", f.display(), i + 1);
        let (name, secret) = match line.split_once(':') {
            Some((name, secret)) => (name.trim().to_owned(), secret.trim()),
            None => (format!("token-{}", i + 1), line),
        };
        if !valid_name(&name) {
            return Err(at("a token's name (before the `:`) is 1 to 64 letters, digits, `.`, `_` or `-`"));
        }
        if secret.is_empty() {
            return Err(at("no token after the name"));
        }
        if secret.len() < MIN_SECRET {
            return Err(at(&format!("a token is at least {MIN_SECRET} bytes; this one is shorter")));
        }
        if tokens.iter().any(|t| *t.name == *name) {
            return Err(at(&format!("the name {name} is given twice")));
        }
        tokens.push(Token { hash: *blake3::hash(secret.as_bytes()).as_bytes(), name: name.into() });
    }
    if tokens.is_empty() {
        return Err(format!("--token-file {} holds no token", f.display()));
    }
    Ok(tokens)
}

fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token.trim()).filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch token file, removed when dropped.
    struct Scratch(PathBuf);

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn file(text: &str) -> Scratch {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("nvlinkd-auth-{}-{n}", std::process::id()));
        std::fs::write(&p, text).unwrap();
        Scratch(p)
    }

    fn metadata(token: &str) -> tonic::metadata::MetadataMap {
        let mut m = tonic::metadata::MetadataMap::new();
        m.insert("authorization", format!("Bearer {token}").parse().unwrap());
        m
    }

    #[test]
    fn token_lines_are_name_colon_secret_or_a_bare_secret_named_by_its_line() {
        let f = file("# farm\n\nci: s3cret-of-the-ci\nbare-one-0123456789\n  dev-2:other:with:colons:0123 \n");
        let auth = Auth::load(&f.0).unwrap();
        let name = |t: &str| auth.identify(&metadata(t)).map(|i| i.name.to_string());
        assert_eq!(name("s3cret-of-the-ci").as_deref(), Some("ci"));
        assert_eq!(name("bare-one-0123456789").as_deref(), Some("token-4"), "named by its line number");
        assert_eq!(
            name("other:with:colons:0123").as_deref(),
            Some("dev-2"),
            "the secret is what follows the first `:`"
        );
        assert_eq!(name("ci:s3cret-of-the-ci"), None, "the name is no part of the secret");
        assert_eq!(name("wrong"), None);
        assert_eq!(auth.count(), 3);
        let names: Vec<String> = auth.figures().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["ci", "dev-2", "token-4"], "every token has figures from the start");
    }

    #[test]
    fn a_token_file_with_a_bad_or_repeated_name_is_refused_without_its_secret() {
        for (text, says) in [
            ("bad name:secret-1-0123456789\n", "line 1"),
            ("ci:secret-1-0123456789\nci:secret-2-0123456789\n", "given twice"),
            (
                "x-0123456789abcdef\ny-0123456789abcdef\n# token-2 is the line above\ntoken-2:secret-3-0123456789\n",
                "given twice",
            ),
            ("ci:\n", "no token after the name"),
            (&format!("{}:secret-1-0123456789\n", "n".repeat(65)), "line 1"),
        ] {
            let f = file(text);
            let e = Auth::load(&f.0).err().unwrap_or_else(|| panic!("{text:?} was taken"));
            assert!(e.contains(says), "{text:?}: {e}");
            assert!(!e.contains("secret-"), "{text:?}: the error shows a secret: {e}");
        }
    }

    #[test]
    fn a_tokens_figures_outlive_its_removal() {
        let f = file("ci:one-0123456789abcdef\n");
        let auth = Auth::load(&f.0).unwrap();
        let ci = auth.identify(&metadata("one-0123456789abcdef")).unwrap().name;
        auth.count_link(&ci, 10, 20);
        auth.count_refused(&ci);
        std::fs::write(&f.0, "dev:two-0123456789abcdef\n").unwrap();
        assert_eq!(auth.reload().unwrap().iter().map(|n| n.to_string()).collect::<Vec<_>>(), ["dev"]);
        assert!(auth.identify(&metadata("one-0123456789abcdef")).is_none(), "a removed token still works");
        let figures = auth.figures();
        let ci = TokenFigures { links: 1, refused: 1, bytes_received: 10, bytes_sent: 20 };
        assert_eq!(figures, [("ci".to_string(), ci), ("dev".to_string(), TokenFigures::default())]);
    }

    #[test]
    fn a_token_shorter_than_16_bytes_is_refused() {
        for text in ["ci:secret-15-bytes\n", "ok:secret-0123456789\nfifteen-bytes-x\n", "ci:  secret-15-bytes  \n"] {
            let f = file(text);
            let e = Auth::load(&f.0).err().unwrap_or_else(|| panic!("{text:?} was taken"));
            let line = if text.starts_with("ok:") { "line 2" } else { "line 1" };
            assert!(
                e.contains(&f.0.display().to_string()) && e.contains(line) && e.contains("16 bytes"),
                "{text:?}: {e}"
            );
            assert!(!e.contains("secret-15") && !e.contains("fifteen"), "{text:?}: the error shows a secret: {e}");
        }
        let f = file("ci:secret-16-bytes!\n");
        assert_eq!(Auth::load(&f.0).unwrap().count(), 1, "a 16-byte token is enough");
    }

    /// A token file rewritten in place while SIGHUP reads it: what was read
    /// ends mid-token, the last token cut below 16 bytes. The reload is
    /// refused and the old tokens stay in force.
    #[test]
    fn a_token_file_cut_short_mid_token_is_not_reloaded() {
        let f = file("ci:old-token-0123456789\n");
        let auth = Auth::load(&f.0).unwrap();
        std::fs::write(&f.0, "ci:new-token-0123456789\ndev:new-tok").unwrap();
        let e = auth.reload().expect_err("a token file cut short was reloaded");
        assert!(e.contains("line 2") && e.contains("16 bytes"), "{e}");
        assert!(auth.identify(&metadata("old-token-0123456789")).is_some(), "the old token stopped working");
        assert!(auth.identify(&metadata("new-token-0123456789")).is_none(), "a token of the refused file works");
    }
}
