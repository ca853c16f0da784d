//! Whose a file or a directory nvlinkd trusts may be, and what other users may
//! do with it: the one rule behind the daemon's cache directory, the overlay's
//! directories and those above them, the daemon's secrets and the shim's
//! token file.
//!
//! A [`Rule`] names who may own the thing ([`Owners`]: this process's
//! effective user, or that user or root) and which permission bits are
//! refused ([`Rule::refused`]), with the two exceptions the checks need: the
//! write bits of a sticky directory (others may add entries to it but not
//! rename or remove this user's, as in /tmp), and group read on root's file
//! where the group is this process's alone ([`own_group`]: Kubernetes mounts a
//! secret as root's, readable through the pod's `fsGroup`). [`Rule::check`]
//! judges a file's metadata; [`dirs_above`] judges every directory on the way
//! to something, which whoever can write could swap. The refusal
//! ([`Refusal`], [`Above`]) says why in words; each caller adds what to do.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Who may own a file or directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owners {
    /// This process's effective user alone (what it writes into).
    Me,
    /// This process's effective user or root (what it reads or runs: root
    /// could change it anyway).
    MeOrRoot,
}

/// Who may own a file or directory, and which of its permission bits are
/// refused. See the module's documentation.
#[derive(Clone, Copy, Debug)]
pub struct Rule {
    pub owners: Owners,
    /// The permission bits (of `0o777`) that are refused: `0o022`, nobody
    /// else writes; `0o027`, the group may read, others nothing; `0o077`,
    /// nobody else at all.
    pub refused: u32,
    /// A directory's write bits are not refused where its sticky bit is set.
    pub sticky: bool,
    /// Group read (`0o040`) is not refused on root's file whose group is
    /// this process's alone ([`own_group`]); group write still is.
    pub roots_group_reads: bool,
}

impl Rule {
    /// Owned by `owners`; nothing else refused (a symlink, whose mode means
    /// nothing, or a directory whose mode the caller judges itself).
    pub const fn owned_by(owners: Owners) -> Rule {
        Rule { owners, refused: 0, sticky: false, roots_group_reads: false }
    }

    /// A directory this process writes into (the overlay's): its own,
    /// written by nobody else.
    pub const OWN_DIR: Rule = Rule { owners: Owners::Me, refused: 0o022, sticky: false, roots_group_reads: false };

    /// A directory on the way to something trusted ([`dirs_above`]): this
    /// user's or root's, written by nobody else unless sticky.
    pub const DIR_ABOVE: Rule =
        Rule { owners: Owners::MeOrRoot, refused: 0o022, sticky: true, roots_group_reads: false };

    /// A daemon's secret (token file, fleet key), as ssh asks of a private
    /// key: this user's with nothing for group or others (`chmod 600`), or
    /// root's, changed by root alone and read by a group only where that
    /// group is this process's alone.
    pub const SECRET: Rule = Rule { owners: Owners::MeOrRoot, refused: 0o077, sticky: false, roots_group_reads: true };

    /// A secret shared with a group (the shim's token file: CI runners and
    /// Kubernetes share one with a group): this user's or root's, read by the
    /// group, nothing for others.
    pub const GROUP_SECRET: Rule =
        Rule { owners: Owners::MeOrRoot, refused: 0o027, sticky: false, roots_group_reads: false };

    /// Judge the metadata `m` (of the file itself: `std::fs::metadata`, or
    /// `symlink_metadata` for a symlink) for this process.
    pub fn check(&self, m: &std::fs::Metadata) -> Result<(), Refusal> {
        self.judge(m.uid(), m.gid(), m.mode(), euid(), &own_group)
    }

    /// The rule on an owner, group and mode, for a process of user `me`
    /// whose groups of its own `own_group` tells (tests give their own).
    pub fn judge(
        &self,
        uid: u32,
        gid: u32,
        mode: u32,
        me: u32,
        own_group: &dyn Fn(u32) -> bool,
    ) -> Result<(), Refusal> {
        let root = self.owners == Owners::MeOrRoot;
        if uid != me && !(root && uid == 0) {
            return Err(Refusal::Owner { uid, me, root });
        }
        let sticky = self.sticky && mode & 0o1000 != 0;
        let mut refused = self.refused & if sticky { !0o022 } else { !0 };
        if self.roots_group_reads && uid != me && refused & 0o040 != 0 && own_group(gid) {
            refused &= !0o040;
        }
        if mode & refused != 0 {
            return Err(Refusal::Mode { mode: mode & 0o7777, read: self.refused & 0o044 != 0 });
        }
        Ok(())
    }
}

/// Why a [`Rule`] refuses a file or directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// It belongs to user `uid`, not to this process's user `me` (nor to
    /// root, where `root` says root may own it).
    Owner { uid: u32, me: u32, root: bool },
    /// Its permission bits (`mode`, of `0o7777`) let other users change it,
    /// or read it where the rule refuses reading (`read`).
    Mode { mode: u32, read: bool },
}

/// "belongs to uid U, not to this user (M)[ or root]", "(mode NNN) can be
/// [read or ]changed by other users": the caller names the file before it
/// and says what to do after it.
impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Refusal::Owner { uid, me, root } => {
                write!(f, "belongs to uid {uid}, not to this user ({me}){}", if root { " or root" } else { "" })
            }
            Refusal::Mode { mode, read } => {
                write!(f, "(mode {mode:03o}) can be {}changed by other users", if read { "read or " } else { "" })
            }
        }
    }
}

/// A directory on the way to something that another user could change, and
/// so swap what is in it ([`dirs_above`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Above {
    pub dir: PathBuf,
    pub why: Refusal,
    /// `dir` is a symbolic link on the way (another user's), not a directory.
    pub link: bool,
}

/// "DIR, a directory of uid U (who could replace what is in it)", "DIR (mode
/// NNN), which other users can write (and so replace what is in it)".
impl std::fmt::Display for Above {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dir = self.dir.display();
        match self.why {
            Refusal::Owner { uid, .. } if self.link => {
                write!(f, "{dir}, a symbolic link of uid {uid} (who could point it elsewhere)")
            }
            Refusal::Owner { uid, .. } => {
                write!(f, "{dir}, a directory of uid {uid} (who could replace what is in it)")
            }
            Refusal::Mode { mode, .. } => {
                write!(f, "{dir} (mode {mode:03o}), which other users can write (and so replace what is in it)")
            }
        }
    }
}

/// Judge `from` and every directory above it by [`Rule::DIR_ABOVE`]: whoever
/// owns one of them, or can write one that is not sticky, could move what is
/// below away and put their own in its place. The first refused, if any.
///
/// `from` should be resolved (`canonicalize`): the directories judged are
/// those the path names, and a symlink among them is judged by its target.
/// Below a sticky directory, what is on the way is safe only where it is this
/// user's or root's too: every directory further down is, by this rule, and
/// the caller judges the last entry (a secret must be this user's or root's).
pub fn dirs_above(from: &Path) -> std::io::Result<Option<Above>> {
    for dir in from.ancestors().filter(|a| !a.as_os_str().is_empty()) {
        let m = std::fs::metadata(dir)?;
        if let Err(why) = Rule::DIR_ABOVE.check(&m) {
            return Ok(Some(Above { dir: dir.to_owned(), why, link: false }));
        }
    }
    Ok(None)
}

/// [`dirs_above`] for a secret's file as named (`path`, maybe relative, maybe
/// a symlink): the directories of `path` itself, of every symlink on the way
/// to the file, and of the file. A symlink in a directory others can write
/// could be pointed elsewhere (at another private file of this user or root,
/// read as the secret) as surely as the file could be swapped.
pub fn secret_dirs(path: &Path) -> std::io::Result<Option<Above>> {
    let mut p = std::path::absolute(path)?;
    // As the kernel does, give up after 40 links.
    for _ in 0..40 {
        if let Some(above) = p.parent().map(dirs_above).transpose()?.flatten() {
            return Ok(Some(above));
        }
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                // Another user's link, even in a sticky directory, is theirs
                // to re-point.
                if let Err(why) = Rule::owned_by(Owners::MeOrRoot).check(&m) {
                    return Ok(Some(Above { dir: p, why, link: true }));
                }
                let target = std::fs::read_link(&p)?;
                p = match p.parent() {
                    Some(dir) => dir.join(target),
                    None => target,
                };
            }
            _ => break,
        }
    }
    let real = std::fs::canonicalize(path)?;
    real.parent().map(dirs_above).transpose().map(Option::flatten)
}

/// This process's effective user id.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Whether `gid` is one of this process's groups (effective or
/// supplementary) that no other user is in, as the user and group databases
/// say: neither listed as a member nor having it as primary group. The
/// process's own group is, and a pod's `fsGroup` (listed nowhere); a shared
/// group (`users`, `docker`, a team's) is not, nor root's group for a process
/// that is not root.
pub fn own_group(gid: u32) -> bool {
    // SAFETY: getegid cannot fail.
    let (egid, euid) = (unsafe { libc::getegid() }, euid());
    let mine = gid == egid || {
        // SAFETY: getgroups with a zero size writes nothing and says how many there are.
        let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
        let mut groups = vec![0 as libc::gid_t; n.max(0) as usize];
        // SAFETY: getgroups writes at most `groups.len()` entries.
        let n = unsafe { libc::getgroups(groups.len() as libc::c_int, groups.as_mut_ptr()) };
        groups.truncate(n.max(0) as usize);
        groups.contains(&gid)
    };
    if !mine {
        return false;
    }
    let members = group(gid).map(|(_, members)| members).unwrap_or_default();
    let me = if members.is_empty() { None } else { user_name(euid) };
    members.iter().all(|m| Some(m) == me.as_ref()) && !others_primary(gid, euid)
}

/// Whether a user other than `euid` has `gid` as primary group.
pub fn others_primary(gid: u32, euid: u32) -> bool {
    // getpwent walks one process-wide cursor.
    static WALK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = WALK.lock().unwrap_or_else(|p| p.into_inner());
    let mut found = false;
    // SAFETY: the walk is serialised above; each entry is read before the next call.
    unsafe {
        libc::setpwent();
        loop {
            let pw = libc::getpwent();
            if pw.is_null() {
                break;
            }
            if (*pw).pw_gid == gid && (*pw).pw_uid != euid {
                found = true;
                break;
            }
        }
        libc::endpwent();
    }
    found
}

/// The name of group `gid` and the user names the group database lists in
/// it, if the database knows the group.
pub fn group(gid: u32) -> Option<(String, Vec<String>)> {
    let mut buf = vec![0 as libc::c_char; 1 << 16];
    // SAFETY: an all-zero `group` is a valid value to be filled in.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; the strings it fills point into `buf`.
    let rc = unsafe { libc::getgrgid_r(gid, &mut grp, buf.as_mut_ptr(), buf.len(), &mut found) };
    if rc != 0 || found.is_null() {
        return None;
    }
    let name = if grp.gr_name.is_null() {
        String::new()
    } else {
        // SAFETY: gr_name is a C string in `buf`.
        unsafe { std::ffi::CStr::from_ptr(grp.gr_name) }.to_string_lossy().into_owned()
    };
    let mut members = Vec::new();
    let mut at = grp.gr_mem;
    // SAFETY: gr_mem is null or a null-terminated array of C strings in `buf`.
    unsafe {
        while !at.is_null() && !(*at).is_null() {
            members.push(std::ffi::CStr::from_ptr(*at).to_string_lossy().into_owned());
            at = at.add(1);
        }
    }
    Some((name, members))
}

/// The name of user `uid` in the user database, if it has one.
pub fn user_name(uid: u32) -> Option<String> {
    let mut buf = vec![0 as libc::c_char; 1 << 14];
    // SAFETY: an all-zero `passwd` is a valid value to be filled in.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; the strings it fills point into `buf`.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut found) };
    if rc != 0 || found.is_null() {
        return None;
    }
    // SAFETY: pw_name is a C string in `buf`.
    Some(unsafe { std::ffi::CStr::from_ptr(pw.pw_name) }.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const ME: u32 = 10001;
    const THEM: u32 = 1000;

    fn none(_: u32) -> bool {
        false
    }

    /// Each site's rule, on owner and mode: the overlay's directories are
    /// this user's alone and written by nobody else; the shim's token file
    /// may be root's and read by its group; a directory above may be sticky.
    #[test]
    fn owners_and_refused_bits() {
        let own = |r: Rule, uid, mode| r.judge(uid, 0, mode, ME, &none);
        assert_eq!(own(Rule::OWN_DIR, ME, 0o40755), Ok(()));
        assert_eq!(own(Rule::OWN_DIR, 0, 0o40755), Err(Refusal::Owner { uid: 0, me: ME, root: false }));
        assert_eq!(own(Rule::OWN_DIR, ME, 0o40775), Err(Refusal::Mode { mode: 0o775, read: false }));
        assert_eq!(
            own(Rule::OWN_DIR, ME, 0o41777),
            Err(Refusal::Mode { mode: 0o1777, read: false }),
            "not sticky-safe"
        );
        assert_eq!(own(Rule::DIR_ABOVE, 0, 0o41777), Ok(()), "/tmp");
        assert_eq!(own(Rule::DIR_ABOVE, 0, 0o40777), Err(Refusal::Mode { mode: 0o777, read: false }));
        assert_eq!(own(Rule::DIR_ABOVE, THEM, 0o40755), Err(Refusal::Owner { uid: THEM, me: ME, root: true }));
        assert_eq!(own(Rule::GROUP_SECRET, ME, 0o100640), Ok(()), "a group reads the shim's token");
        assert_eq!(own(Rule::GROUP_SECRET, 0, 0o100640), Ok(()));
        assert_eq!(own(Rule::GROUP_SECRET, ME, 0o100660), Err(Refusal::Mode { mode: 0o660, read: true }));
        assert_eq!(own(Rule::GROUP_SECRET, ME, 0o100604), Err(Refusal::Mode { mode: 0o604, read: true }));
        assert_eq!(own(Rule::owned_by(Owners::MeOrRoot), 0, 0o120777), Ok(()), "root's symlink");
    }

    /// A daemon's secret: root's file is read through a group only where the
    /// group is the daemon's alone; its own file by nobody else at all.
    #[test]
    fn a_secret_is_read_through_a_group_of_ones_own_only() {
        let its_group = |g: u32| g == ME;
        let judge = |uid, gid, mode| Rule::SECRET.judge(uid, gid, mode, ME, &its_group);
        assert_eq!(judge(0, ME, 0o100440), Ok(()), "fsGroup");
        assert_eq!(judge(0, 100, 0o100440), Err(Refusal::Mode { mode: 0o440, read: true }), "a shared group");
        assert_eq!(judge(0, ME, 0o100460), Err(Refusal::Mode { mode: 0o460, read: true }), "a group writes it");
        assert_eq!(judge(ME, ME, 0o100640), Err(Refusal::Mode { mode: 0o640, read: true }), "its own: 600");
        assert_eq!(judge(THEM, ME, 0o100600), Err(Refusal::Owner { uid: THEM, me: ME, root: true }));
    }

    /// A group is another user's too where it is that user's primary group
    /// (the group file lists no such member): root's group is root's.
    #[test]
    fn a_primary_group_of_another_user_is_shared() {
        assert!(others_primary(0, 4_242_424), "root's group is root's primary group");
        assert!(!others_primary(4_242_424, 0), "nobody's primary group");
    }

    /// The words of a refusal, which callers put after the file's name.
    #[test]
    fn refusals_say_why() {
        let owner = Refusal::Owner { uid: 65534, me: 0, root: true };
        assert_eq!(owner.to_string(), "belongs to uid 65534, not to this user (0) or root");
        assert_eq!(
            Refusal::Mode { mode: 0o644, read: true }.to_string(),
            "(mode 644) can be read or changed by other users"
        );
        let above = Above { dir: "/srv/team".into(), why: Refusal::Mode { mode: 0o775, read: false }, link: false };
        assert_eq!(
            above.to_string(),
            "/srv/team (mode 775), which other users can write (and so replace what is in it)"
        );
    }

    /// A scratch directory, removed when dropped.
    struct Scratch(PathBuf);

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn scratch(tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("nvlinkd-fs-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).unwrap();
        Scratch(p.canonicalize().unwrap())
    }

    /// A secret named through a symlink: the link's directory is judged too
    /// (another user could re-point a link in a directory they can write at
    /// another private file), and so is the file's; a link in a private
    /// directory to a file in a private directory passes.
    #[test]
    fn a_symlink_to_a_secret_in_a_directory_others_can_write_is_named() {
        let s = scratch("secret-link");
        let (private, open) = (s.0.join("private"), s.0.join("open"));
        for d in [&private, &open] {
            std::fs::create_dir(d).unwrap();
        }
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        std::fs::write(private.join("tokens"), "secret\n").unwrap();
        std::os::unix::fs::symlink(private.join("tokens"), open.join("tokens")).unwrap();
        std::os::unix::fs::symlink("tokens", private.join("again")).unwrap();
        assert_eq!(secret_dirs(&private.join("tokens")).unwrap(), None);
        assert_eq!(
            secret_dirs(&private.join("again")).unwrap(),
            None,
            "a link beside the file, in a private directory"
        );
        let found = secret_dirs(&open.join("tokens")).unwrap().expect("the link's open directory was not named");
        assert_eq!(found.dir, open);
        // Another user's link in a sticky directory: theirs to re-point.
        let sticky = s.0.join("sticky");
        std::fs::create_dir(&sticky).unwrap();
        std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).unwrap();
        std::os::unix::fs::symlink(private.join("tokens"), sticky.join("theirs")).unwrap();
        std::os::unix::fs::symlink(private.join("tokens"), sticky.join("mine")).unwrap();
        assert_eq!(secret_dirs(&sticky.join("mine")).unwrap(), None, "this user's link in a sticky directory");
        if euid() == 0 {
            std::os::unix::fs::lchown(sticky.join("theirs"), Some(65534), None).unwrap();
            let found = secret_dirs(&sticky.join("theirs")).unwrap().expect("another user's link was not named");
            assert_eq!(found.dir, sticky.join("theirs"));
            assert!(found.to_string().contains("a symbolic link of uid 65534"), "{found}");
        }
        // A link in a private directory to a file in the open one.
        std::fs::rename(private.join("tokens"), open.join("real")).unwrap();
        std::os::unix::fs::symlink(open.join("real"), private.join("to-open")).unwrap();
        assert_eq!(secret_dirs(&private.join("to-open")).unwrap().map(|a| a.dir), Some(open));
    }

    /// A directory on the way that others can write is named; made sticky,
    /// it is not (others cannot rename what is not theirs); nor is a private
    /// one. (The temporary directory and those above it are assumed safe, as
    /// /tmp is.)
    #[test]
    fn a_directory_above_others_can_write_is_named_unless_sticky() {
        let s = scratch("above");
        let open = s.0.join("open");
        let inner = open.join("inner");
        std::fs::create_dir_all(&inner).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let found = dirs_above(&inner).unwrap().expect("a directory others can write was not named");
        assert_eq!(found, Above { dir: open.clone(), why: Refusal::Mode { mode: 0o777, read: false }, link: false });
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert_eq!(dirs_above(&inner).unwrap(), None, "a sticky directory");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o770)).unwrap();
        assert!(dirs_above(&inner).unwrap().is_some(), "a group-writable directory");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(dirs_above(&inner).unwrap(), None);
        if euid() == 0 {
            std::os::unix::fs::chown(&open, Some(65534), None).unwrap();
            let found = dirs_above(&inner).unwrap().expect("another user's directory was not named");
            assert_eq!(found.why, Refusal::Owner { uid: 65534, me: 0, root: true });
        }
    }
}
