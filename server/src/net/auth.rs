//! Who may call the remote listener: bearer tokens (`--token-file`), each
//! with a name, and what each token's callers did.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use nvlinkd_core::stats::TokenFigures;
use nvlinkd_fs::owner;

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
///
/// The file must be private to the daemon ([`read_private`]): no other user
/// may read or change it, and one that changes while it is read is refused.
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

/// The token check of the remote listener, before anything of a call's body
/// is read: tonic decodes (and decompresses) a request's messages inside the
/// handler, so a handler's own check would come after a caller without a
/// token made the daemon inflate its zstd messages (each up to the 4 MiB
/// bound, 16 streams per connection). The gate refuses such a call on its
/// headers alone; the handlers check again (and mark the connection
/// authenticated). No token file: every call passes.
#[derive(Clone)]
pub struct Gate {
    pub auth: Option<Arc<Auth>>,
    /// Calls refused (`auth_failures`).
    pub failures: Arc<std::sync::atomic::AtomicU64>,
}

impl tonic::service::Interceptor for Gate {
    fn call(&mut self, request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        match &self.auth {
            Some(auth) if !auth.allows(request.metadata()) => {
                self.failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Err(auth.refused(request.remote_addr()))
            }
            _ => Ok(request),
        }
    }
}

impl Auth {
    /// A call without a valid token: logged (at most once per
    /// `LOG_EVERY`), and its answer.
    pub fn refused(&self, peer: Option<std::net::SocketAddr>) -> tonic::Status {
        let peer = peer.map(|a| a.to_string()).unwrap_or_else(|| "?".into());
        // A client retrying in a loop must not fill the log.
        match self.refusal_log.allow() {
            Some(suppressed) => tracing::warn!(
                %peer,
                suppressed,
                "call without a valid bearer token refused (logged at most every {}s; suppressed: refusals not \
                 logged since the last line)",
                crate::net::incoming::LOG_EVERY.as_secs()
            ),
            None => tracing::debug!(%peer, "call without a valid bearer token refused"),
        }
        tonic::Status::unauthenticated("a valid bearer token is required (authorization: Bearer <token>)")
    }

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

/// Remote links by the subject of the client certificate they presented,
/// for callers without a token (`--client-ca` alone), for `stats --json` and
/// `/metrics`: the farm's per-caller figures where certificates name the
/// callers. At most [`CERTIFICATES_MAX`] subjects; links of any more are
/// counted under `(other)`.
#[derive(Default)]
pub struct CertificateFigures(Mutex<std::collections::BTreeMap<String, TokenFigures>>);

/// Subjects counted apart at most.
const CERTIFICATES_MAX: usize = 1024;

impl CertificateFigures {
    fn with(&self, subject: &str, f: impl FnOnce(&mut TokenFigures)) {
        let mut all = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let key = if all.contains_key(subject) || all.len() < CERTIFICATES_MAX { subject } else { "(other)" };
        f(all.entry(key.to_owned()).or_default());
    }

    /// A remote link of the certificate `subject` ended.
    pub fn count_link(&self, subject: &str, received: u64, sent: u64) {
        self.with(subject, |f| {
            f.links += 1;
            f.bytes_received += received;
            f.bytes_sent += sent;
        });
    }

    /// A remote link of the certificate `subject` was refused (no slot in time).
    pub fn count_refused(&self, subject: &str) {
        self.with(subject, |f| f.refused += 1);
    }

    /// Every subject's figures, in subject order.
    pub fn figures(&self) -> Vec<(String, TokenFigures)> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|(s, f)| (s.clone(), *f)).collect()
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
    let bytes = read_private(f, "--token-file")?;
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

/// Reads of a file that changed while it was read, before it is refused.
const READ_TRIES: u32 = 3;

/// The bytes of the secrets' file `f` (named by option `what`), if no other
/// user can read or change it ([`check_private`], on the file a symlink leads
/// to) nor swap it ([`check_dirs`], the directories it is in) and it did not
/// change while it was read: its size and times are the
/// same before and after, and a second read gives the same bytes. A file
/// being rewritten in place (SIGHUP arriving mid-write) is read again, up to
/// [`READ_TRIES`] times, then refused.
pub fn read_private(f: &Path, what: &str) -> Result<Vec<u8>, String> {
    read_private_with(f, what, &mut || {})
}

/// [`read_private`], calling `between` after each first read (tests change
/// the file there).
fn read_private_with(f: &Path, what: &str, between: &mut dyn FnMut()) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let cannot = |e: std::io::Error| format!("cannot read {what} {}: {e}", f.display());
    for attempt in 0..READ_TRIES {
        if attempt > 0 {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let mut file = std::fs::File::open(f).map_err(cannot)?;
        let before = file.metadata().map_err(cannot)?;
        check_private(f, what, &before, access_acl(&file).map_err(cannot)?.as_deref())?;
        check_dirs(f, what)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(cannot)?;
        between();
        let after = file.metadata().map_err(cannot)?;
        let again = std::fs::read(f).map_err(cannot)?;
        if same_version(&before, &after) && after.len() == bytes.len() as u64 && again == bytes {
            return Ok(bytes);
        }
    }
    Err(format!("{what} {} changed while it was read ({READ_TRIES} tries): not taken", f.display()))
}

/// Whether two `stat`s of one open file show the same contents.
fn same_version(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    let v = |m: &std::fs::Metadata| (m.len(), m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec());
    v(a) == v(b)
}

/// Whether only the daemon (and root) can read and change the file of `m`,
/// as ssh asks of a private key: owned by the daemon's user with no access
/// for group or others (`chmod 600`); or owned by root, changed by root only,
/// and readable through a group only where the group is one of the daemon's
/// that no other user is listed in (Kubernetes mounts a secret as root's,
/// readable through the pod's `fsGroup`), or through an ACL entry naming the
/// daemon's user or such a group (systemd hands a credential as root's with
/// an ACL for the daemon's user). Another owner could put tokens of its own
/// in the file: refused. `acl`: the file's access ACL, if it has one.
fn check_private(f: &Path, what: &str, m: &std::fs::Metadata, acl: Option<&[AclEntry]>) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let euid = owner::euid();
    let f = f.display();
    match not_private(m.uid(), m.gid(), m.mode(), acl, euid, &owner::own_group) {
        None => Ok(()),
        Some(NotPrivate::Owner(uid)) => Err(format!(
            "{what} {f} belongs to uid {uid}, not to the daemon's user (uid {euid}) or root: that user could \
             change it; chown {euid} {f} and chmod 600 {f}"
        )),
        Some(NotPrivate::Mode(mode)) => Err(format!(
            "{what} {f} (mode {mode:03o}) can be read or changed by other users than the daemon's: chmod 600 {f}"
        )),
        Some(NotPrivate::Acl(who)) => Err(format!(
            "{what} {f} has an access ACL that lets {who} read or change it: setfacl -b {f} and chmod 600 {f}"
        )),
    }
}

/// Whether no other user could swap the secrets' file `f`: every directory
/// on the way to it, to each symlink on the way, and to the file they lead
/// to ([`owner::secret_dirs`]) is the daemon's user's
/// or root's and written by nobody else, or sticky ([`owner::dirs_above`]; a
/// sticky directory such as /tmp or Kubernetes' secret volume keeps others
/// from renaming what is not theirs, and [`check_private`] has the file be
/// the daemon's user's or root's).
fn check_dirs(f: &Path, what: &str) -> Result<(), String> {
    let cannot = |e: std::io::Error| format!("cannot read {what} {}: {e}", f.display());
    match owner::secret_dirs(f).map_err(cannot)? {
        None => Ok(()),
        Some(above) => Err(format!(
            "{what} {} is under {above}: keep it in a directory only the daemon's user or root can change",
            f.display()
        )),
    }
}

/// Why a secret's file is not private (see [`check_private`]).
#[derive(Debug, PartialEq)]
enum NotPrivate {
    /// Another user's (uid).
    Owner(u32),
    /// Its permission bits let others in.
    Mode(u32),
    /// An ACL entry lets someone else in (who, in words).
    Acl(String),
}

/// One entry of a POSIX access ACL: tag, permission bits, user or group id.
#[derive(Debug, Clone, Copy, PartialEq)]
struct AclEntry {
    tag: u16,
    perm: u16,
    id: u32,
}

const ACL_USER: u16 = 0x02;
const ACL_GROUP_OBJ: u16 = 0x04;
const ACL_GROUP: u16 = 0x08;
const ACL_MASK: u16 = 0x10;

/// The file's access ACL (the `system.posix_acl_access` attribute: a version
/// word, then 8-byte entries), if it has one beyond its mode bits.
fn access_acl(file: &std::fs::File) -> std::io::Result<Option<Vec<AclEntry>>> {
    use std::os::fd::AsRawFd;
    let name = c"system.posix_acl_access";
    let mut buf = vec![0u8; 4 + 8 * 64];
    // SAFETY: the fd is open for this call; the buffer is valid for its length.
    let n = unsafe { libc::fgetxattr(file.as_raw_fd(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENODATA) | Some(libc::ENOTSUP) => Ok(None),
            Some(libc::ERANGE) => Err(std::io::Error::other("an access ACL of more than 64 entries")),
            _ => Err(e),
        };
    }
    Ok(Some(parse_acl(&buf[..n as usize]).ok_or_else(|| std::io::Error::other("an unreadable access ACL"))?))
}

/// Entries of an access ACL in its attribute form (version 2).
fn parse_acl(b: &[u8]) -> Option<Vec<AclEntry>> {
    let (version, rest) = b.split_first_chunk::<4>()?;
    if u32::from_le_bytes(*version) != 2 || rest.len() % 8 != 0 {
        return None;
    }
    let entries = rest.chunks_exact(8).map(|e| AclEntry {
        tag: u16::from_le_bytes([e[0], e[1]]),
        perm: u16::from_le_bytes([e[2], e[3]]),
        id: u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
    });
    Some(entries.collect())
}

/// The rule of [`check_private`] on a file's owner, group, mode and access
/// ACL, for a daemon of user `euid` whose private groups `daemons_group` tells:
/// [`owner::Rule::SECRET`], whose group bits an ACL replaces.
fn not_private(
    uid: u32,
    gid: u32,
    mode: u32,
    acl: Option<&[AclEntry]>,
    euid: u32,
    daemons_group: &dyn Fn(u32) -> bool,
) -> Option<NotPrivate> {
    // With an ACL, the mode's group bits are its mask: the owning group and
    // every named entry are judged one by one instead.
    let acl = acl.filter(|a| a.iter().any(|e| e.tag == ACL_MASK));
    let rule = if acl.is_some() { owner::Rule { refused: 0o007, ..owner::Rule::SECRET } } else { owner::Rule::SECRET };
    match rule.judge(uid, gid, mode, euid, daemons_group) {
        Err(owner::Refusal::Owner { uid, .. }) => return Some(NotPrivate::Owner(uid)),
        Err(owner::Refusal::Mode { mode, .. }) => return Some(NotPrivate::Mode(mode & 0o777)),
        Ok(()) => {}
    }
    for e in acl.unwrap_or_default() {
        let (r, w) = (e.perm & 4 != 0, e.perm & 2 != 0);
        let bad = match e.tag {
            ACL_USER => (r || w) && e.id != euid && e.id != 0,
            ACL_GROUP_OBJ if uid == euid => r || w,
            ACL_GROUP_OBJ => w || r && !daemons_group(gid),
            ACL_GROUP => w || r && !daemons_group(e.id),
            _ => false,
        };
        if bad {
            let who = match e.tag {
                ACL_USER => format!("user {}", e.id),
                ACL_GROUP_OBJ => format!("group {gid}"),
                _ => format!("group {}", e.id),
            };
            return Some(NotPrivate::Acl(who));
        }
    }
    None
}

/// The token of an `authorization` header's value (`Bearer TOKEN`, however
/// spaced and cased).
pub fn bearer(value: &str) -> Option<&str> {
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

    /// A scratch directory, removed with what is in it when dropped.
    struct ScratchDir(PathBuf);

    impl Drop for ScratchDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn file(text: &str) -> Scratch {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("nvlinkd-auth-{}-{n}", std::process::id()));
        std::fs::write(&p, text).unwrap();
        chmod(&p, 0o600);
        Scratch(p)
    }

    fn chmod(p: &Path, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
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

    /// Like ssh with a private key: a token file that another user can read
    /// or change is refused, saying `chmod 600`; a symlink is judged by the
    /// file it leads to (Kubernetes mounts secrets as symlinks).
    #[test]
    fn a_token_file_others_can_read_or_change_is_refused() {
        use std::os::unix::fs::MetadataExt;
        let f = file("ci:secret-0123456789\n");
        let link = PathBuf::from(format!("{}.link", f.0.display()));
        std::os::unix::fs::symlink(&f.0, &link).unwrap();
        let _link = Scratch(link.clone());
        for mode in [0o644, 0o640, 0o604, 0o620, 0o602, 0o660, 0o666] {
            chmod(&f.0, mode);
            for p in [&f.0, &link] {
                let e = Auth::load(p).err().unwrap_or_else(|| panic!("{mode:o} was taken"));
                assert!(e.contains(&format!("chmod 600 {}", p.display())), "{mode:o}: {e}");
                assert!(!e.contains("secret-"), "{e}");
            }
        }
        for mode in [0o600, 0o400] {
            chmod(&f.0, mode);
            assert!(Auth::load(&f.0).is_ok() && Auth::load(&link).is_ok(), "{mode:o} refused");
        }
        // The daemon's (here: this process's) own file, then one of another
        // user (where this process may give it away: as root).
        assert_eq!(std::fs::metadata(&f.0).unwrap().uid(), unsafe { libc::geteuid() });
        let nobody = 65534;
        if unsafe { libc::geteuid() } == 0 && std::os::unix::fs::chown(&f.0, Some(nobody), None).is_ok() {
            let e = Auth::load(&f.0).err().expect("another user's token file was taken");
            assert!(e.contains("uid 65534") && e.contains("chmod 600"), "{e}");
        }
    }

    /// A secret in a directory others can write (not sticky) could be
    /// swapped for theirs between two reads: refused, naming the directory,
    /// also through a symlink from a directory of the daemon's own (the
    /// directories judged are those of the file it leads to). In a sticky
    /// directory (/tmp) others cannot rename the daemon's file: taken.
    #[test]
    fn a_secret_in_a_directory_others_can_write_is_refused_unless_sticky() {
        let scratch = file("");
        let top = PathBuf::from(format!("{}.d", scratch.0.display()));
        let open = top.join("open");
        std::fs::create_dir_all(&open).unwrap();
        let _top = ScratchDir(top.clone());
        chmod(&top, 0o700);
        let tokens = open.join("tokens");
        std::fs::write(&tokens, "ci:secret-0123456789\n").unwrap();
        chmod(&tokens, 0o600);
        let link = top.join("tokens-link");
        std::os::unix::fs::symlink(&tokens, &link).unwrap();
        for mode in [0o777, 0o775, 0o757] {
            chmod(&open, mode);
            for p in [&tokens, &link] {
                let e = read_private(p, "--token-file").err().unwrap_or_else(|| panic!("{mode:o}: taken"));
                let open = open.canonicalize().unwrap();
                assert!(e.contains(&format!("{} (mode {mode:03o})", open.display())), "{mode:o}: {e}");
                assert!(e.contains("which other users can write") && !e.contains("secret-"), "{e}");
            }
        }
        for mode in [0o1777, 0o755, 0o700] {
            chmod(&open, mode);
            assert!(read_private(&tokens, "--token-file").is_ok() && Auth::load(&link).is_ok(), "{mode:o} refused");
        }
        // A directory of another user's (where this process may give one
        // away: as root) could be changed by them: refused.
        if unsafe { libc::geteuid() } == 0 && std::os::unix::fs::chown(&open, Some(65534), None).is_ok() {
            let e = read_private(&tokens, "--token-file").expect_err("a secret in another user's directory was taken");
            assert!(e.contains("a directory of uid 65534"), "{e}");
        }
    }

    /// A daemon not running as root reads a secret mounted as root's through
    /// its own group (Kubernetes' `fsGroup`) or an ACL entry for its user
    /// (systemd's credentials): taken. Through another group, a group shared
    /// with other users or root's group (its members may be anyone), a group
    /// that may change it, or an ACL entry for another user: refused.
    #[test]
    fn roots_token_file_readable_only_through_the_daemons_group_is_taken() {
        let (daemon, its_group, shared_group) = (10001, 10001, 100);
        let groups = |g: u32| g == its_group;
        let judge = |uid, gid, mode| not_private(uid, gid, mode, None, daemon, &groups);
        assert_eq!(judge(0, its_group, 0o100440), None, "Kubernetes' fsGroup with defaultMode 0440");
        assert_eq!(judge(0, shared_group, 0o100400), None, "root's, for root alone (the daemon cannot read it)");
        assert_eq!(judge(daemon, its_group, 0o100600), None);
        assert_eq!(judge(0, shared_group, 0o100440), Some(NotPrivate::Mode(0o440)), "a shared group reads it");
        assert_eq!(judge(0, 0, 0o100440), Some(NotPrivate::Mode(0o440)), "root's group reads it");
        assert_eq!(judge(0, its_group, 0o100460), Some(NotPrivate::Mode(0o460)), "a group changes it");
        assert_eq!(judge(0, its_group, 0o100444), Some(NotPrivate::Mode(0o444)), "anyone reads it");
        assert_eq!(judge(daemon, its_group, 0o100640), Some(NotPrivate::Mode(0o640)), "the daemon's own: chmod 600");
        assert_eq!(judge(1000, its_group, 0o100600), Some(NotPrivate::Owner(1000)), "another user's");

        // ACLs (mode's group bits are the mask): systemd's credential, root's
        // 0440 with `user:<daemon>:r`, is taken; `user:1000:r` is not, nor a
        // named group the daemon does not own alone.
        let e = |tag, perm, id| AclEntry { tag, perm, id };
        let acl = |extra: AclEntry| {
            vec![
                e(0x01, 4, u32::MAX),
                e(ACL_GROUP_OBJ, 0, u32::MAX),
                extra,
                e(ACL_MASK, 4, u32::MAX),
                e(0x20, 0, u32::MAX),
            ]
        };
        let judge_acl = |extra| not_private(0, 0, 0o100440, Some(&acl(extra)), daemon, &groups);
        assert_eq!(judge_acl(e(ACL_USER, 4, daemon)), None, "systemd's credential");
        assert_eq!(judge_acl(e(ACL_USER, 4, 1000)), Some(NotPrivate::Acl("user 1000".into())));
        assert_eq!(judge_acl(e(ACL_USER, 6, daemon)), None, "the daemon may change root's file");
        assert_eq!(judge_acl(e(ACL_GROUP, 4, its_group)), None);
        assert_eq!(judge_acl(e(ACL_GROUP, 4, shared_group)), Some(NotPrivate::Acl("group 100".into())));
        assert_eq!(judge_acl(e(ACL_GROUP, 6, its_group)), Some(NotPrivate::Acl("group 10001".into())));
        let mut readable_group = acl(e(ACL_USER, 4, daemon));
        readable_group[1].perm = 4;
        assert_eq!(
            not_private(0, 0, 0o100440, Some(&readable_group), daemon, &groups),
            Some(NotPrivate::Acl("group 0".into())),
            "root's group reads it"
        );
    }

    /// The ACL as the kernel stores it, parsed; a mode-only file has none.
    #[test]
    fn an_access_acl_is_read_from_its_attribute() {
        let mut b = 2u32.to_le_bytes().to_vec();
        for (tag, perm, id) in [(1u16, 6u16, u32::MAX), (2, 4, 1000), (4, 0, u32::MAX), (0x10, 4, u32::MAX)] {
            b.extend(tag.to_le_bytes());
            b.extend(perm.to_le_bytes());
            b.extend(id.to_le_bytes());
        }
        let acl = parse_acl(&b).unwrap();
        assert_eq!(acl[1], AclEntry { tag: ACL_USER, perm: 4, id: 1000 });
        assert!(parse_acl(&b[..b.len() - 3]).is_none());
        assert!(parse_acl(&[1, 0, 0, 0]).is_none());
        let f = file("ci:secret-0123456789\n");
        assert_eq!(access_acl(&std::fs::File::open(&f.0).unwrap()).unwrap(), None);
    }

    /// A token file changing while it is read (a writer mid-way, SIGHUP
    /// arriving) is read again; one that keeps changing is refused.
    #[test]
    fn a_token_file_changing_while_it_is_read_is_read_again_or_refused() {
        let f = file("ci:secret-0123456789\n");
        let mut writes = 0;
        let mut append_once = || {
            if writes == 0 {
                std::fs::write(&f.0, "ci:secret-0123456789\ndev:secret-abcdefghij\n").unwrap();
            }
            writes += 1;
        };
        let bytes = read_private_with(&f.0, "--token-file", &mut append_once).unwrap();
        assert_eq!(bytes, b"ci:secret-0123456789\ndev:secret-abcdefghij\n", "what was read first was kept");
        assert_eq!(writes, 2, "not read again");
        let mut n = 0;
        let mut always = || {
            n += 1;
            std::fs::write(&f.0, format!("ci:secret-0123456789\ndev:secret-abcdefghij-{n}\n")).unwrap();
        };
        let e = read_private_with(&f.0, "--token-file", &mut always).expect_err("a file that kept changing was taken");
        assert!(e.contains("changed while it was read") && e.contains(&f.0.display().to_string()), "{e}");
    }
}
