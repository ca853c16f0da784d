//! `nvlinkd install`: a toolkit overlay whose `bin/nvlink` is the shim.
//!
//! nvcc runs the nvlink found next to itself *as invoked* (it does not resolve
//! symlinks), so a prefix whose `bin/` holds symlinks to the toolkit's tools and
//! a copy of the shim as `nvlink` makes `PREFIX/bin/nvcc` link through nvlinkd.
//! Every other top-level entry of the toolkit (`lib`, `include`, `nvvm`, ...) is
//! linked too, so that paths nvcc derives from its own location still resolve.
//! `nvlinkd-overlay.env` records the real toolkit for the shim's fallback.

use std::path::{Path, PathBuf};

use nvlinkd_proto::paths::OVERLAY_RECORD;

fn io(what: &str, p: &Path, e: std::io::Error) -> String {
    format!("{what} {}: {e}", p.display())
}

fn replace_symlink(target: &Path, link: &Path) -> Result<(), String> {
    if link.symlink_metadata().is_ok() {
        std::fs::remove_file(link).map_err(|e| io("cannot replace", link, e))?;
    }
    std::os::unix::fs::symlink(target, link).map_err(|e| io("cannot link", link, e))
}

/// Copy `src` to `dst` through a temporary file, keeping it executable.
fn install_binary(src: &Path, dst: &Path) -> Result<(), String> {
    let tmp = dst.with_extension("nvlinkd-tmp");
    std::fs::copy(src, &tmp).map_err(|e| io("cannot copy", src, e))?;
    std::fs::rename(&tmp, dst).map_err(|e| io("cannot install", dst, e))
}

pub fn install(cuda_home: &Path, prefix: &Path) -> Result<String, String> {
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
    std::fs::create_dir_all(&bin).map_err(|e| io("cannot create", &bin, e))?;

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
    let record = format!(
        "CUDA_HOME={}\nREAL_NVLINK={}\nNVLINKD={}\n",
        cuda_home.display(),
        real_nvlink.display(),
        daemon_dst.display()
    );
    let record_path = prefix.join(OVERLAY_RECORD);
    std::fs::write(&record_path, record).map_err(|e| io("cannot write", &record_path, e))?;
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
