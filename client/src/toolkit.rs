//! Which toolkit this shim stands in for, and where the real nvlink is.
//!
//! In order: `NVLINKD_REAL_NVLINK`; the record `nvlinkd install` writes into an
//! overlay (`<prefix>/nvlinkd-overlay.env`, next to the shim's `bin/`), or
//! beside the shim by `nvlinkd install --in-place` (`bin/.nvlinkd/`, with the
//! toolkit's real nvlink); `CUDA_HOME`.

use std::path::{Path, PathBuf};

use nvlinkd_proto::paths;

#[derive(Debug, Default)]
pub struct Toolkit {
    /// The toolkit root (a CUDA_HOME), if known.
    pub cuda_home: Option<PathBuf>,
    /// The real nvlink, if known.
    pub real_nvlink: Option<PathBuf>,
    /// The nvlinkd binary recorded by the overlay.
    pub daemon_bin: Option<PathBuf>,
}

impl Toolkit {
    pub fn discover() -> Self {
        let mut tk = Toolkit::default();
        if let Some(record) = paths::OverlayRecord::of_current_exe() {
            tk.cuda_home = record.cuda_home;
            tk.real_nvlink = record.real_nvlink;
            tk.daemon_bin = record.nvlinkd;
        }
        if tk.cuda_home.is_none() {
            tk.cuda_home = std::env::var_os("CUDA_HOME").filter(|v| !v.is_empty()).map(PathBuf::from);
        }
        if let Some(p) = std::env::var_os(paths::ENV_REAL_NVLINK).filter(|v| !v.is_empty()) {
            let p = PathBuf::from(p);
            if tk.cuda_home.is_none() {
                tk.cuda_home = p.parent().and_then(Path::parent).map(Path::to_path_buf);
            }
            tk.real_nvlink = Some(p);
        }
        if tk.real_nvlink.is_none() {
            tk.real_nvlink = tk.cuda_home.as_ref().map(|h| h.join("bin/nvlink"));
        }
        tk
    }
}
