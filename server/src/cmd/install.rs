//! `nvlinkd install`: a toolkit overlay whose `bin/nvlink` is the shim.
//!
//! nvcc runs the nvlink found next to itself *as invoked* (it does not resolve
//! symlinks), so a prefix whose `bin/` holds symlinks to the toolkit's tools and
//! a copy of the shim as `nvlink` makes `PREFIX/bin/nvcc` link through nvlinkd.
//! Every other top-level entry of the toolkit (`lib`, `include`, `nvvm`, ...) is
//! linked too, so that paths nvcc derives from its own location still resolve.
//! `nvlinkd-overlay.env` records the real toolkit for the shim's fallback, and
//! the toolkit's root as named, which the shim writes where nvcc passed the
//! overlay's own paths (`client/src/remap.rs`).

use std::io::Write;
use std::path::{Path, PathBuf};

use nvlinkd_fs::owner;
use nvlinkd_proto::paths::{OverlayRecord, IN_PLACE_DIR, OVERLAY_RECORD};

fn io(what: &str, p: &Path, e: std::io::Error) -> String {
    format!("{what} {}: {e}", p.display())
}

fn replace_symlink(target: &Path, link: &Path) -> Result<(), String> {
    if link.symlink_metadata().is_ok() {
        std::fs::remove_file(link).map_err(|e| io("cannot replace", link, e))?;
    }
    std::os::unix::fs::symlink(target, link).map_err(|e| io("cannot link", link, e))
}

/// Copy `src` to `dst` through a temporary file, executable.
fn install_binary(src: &Path, dst: &Path) -> Result<(), String> {
    let mut from = std::fs::File::open(src).map_err(|e| io("cannot copy", src, e))?;
    replace_file(dst, 0o755, &mut |to| std::io::copy(&mut from, to).map(drop))
}

/// Write `dst` whole or not at all: a fresh temporary file beside it (created
/// by this process, `O_EXCL|O_NOFOLLOW`: a symlink or file someone left at
/// that name is removed, never written through), filled, given `mode`, then
/// renamed over `dst`.
fn replace_file(
    dst: &Path,
    mode: u32,
    fill: &mut dyn FnMut(&mut std::fs::File) -> std::io::Result<()>,
) -> Result<(), String> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let tmp = dst.with_extension("nvlinkd-tmp");
    let open = || {
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).custom_flags(libc::O_NOFOLLOW).open(&tmp)
    };
    let mut file = match open() {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(&tmp).map_err(|e| io("cannot replace", &tmp, e))?;
            open()
        }
        r => r,
    }
    .map_err(|e| io("cannot create", &tmp, e))?;
    let written = fill(&mut file)
        .and_then(|()| file.set_permissions(std::fs::Permissions::from_mode(mode)))
        .and_then(|()| file.sync_all());
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, dst)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(io("cannot install", dst, e));
    }
    Ok(())
}

/// Refuse a directory of the overlay that another user could change: it holds
/// the `nvcc` and `nvlink` the build runs, so whoever can write it (or its
/// parent, or owns a symlink to it) could put their own there, and a file
/// planted in it could redirect what the install writes. It must be this
/// user's, not writable by group or others ([`owner::Rule::OWN_DIR`]), in a
/// directory of this user or root ([`check_above`]).
fn check_own_dir(dir: &Path, what: &str) -> Result<(), String> {
    let shown = dir.display();
    let own = "give --prefix a directory of your own";
    let link = dir.symlink_metadata().map_err(|e| io("cannot read", dir, e))?;
    if link.file_type().is_symlink() {
        if let Err(owner::Refusal::Owner { uid, .. }) = owner::Rule::owned_by(owner::Owners::MeOrRoot).check(&link) {
            return Err(format!("{what} {shown} is a symlink of uid {uid}: refusing; {own}"));
        }
    }
    let m = std::fs::metadata(dir).map_err(|e| io("cannot read", dir, e))?;
    match owner::Rule::OWN_DIR.check(&m) {
        Err(why @ owner::Refusal::Owner { .. }) => {
            return Err(format!("{what} {shown} {why}: that user could replace the overlay's tools; {own}"))
        }
        Err(why @ owner::Refusal::Mode { .. }) => {
            return Err(format!("{what} {shown} {why}, who could replace the overlay's tools: chmod go-w {shown}"))
        }
        Ok(()) => {}
    }
    let real = std::fs::canonicalize(dir).map_err(|e| io("cannot read", dir, e))?;
    match real.parent() {
        Some(parent) => check_above(parent, what, dir),
        None => Ok(()),
    }
}

/// Every directory from `from` up ([`owner::dirs_above`]): whoever can write
/// one of them (without the sticky bit, which keeps others from renaming what
/// is ours, as in /tmp) or owns it could move `dir` (the overlay's) away and
/// put another in its place.
fn check_above(from: &Path, what: &str, dir: &Path) -> Result<(), String> {
    match owner::dirs_above(from) {
        Ok(None) => Ok(()),
        Ok(Some(above)) => {
            Err(format!("{what} {} is under {above}: refusing; give --prefix a directory of your own", dir.display()))
        }
        Err(e) => Err(io("cannot read the directories above", from, e)),
    }
}

/// `create_dir_all(dir)`; what it creates gets no write access for group or
/// others whatever the umask (a `umask 002` would give 0775).
fn create_private_dirs(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let missing: Vec<PathBuf> =
        dir.ancestors().take_while(|a| !a.as_os_str().is_empty() && !a.exists()).map(Path::to_owned).collect();
    std::fs::create_dir_all(dir).map_err(|e| io("cannot create", dir, e))?;
    for d in missing {
        let mode = std::fs::metadata(&d).map_err(|e| io("cannot read", &d, e))?.permissions().mode();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode & 0o755))
            .map_err(|e| io("cannot set the mode of", &d, e))?;
    }
    Ok(())
}

pub fn install(cuda_home: &Path, prefix: &Path) -> Result<String, String> {
    // Absolute: the record names the overlay's files, which the shim runs
    // from whatever directory a build is in.
    let prefix = &std::path::absolute(prefix).map_err(|e| io("no directory", prefix, e))?;
    // As given (absolute, symlinks kept): the path a plain build runs nvcc from.
    let named = std::path::absolute(cuda_home).map_err(|e| io("no toolkit at", cuda_home, e))?;
    let cuda_home = cuda_home.canonicalize().map_err(|e| io("no toolkit at", cuda_home, e))?;
    let real_nvlink = cuda_home.join("bin/nvlink");
    if !real_nvlink.is_file() {
        return Err(format!("{} has no bin/nvlink", cuda_home.display()));
    }
    if prefix.canonicalize().ok().as_deref() == Some(cuda_home.as_path()) {
        return Err("the overlay prefix must not be the toolkit itself".into());
    }
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let shim = sibling(&me, "nvlink").ok_or("the nvlink shim is not installed next to nvlinkd")?;
    let bin = prefix.join("bin");
    // Before anything is made in it (or above it), and again after.
    if prefix.exists() {
        check_own_dir(prefix, "the overlay prefix")?;
    } else if let Some(existing) = prefix.ancestors().find(|a| a.exists()) {
        let real = std::fs::canonicalize(existing).map_err(|e| io("cannot read", existing, e))?;
        check_above(&real, "the overlay prefix", prefix)?;
    }
    create_private_dirs(&bin)?;
    check_own_dir(prefix, "the overlay prefix")?;
    check_own_dir(&bin, "the overlay's bin directory")?;

    let top = std::fs::read_dir(&cuda_home).map_err(|e| io("cannot read", &cuda_home, e))?;
    for entry in top.flatten() {
        let name = entry.file_name();
        if name == "bin" {
            continue;
        }
        replace_symlink(&entry.path(), &prefix.join(&name))?;
    }
    let tools = std::fs::read_dir(cuda_home.join("bin")).map_err(|e| io("cannot read", &cuda_home, e))?;
    for entry in tools.flatten() {
        let name = entry.file_name();
        if name == "nvlink" {
            continue;
        }
        replace_symlink(&entry.path(), &bin.join(&name))?;
    }
    let shim_dst = bin.join("nvlink");
    if shim_dst.symlink_metadata().is_ok() {
        std::fs::remove_file(&shim_dst).map_err(|e| io("cannot replace", &shim_dst, e))?;
    }
    install_binary(&shim, &shim_dst)?;
    let daemon_dst = bin.join("nvlinkd");
    if daemon_dst.symlink_metadata().is_ok() {
        std::fs::remove_file(&daemon_dst).map_err(|e| io("cannot replace", &daemon_dst, e))?;
    }
    install_binary(&me, &daemon_dst)?;
    install_nvvm_worker(&me, &daemon_dst)?;
    let record = OverlayRecord {
        cuda_home: Some(cuda_home.clone()),
        real_nvlink: Some(real_nvlink.clone()),
        nvlinkd: Some(daemon_dst.clone()),
        cuda_home_named: Some(named),
        dpkg_diversion: None,
    }
    .to_text();
    replace_file(&prefix.join(OVERLAY_RECORD), 0o644, &mut |f| f.write_all(record.as_bytes()))?;
    Ok(format!(
        "overlay ready: {}/bin/nvcc links through nvlinkd (real nvlink: {})",
        prefix.display(),
        real_nvlink.display()
    ))
}

fn sibling(exe: &Path, name: &str) -> Option<PathBuf> {
    let p = exe.parent()?.join(name);
    p.is_file().then_some(p)
}

/// The NVVM worker (`nvlinkd-nvvm`) beside `me`, installed beside the
/// installed daemon `daemon` (without it, NVVM runs in `nvlinkd worker`).
fn install_nvvm_worker(me: &Path, daemon: &Path) -> Result<(), String> {
    let Some(src) = sibling(me, nvlinkd_core::worker::NVVM_WORKER) else { return Ok(()) };
    let dst = daemon.with_file_name(nvlinkd_core::worker::NVVM_WORKER);
    if dst.symlink_metadata().is_ok() {
        std::fs::remove_file(&dst).map_err(|e| io("cannot replace", &dst, e))?;
    }
    install_binary(&src, &dst)
}

/// `nvlinkd install --in-place`: the toolkit's own `bin/nvlink` becomes the
/// shim and the real nvlink is kept at `bin/.nvlinkd/nvlink`, with the daemon
/// and the record the shim reads (`bin/.nvlinkd/nvlinkd-overlay.env`).
///
/// Why: nvcc passes paths derived from its own location to nvlink
/// (`-L<bin>/../lib`, `-nvvmpath=<bin>/../nvvm`) and nvlink records its options
/// in every cubin's `.note.nv.tkinfo`; in place, nvcc and nvlink see the
/// toolkit's own paths and every build with the toolkit goes through nvlinkd.
///
/// On a toolkit whose `bin/nvlink` a Debian package owns, the real nvlink is
/// moved aside the Debian way: `dpkg-divert --add --package nvlinkd --divert
/// <bin>/.nvlinkd/nvlink <bin>/nvlink`, so that a package upgrade writes the
/// new nvlink to the kept name and the shim stays (recorded as
/// `DPKG_DIVERSION`; `uninstall` removes the diversion). Refused on a toolkit
/// this process cannot write (read-only filesystem or permissions) and on one
/// another package manager owns (an rpm-owned file, or a toolkit inside a
/// Python `site-packages`/`dist-packages`, which pip and conda manage): it
/// would overwrite the shim or leave the kept nvlink behind. Use an overlay
/// (`--prefix`) there. Installing again updates the shim and the daemon and
/// keeps the real nvlink.
pub fn install_in_place(cuda_home: &Path) -> Result<String, String> {
    let root = cuda_home.canonicalize().map_err(|e| io("no toolkit at", cuda_home, e))?;
    let bin = root.join("bin");
    let nvlink = bin.join("nvlink");
    let keep = bin.join(IN_PLACE_DIR);
    let real = keep.join("nvlink");
    if !nvlink.is_file() {
        return Err(format!("{} has no bin/nvlink", root.display()));
    }
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let shim = sibling(&me, "nvlink").ok_or("the nvlink shim is not installed next to nvlinkd")?;
    if shim.canonicalize().ok() == nvlink.canonicalize().ok() {
        return Err(format!("{} is this nvlinkd's own shim", nvlink.display()));
    }
    let dpkg_owner = refuse_managed(&root, &nvlink)?;
    check_writable(&bin)?;
    check_keep_dir(&keep)?;
    if let Some(warning) = others_can_replace(&nvlink) {
        eprintln!("nvlinkd: warning: {warning}");
    }
    let fresh = !real.is_file();
    if fresh {
        if !is_real_nvlink(&nvlink) {
            return Err(format!(
                "{} is not NVIDIA's nvlink (its --version does not say so); not replacing it",
                nvlink.display()
            ));
        }
        create_private_dirs(&keep)?;
        // A second name for the real nvlink first: bin/nvlink is never missing.
        if let Err(e) = std::fs::hard_link(&nvlink, &real) {
            tracing::debug!("hard link failed ({e}), copying");
            install_binary(&nvlink, &real)?;
        }
    }
    let diverted = match &dpkg_owner {
        Some(_) if diverted_by_nvlinkd(&nvlink) => true,
        Some(owner) => {
            // The kept name already holds the real nvlink: dpkg only records
            // that the package's bin/nvlink now lives there.
            if let Err(e) = dpkg_divert(&["--add", "--no-rename"], &real, &nvlink) {
                if fresh {
                    let _ = std::fs::remove_dir_all(&keep);
                }
                return Err(format!("{} belongs to a dpkg package ({owner}) and {e}", nvlink.display()));
            }
            true
        }
        None => false,
    };
    install_binary(&me, &keep.join("nvlinkd"))?;
    install_nvvm_worker(&me, &keep.join("nvlinkd"))?;
    let record = OverlayRecord {
        cuda_home: Some(root.clone()),
        real_nvlink: Some(real.clone()),
        nvlinkd: Some(keep.join("nvlinkd")),
        dpkg_diversion: diverted.then(|| nvlink.clone()),
        ..Default::default()
    }
    .to_text();
    replace_file(&keep.join(OVERLAY_RECORD), 0o644, &mut |f| f.write_all(record.as_bytes()))?;
    install_binary(&shim, &nvlink)?;
    Ok(format!(
        "{}: {}/bin/nvlink links through nvlinkd (real nvlink kept at {}{}; `nvlinkd uninstall --cuda-home {}` restores it)",
        if fresh { "installed in place" } else { "in-place install updated" },
        root.display(),
        real.display(),
        if diverted { ", diverted there with dpkg-divert" } else { "" },
        root.display()
    ))
}

/// Who else could replace the shim at `nvlink` (the toolkit's `bin/nvlink`),
/// in words, if anyone: a user who owns `bin/` or a directory above it, or
/// who can write one that is not sticky ([`owner::dirs_above`]), could put
/// their own nvlink there, and every build with the toolkit would run it.
/// The install goes on (the toolkit is the operator's to share), with a
/// warning naming the directory, who, and the fix.
fn others_can_replace(nvlink: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let above = owner::dirs_above(nvlink.parent()?).ok()??;
    let dir = above.dir.display();
    let named = |name: Option<String>| name.map(|n| format!(" ({n})")).unwrap_or_default();
    let (who, fix) = match above.why {
        owner::Refusal::Owner { uid, .. } => (
            format!("{dir} belongs to uid {uid}{}", named(owner::user_name(uid))),
            format!("chown {} {dir}", owner::euid()),
        ),
        owner::Refusal::Mode { mode, .. } if mode & 0o002 != 0 => {
            (format!("{dir} (mode {mode:03o}) can be written by every user"), format!("chmod go-w {dir}"))
        }
        owner::Refusal::Mode { mode, .. } => {
            let gid = std::fs::metadata(&above.dir).map(|m| m.gid()).ok()?;
            let group = named(owner::group(gid).map(|(name, _)| name));
            (
                format!("{dir} (mode {mode:03o}) can be written by the members of group {gid}{group}"),
                format!("chmod g-w {dir}"),
            )
        }
    };
    Some(format!(
        "{who}, who could replace the shim {} and so what every build with this toolkit links: {fix}",
        nvlink.display()
    ))
}

/// Refuse a `bin/.nvlinkd` that is not a directory of this user's alone: a
/// symlink planted there would send the real nvlink, the daemon and the
/// record wherever it points (and `uninstall` would leave them there).
fn check_keep_dir(keep: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = keep.symlink_metadata() else { return Ok(()) };
    let shown = keep.display();
    if m.file_type().is_symlink() || !m.is_dir() {
        return Err(format!("{shown} is not a directory (a symlink or a file): refusing; remove it first"));
    }
    if owner::Rule::OWN_DIR.check(&m).is_err() {
        return Err(format!(
            "{shown} belongs to uid {} (mode {:03o}): another user could change what the install keeps there; \
             refusing",
            m.uid(),
            m.mode() & 0o777
        ));
    }
    Ok(())
}

/// `nvlinkd uninstall --cuda-home DIR`: undo `install --in-place`: the kept real
/// nvlink goes back to `bin/nvlink` (the same file, renamed; a dpkg diversion
/// is removed after) and `bin/.nvlinkd` is removed. Nothing to do when the
/// toolkit is not installed in place.
pub fn uninstall(cuda_home: &Path) -> Result<String, String> {
    let root = cuda_home.canonicalize().map_err(|e| io("no toolkit at", cuda_home, e))?;
    let bin = root.join("bin");
    let keep = bin.join(IN_PLACE_DIR);
    let real = keep.join("nvlink");
    if !real.is_file() {
        return Ok(format!("{} is not installed in place; nothing to do", root.display()));
    }
    check_writable(&bin)?;
    check_keep_dir(&keep)?;
    let nvlink = bin.join("nvlink");
    let recorded = std::fs::read_to_string(keep.join(OVERLAY_RECORD))
        .map(|t| OverlayRecord::parse(&t).dpkg_diversion.is_some())
        .unwrap_or(false);
    let diverted = recorded || diverted_by_nvlinkd(&nvlink);
    // The real file over the shim in one rename: bin/nvlink is never missing.
    std::fs::rename(&real, &nvlink).map_err(|e| io("cannot restore", &nvlink, e))?;
    if diverted {
        dpkg_divert(&["--remove", "--no-rename"], &real, &nvlink).map_err(|e| {
            format!(
                "{} is the real nvlink again, but {e}; remove it with `dpkg-divert --remove {}`",
                nvlink.display(),
                nvlink.display()
            )
        })?;
    }
    std::fs::remove_dir_all(&keep).map_err(|e| io("cannot remove", &keep, e))?;
    Ok(format!(
        "uninstalled: {} is the real nvlink again{}",
        nvlink.display(),
        if diverted { " (dpkg diversion removed)" } else { "" }
    ))
}

/// The diversions of nvlinkd (`--package nvlinkd`): the package's `file`
/// lives at `to`.
const DIVERSION_PACKAGE: &str = "nvlinkd";

fn dpkg_divert(how: &[&str], to: &Path, file: &Path) -> Result<(), String> {
    let out = std::process::Command::new("dpkg-divert")
        .args(how)
        .args(["--package", DIVERSION_PACKAGE, "--divert"])
        .arg(to)
        .arg(file)
        .output()
        .map_err(|e| format!("cannot run dpkg-divert: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("dpkg-divert {} failed: {}", how.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// Whether dpkg has `file` diverted by nvlinkd.
fn diverted_by_nvlinkd(file: &Path) -> bool {
    std::process::Command::new("dpkg-divert")
        .arg("--listpackage")
        .arg(file)
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).trim() == DIVERSION_PACKAGE)
}

fn is_real_nvlink(p: &Path) -> bool {
    std::process::Command::new(p)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("NVIDIA (R) Cuda linker"))
        .unwrap_or(false)
}

/// Refuse a toolkit a package manager other than dpkg owns; the dpkg package
/// owning `nvlink`, if one does (the install diverts it).
fn refuse_managed(root: &Path, nvlink: &Path) -> Result<Option<String>, String> {
    let overlay = "; use an overlay instead (nvlinkd install --cuda-home DIR --prefix DIR)";
    if root.components().any(|c| matches!(c.as_os_str().to_str(), Some("site-packages" | "dist-packages"))) {
        return Err(format!(
            "{} is managed by pip or conda (a Python site-packages directory){overlay}",
            root.display()
        ));
    }
    if root.ancestors().any(|a| a.join("conda-meta").is_dir()) {
        return Err(format!("{} is managed by conda (a conda environment){overlay}", root.display()));
    }
    let owner = |tool: &str, args: &[&str]| {
        let o = std::process::Command::new(tool).args(args).arg(nvlink).output().ok()?;
        o.status.success().then(|| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    if let Some(owner) = owner("rpm", &["-qf"]) {
        return Err(format!("{} belongs to an rpm package ({owner}){overlay}", nvlink.display()));
    }
    // `dpkg -S` names the owning package (`pkg: path`), after any diversion lines.
    Ok(owner("dpkg", &["-S"])
        .map(|o| o.lines().filter(|l| !l.starts_with("diversion by ")).collect::<Vec<_>>().join(", ")))
}

/// Whether files can be created and renamed in `dir` (a read-only mount or
/// missing permissions refuse here, before anything is changed).
fn check_writable(dir: &Path) -> Result<(), String> {
    let probe = dir.join(format!(".nvlinkd-probe-{}", std::process::id()));
    match std::fs::OpenOptions::new().write(true).create_new(true).open(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            Ok(())
        }
        Err(e) => Err(format!(
            "cannot write to {} ({e}): the toolkit is read-only for this user; use an overlay instead (nvlinkd install --cuda-home DIR --prefix DIR)",
            dir.display()
        )),
    }
}
