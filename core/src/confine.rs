//! Confinement of the processes that parse a client's bytes.
//!
//! The real nvlink run on a link's sandbox (remote links and verification,
//! `engine/sandbox.rs`), ptxas on a link's PTX and the nvJitLink/NVVM workers
//! all read bytes a client chose. Each starts confined, between fork and exec:
//!
//! - **Files (Landlock).** Read and execute: the toolkit's directories (its
//!   root and the real directories of `bin`, `lib`, `nvvm`, however symlinked)
//!   and the system's shared libraries (`/lib`, `/lib64`, `/usr/lib`,
//!   `/usr/lib64`, `/etc/ld.so.cache`), which the loader needs; read and write:
//!   the link's own sandbox and scratch directories; nothing else, `/proc` and
//!   `/dev` included (nvlink 13.5 and ptxas need neither, measured with
//!   `strace`). Measured on nvlink's own traces: it opens only its loader's
//!   files, its inputs and its outputs.
//! - **Network and other processes.** No TCP bind or connect (Landlock), no
//!   signal to or abstract socket of a process outside the domain (Landlock
//!   scopes, which also forbid ptrace of the daemon), and a seccomp filter
//!   refusing `socket`, io_uring (which could open sockets past the filter),
//!   ptrace, BPF, mounts and namespaces, keyrings and module loading.
//! - **Optionally a separate uid** (`--sandbox-user NAME`, a daemon running as
//!   root): the sandbox and scratch are handed to that user first.
//!
//! A kernel without Landlock (before 5.13, or configured out) still gets the
//! seccomp filter; `--confine=require` refuses to start there, the default
//! `auto` warns once. Each limit is checked by a probe in place of nvlink
//! (`tests/tests/confine.rs`).
//!
//! Everything a confined start needs (the ruleset's descriptor, the filter)
//! is prepared before the fork; the child only makes async-signal-safe
//! syscalls.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

use landlock::{path_beneath_rules, Access, AccessFs, AccessNet, Ruleset, RulesetAttr, RulesetCreatedAttr, Scope, ABI};

/// Whether processes parsing client bytes are confined (`--confine`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Confined as far as the kernel allows (a warning where it has no Landlock).
    #[default]
    Auto,
    /// Confined, or the daemon does not start.
    Require,
    /// Not confined (tests of the unconfined path, debugging).
    Off,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Mode::Auto),
            "require" => Ok(Mode::Require),
            "off" => Ok(Mode::Off),
            _ => Err(format!("'{s}': expected auto, require or off")),
        }
    }
}

/// The user confined processes run as (`--sandbox-user`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

impl SandboxUser {
    /// The user named `name` (a login name or a numeric uid) from the system's
    /// user database. Not root: a confined process never gains privileges.
    pub fn lookup(name: &str) -> Result<SandboxUser, String> {
        let cname = std::ffi::CString::new(name).map_err(|_| format!("'{name}': not a user name"))?;
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut buf = vec![0 as libc::c_char; 16 * 1024];
        let mut found: *mut libc::passwd = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call; `buf` outlives `pwd`'s
        // borrowed strings, which are not kept.
        let rc = unsafe { libc::getpwnam_r(cname.as_ptr(), &mut pwd, buf.as_mut_ptr(), buf.len(), &mut found) };
        let (uid, gid) = if rc == 0 && !found.is_null() {
            (pwd.pw_uid, pwd.pw_gid)
        } else if let Ok(uid) = name.parse::<u32>() {
            (uid, uid)
        } else {
            return Err(format!("no user '{name}'"));
        };
        if uid == 0 {
            return Err(format!("'{name}' is root: a sandbox user must be unprivileged"));
        }
        Ok(SandboxUser { name: name.to_owned(), uid, gid })
    }
}

/// The confinement policy of a daemon.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    pub mode: Mode,
    pub user: Option<SandboxUser>,
    /// The executable whose `confine` subcommand confines itself and then
    /// runs the tool ([`confine_and_exec`]): the daemon starts it without forking
    /// (`posix_spawn`), so its own memory is never marked copy-on-write (a
    /// fork would make its next write to every page fault). None: the jail is
    /// applied between fork and exec.
    pub exe: Option<PathBuf>,
}

/// What the kernel offers (checked once).
#[derive(Clone, Copy, Debug)]
pub struct Support {
    /// The Landlock ABI version, where the kernel has Landlock.
    pub landlock: Option<i32>,
}

/// The kernel's Landlock ABI (0 or less: none).
pub fn support() -> Support {
    static SUPPORT: OnceLock<Support> = OnceLock::new();
    *SUPPORT.get_or_init(|| {
        // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION)
        // only returns the ABI version (or -1 with errno).
        let v = unsafe { libc::syscall(libc::SYS_landlock_create_ruleset, std::ptr::null::<u8>(), 0usize, 1u32) };
        Support { landlock: (v > 0).then_some(v as i32) }
    })
}

impl Policy {
    pub fn off() -> Policy {
        Policy { mode: Mode::Off, user: None, exe: None }
    }

    /// A command that runs `program` confined to `read` (and the system's
    /// libraries) and `write`, at idle CPU priority where `idle`: through the
    /// `confine` helper where there is one (no fork of the daemon), else with
    /// the jail applied between fork and exec. Off: `program` as it is.
    pub fn command(&self, program: &Path, read: &[PathBuf], write: &[&Path], idle: bool) -> Result<Command, String> {
        if !self.enabled() {
            let mut cmd = Command::new(program);
            if idle {
                crate::sched::apply_to_command(&mut cmd, crate::sched::Priority::Background);
            }
            return Ok(cmd);
        }
        if let Some(exe) = &self.exe {
            let mut cmd = Command::new(exe);
            cmd.arg("confine");
            if self.mode == Mode::Require {
                cmd.arg("--require");
            }
            if idle {
                cmd.arg("--idle");
            }
            for r in read {
                cmd.arg("--read").arg(r);
            }
            for w in write {
                cmd.arg("--write").arg(w);
            }
            if let Some(u) = &self.user {
                cmd.arg("--uid").arg(u.uid.to_string()).arg("--gid").arg(u.gid.to_string());
            }
            cmd.arg("--").arg(program);
            return Ok(cmd);
        }
        let mut cmd = Command::new(program);
        if idle {
            crate::sched::apply_to_command(&mut cmd, crate::sched::Priority::Background);
        }
        if let Some(jail) = self.jail(read, write)? {
            jail.apply(&mut cmd);
        }
        Ok(cmd)
    }

    /// Whether processes are confined at all.
    pub fn enabled(&self) -> bool {
        self.mode != Mode::Off
    }

    /// Check the policy against this host at start: `require` without
    /// Landlock, or a sandbox user without the privilege to switch to it, is
    /// an error; `auto` without Landlock a warning.
    pub fn check(&self) -> Result<String, String> {
        if !self.enabled() {
            return Ok("processes parsing client bytes are not confined (--confine=off)".into());
        }
        if self.user.is_some() && unsafe { libc::geteuid() } != 0 {
            return Err("--sandbox-user needs a daemon running as root".into());
        }
        let user = self.user.as_ref().map(|u| format!(", as {} ({})", u.name, u.uid)).unwrap_or_default();
        match support().landlock {
            Some(v) => Ok(format!("confined: Landlock ABI {v} and seccomp{user}")),
            None if self.mode == Mode::Require => {
                Err("--confine=require: this kernel has no Landlock (Linux 5.13 or later with landlock in its LSMs)"
                    .into())
            }
            None => {
                tracing::warn!("this kernel has no Landlock: confined processes get the seccomp filter only");
                Ok(format!("confined: seccomp only{user}"))
            }
        }
    }

    /// A jail for one process: `read` (and the system's libraries) readable
    /// and executable, `write` writable; None when confinement is off.
    pub fn jail(&self, read: &[PathBuf], write: &[&Path]) -> Result<Option<Jail>, String> {
        if !self.enabled() {
            return Ok(None);
        }
        let ruleset = ruleset(read, write).map_err(|e| format!("confinement: {e}"))?;
        if ruleset.is_none() && self.mode == Mode::Require {
            return Err("confinement: Landlock is not available".into());
        }
        let filter = filter().map_err(|e| format!("confinement: {e}"))?;
        Ok(Some(Jail { ruleset, filter, user: self.user.clone() }))
    }

    /// Hand `paths` (and everything below them) to the sandbox user, if any.
    pub fn hand_over(&self, paths: &[&Path]) -> std::io::Result<()> {
        let Some(u) = &self.user else { return Ok(()) };
        for p in paths {
            chown_tree(p, u.uid, u.gid)?;
        }
        Ok(())
    }
}

/// Children first, the directory last: while the walk is below a directory,
/// that directory is still the daemon's, so no process of the sandbox user
/// can swap an entry for a symlink under it; nothing is followed (`lchown`,
/// and only real directories are entered).
fn chown_tree(p: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    if std::fs::symlink_metadata(p)?.is_dir() {
        for e in std::fs::read_dir(p)? {
            chown_tree(&e?.path(), uid, gid)?;
        }
    }
    std::os::unix::fs::lchown(p, Some(uid), Some(gid))
}

/// The system directories a dynamically linked tool needs to start.
const SYSTEM_READ: &[&str] = &["/lib", "/lib64", "/usr/lib", "/usr/lib64", "/etc/ld.so.cache"];

/// What a toolkit's tools read: its root and the real directories its
/// executables, libraries and NVVM live in (symlinks resolved, as Landlock
/// sees them).
pub fn toolkit_reads(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for p in [root.to_owned(), root.join("bin"), root.join("lib"), root.join("lib64"), root.join("nvvm")] {
        if let Ok(c) = p.canonicalize() {
            if !out.contains(&c) {
                out.push(c);
            }
        }
    }
    out
}

fn ruleset(read: &[PathBuf], write: &[&Path]) -> Result<Option<OwnedFd>, landlock::RulesetError> {
    let abi = ABI::V6;
    let created = Ruleset::default()
        .handle_access(AccessFs::from_all(abi))?
        .handle_access(AccessNet::from_all(abi))?
        .scope(Scope::from_all(abi))?
        .create()?
        .add_rules(path_beneath_rules(SYSTEM_READ, AccessFs::from_read(abi)))?
        .add_rules(path_beneath_rules(read, AccessFs::from_read(abi)))?
        .add_rules(path_beneath_rules(write, AccessFs::from_all(abi)))?;
    Ok(created.into())
}

/// The seccomp filter (built once): what a linker never needs, refused with EPERM.
fn filter() -> Result<Arc<seccompiler::BpfProgram>, String> {
    static FILTER: OnceLock<Result<Arc<seccompiler::BpfProgram>, String>> = OnceLock::new();
    FILTER
        .get_or_init(|| {
            use seccompiler::{SeccompAction, SeccompFilter};
            let refused = [
                libc::SYS_socket,
                libc::SYS_io_uring_setup,
                libc::SYS_io_uring_enter,
                libc::SYS_io_uring_register,
                libc::SYS_ptrace,
                libc::SYS_process_vm_readv,
                libc::SYS_process_vm_writev,
                libc::SYS_bpf,
                libc::SYS_perf_event_open,
                libc::SYS_userfaultfd,
                libc::SYS_keyctl,
                libc::SYS_add_key,
                libc::SYS_request_key,
                libc::SYS_mount,
                libc::SYS_umount2,
                libc::SYS_pivot_root,
                libc::SYS_chroot,
                libc::SYS_setns,
                libc::SYS_unshare,
                libc::SYS_init_module,
                libc::SYS_finit_module,
                libc::SYS_delete_module,
                libc::SYS_kexec_load,
                libc::SYS_reboot,
                libc::SYS_swapon,
                libc::SYS_swapoff,
                libc::SYS_sethostname,
                libc::SYS_setdomainname,
                libc::SYS_settimeofday,
                libc::SYS_clock_settime,
                libc::SYS_clock_adjtime,
                libc::SYS_adjtimex,
                libc::SYS_syslog,
                libc::SYS_mknod,
                libc::SYS_mknodat,
                libc::SYS_open_by_handle_at,
                libc::SYS_name_to_handle_at,
                libc::SYS_acct,
                libc::SYS_quotactl,
                #[cfg(target_arch = "x86_64")]
                libc::SYS_iopl,
                #[cfg(target_arch = "x86_64")]
                libc::SYS_ioperm,
            ];
            let rules = refused.iter().map(|&s| (s, Vec::new())).collect();
            let arch = std::env::consts::ARCH.try_into().map_err(|e| format!("seccomp: {e:?}"))?;
            let f = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(libc::EPERM as u32), arch)
                .map_err(|e| format!("seccomp: {e}"))?;
            let prog: seccompiler::BpfProgram = f.try_into().map_err(|e| format!("seccomp: {e:?}"))?;
            Ok(Arc::new(refusing_x32(prog)))
        })
        .clone()
}

/// x86-64's x32 ABI reaches the same system calls under other numbers (the
/// number with bit 30 set) and the same audit architecture, so a denylist of
/// x86-64 numbers would not stop them: ahead of the filter, every x32 call is
/// refused. (BPF jumps are relative, so the filter after it is unchanged.)
fn refusing_x32(prog: seccompiler::BpfProgram) -> seccompiler::BpfProgram {
    if !cfg!(target_arch = "x86_64") {
        return prog;
    }
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    let ins = |code: u32, jt: u8, jf: u8, k: u32| seccompiler::sock_filter { code: code as u16, jt, jf, k };
    let mut out = vec![
        // A = seccomp_data.nr (offset 0)
        ins(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 0),
        // nr & X32_SYSCALL_BIT: refuse; else go on to the filter
        ins(libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K, 0, 1, X32_SYSCALL_BIT),
        ins(libc::BPF_RET | libc::BPF_K, 0, 0, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
    ];
    out.extend(prog);
    out
}

/// `nvlinkd confine [--require] [--idle] [--read P]... [--write P]... [--uid U --gid G] -- PROGRAM ARGS...`:
/// confine this process and become `PROGRAM` (its environment, working
/// directory and standard streams as given). Returns only on failure.
pub fn confine_and_exec(args: &[String]) -> String {
    let (mut read, mut write) = (Vec::new(), Vec::new());
    let (mut uid, mut gid, mut idle, mut require) = (None, None, false, false);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--read" => read.extend(it.next().map(PathBuf::from)),
            "--write" => write.extend(it.next().map(PathBuf::from)),
            "--uid" => match it.next().map(|v| v.parse::<u32>()) {
                Some(Ok(v)) => uid = Some(v),
                _ => return "confine: --uid takes a number".into(),
            },
            "--gid" => match it.next().map(|v| v.parse::<u32>()) {
                Some(Ok(v)) => gid = Some(v),
                _ => return "confine: --gid takes a number".into(),
            },
            "--idle" => idle = true,
            "--require" => require = true,
            "--" => break,
            other => return format!("confine: unknown argument {other}"),
        }
    }
    if uid.is_some() != gid.is_some() {
        // Never left as the caller's user: both, or neither.
        return "confine: --uid and --gid go together".into();
    }
    let rest: Vec<&String> = it.collect();
    let Some((program, program_args)) = rest.split_first() else { return "confine: no program".into() };
    if idle {
        crate::sched::idle_priority();
    }
    // SAFETY: a plain syscall on this process, before it runs anything else:
    // close every inherited descriptor but the standard streams.
    unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
    let writable: Vec<&Path> = write.iter().map(PathBuf::as_path).collect();
    let ruleset = match ruleset(&read, &writable) {
        Ok(r) => r,
        Err(e) => return format!("confine: {e}"),
    };
    if ruleset.is_none() && require {
        return "confine: Landlock is not available".into();
    }
    let filter = match filter() {
        Ok(f) => f,
        Err(e) => return e,
    };
    // SAFETY: syscalls on this process with a ruleset and filter it owns.
    if let Err(e) = unsafe { restrict(uid.zip(gid), ruleset.as_ref(), &filter) } {
        return format!("confine: cannot confine the tool: {e}");
    }
    drop(ruleset);
    let e = Command::new(program.as_str()).args(program_args.iter().map(|a| a.as_str())).exec();
    format!("confine: cannot run {program}: {e}")
}

/// Become `user` (uid, gid) or, as root without one, drop every capability;
/// then no new privileges, the Landlock ruleset (where the kernel has one) and
/// the seccomp filter, in that order. Used by the `confine` helper and between
/// fork and exec alike.
///
/// # Safety
/// Only syscalls on the calling process, on memory prepared by the caller: no
/// allocation, no lock (async-signal-safe).
unsafe fn restrict(
    user: Option<(u32, u32)>,
    ruleset: Option<&OwnedFd>,
    filter: &seccompiler::BpfProgram,
) -> std::io::Result<()> {
    // No file larger than this: a damaged cubin made nvlink write without
    // end (9 GB in two minutes into the daemon's scratch). Past it the
    // kernel stops the process (SIGXFSZ); its link is declined.
    let fsize = libc::rlimit { rlim_cur: MAX_FILE_BYTES, rlim_max: MAX_FILE_BYTES };
    if libc::setrlimit(libc::RLIMIT_FSIZE, &fsize) != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if let Some((uid, gid)) = user {
        if libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(gid) != 0 || libc::setuid(uid) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    } else if libc::geteuid() == 0 {
        drop_capabilities();
    }
    if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if let Some(fd) = ruleset {
        if libc::syscall(libc::SYS_landlock_restrict_self, fd.as_raw_fd(), 0u32) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    seccompiler::apply_filter(filter).map_err(|_| std::io::Error::from_raw_os_error(libc::EPERM))
}

/// A root process without a sandbox user keeps no capability: none
/// effective, permitted, inheritable or ambient, and none in its bounding set.
///
/// # Safety
/// Plain syscalls on the calling process.
unsafe fn drop_capabilities() {
    for cap in 0..64 {
        libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
    }
    libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    // _LINUX_CAPABILITY_VERSION_3: two 32-bit words per set.
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let header = Header { version: 0x2008_0522, pid: 0 };
    let data = [Data { effective: 0, permitted: 0, inheritable: 0 }; 2];
    libc::syscall(libc::SYS_capset, &header, data.as_ptr());
}

/// The largest file a confined process may write (`RLIMIT_FSIZE`): 1 GiB,
/// past any cubin a build makes.
pub const MAX_FILE_BYTES: u64 = 1 << 30;

/// One process's confinement, prepared before the fork.
pub struct Jail {
    ruleset: Option<OwnedFd>,
    filter: Arc<seccompiler::BpfProgram>,
    user: Option<SandboxUser>,
}

impl Jail {
    /// Confine the process `cmd` starts (its children inherit it). The
    /// ruleset's descriptor lives in the closure, closed in the parent once
    /// `cmd` is dropped (and close-on-exec in the child).
    pub fn apply(self, cmd: &mut Command) {
        let Jail { ruleset, filter, user } = self;
        // SAFETY: between fork and exec the closure only makes syscalls
        // (setgroups, setgid, setuid, prctl, landlock_restrict_self, seccomp)
        // on memory prepared before the fork; it allocates nothing and takes
        // no lock.
        let user = user.map(|u| (u.uid, u.gid));
        unsafe {
            cmd.pre_exec(move || restrict(user, ruleset.as_ref(), &filter));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shell confined to its own directory cannot read, write or list
    /// anything else; inside, it can.
    #[test]
    fn a_confined_process_sees_only_what_its_jail_allows() {
        if support().landlock.is_none() {
            eprintln!("no Landlock here: skipped");
            return;
        }
        let dir = std::env::temp_dir().join(format!("nvlinkd-confine-{}", std::process::id()));
        let inside = dir.join("inside");
        std::fs::create_dir_all(&inside).unwrap();
        let secret = dir.join("secret");
        std::fs::write(&secret, "s3cret").unwrap();
        let policy = Policy::default();
        let sh = [PathBuf::from("/usr/bin"), PathBuf::from("/bin")];
        let script = format!(
            "cat {s} && echo READ; echo x > {o} && echo WROTE_OUTSIDE; echo y > {i}/f && cat {i}/f; ulimit -f",
            s = secret.display(),
            o = dir.join("outside").display(),
            i = inside.display()
        );
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c").arg(&script);
        policy.jail(&sh, &[&inside]).unwrap().unwrap().apply(&mut cmd);
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!stdout.contains("READ") && !stdout.contains("s3cret"), "{stdout}");
        assert!(!stdout.contains("WROTE_OUTSIDE") && !dir.join("outside").exists(), "{stdout}");
        // `ulimit -f` counts 512-byte blocks.
        assert_eq!(stdout.trim(), format!("y\n{}", MAX_FILE_BYTES / 512), "no file size limit");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The helper never runs a tool as the caller's user by mistake: a user
    /// without a group, a group without a user or a value that is not a number
    /// is refused before anything is confined or run.
    #[test]
    fn the_helper_takes_a_user_and_group_together_or_neither() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for bad in [
            &["--uid", "65534", "--", "/bin/true"][..],
            &["--gid", "65534", "--", "/bin/true"],
            &["--uid", "nobody", "--gid", "1", "--", "/bin/true"],
        ] {
            let why = confine_and_exec(&args(bad));
            assert!(why.contains("--uid") || why.contains("--gid"), "{bad:?}: {why}");
        }
    }

    #[test]
    fn modes_parse_and_root_is_no_sandbox_user() {
        assert_eq!("require".parse::<Mode>(), Ok(Mode::Require));
        assert!("sometimes".parse::<Mode>().is_err());
        assert!(SandboxUser::lookup("root").unwrap_err().contains("unprivileged"));
        assert!(SandboxUser::lookup("0").is_err());
    }
}
