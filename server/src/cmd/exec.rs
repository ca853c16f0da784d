//! `nvlinkd exec -- <nvlink args>`: the linker in this process, no daemon.
//! Behaves like nvlink (outputs, messages, exit status); `--explain` names the
//! engine that ran. The toolkit is found as `serve` finds it (`toolkit.rs`):
//! the record of the overlay (or in-place install) this nvlinkd belongs to,
//! `CUDA_HOME`, the nvlink on `PATH`, `/usr/local/cuda`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use nvlinkd_core::fs::LocalFs;
use nvlinkd_core::request::Request;
use nvlinkd_core::{Linker, LinkerConfig};
use nvlinkd_proto::shared::RELEVANT_ENV;

pub fn run(args: Vec<String>, explain: bool) -> ExitCode {
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let env = RELEVANT_ENV.iter().filter_map(|k| std::env::var(k).ok().map(|v| (k.to_string(), v))).collect();
    let cuda_home = crate::toolkit::find().ok().map(|f| f.root);
    let scratch = std::env::temp_dir().join(format!("nvlinkd-exec-{}", std::process::id()));
    let linker = Linker::new(LinkerConfig {
        toolkits: cuda_home.into_iter().collect(),
        cache_dir: scratch.clone(),
        worker_exe: std::env::current_exe().ok(),
        ..Default::default()
    });
    let req = Request { env, ..Request::local(args, cwd) };
    let out = linker.link(&req, &LocalFs);
    let _ = std::fs::remove_dir_all(&scratch);
    if let Some(reason) = out.fallback {
        eprintln!("nvlinkd exec: cannot serve this link: {reason}");
        return ExitCode::from(1);
    }
    for f in &out.outputs {
        let mut open = std::fs::OpenOptions::new();
        open.create(true);
        if f.append {
            open.append(true);
        } else {
            open.write(true).truncate(true);
        }
        // nvlink's words where it cannot write (the file as the command line
        // named it, no OS error), after its stdout.
        let fatal = match open.open(&f.path) {
            Err(_) => nvlinkd_fs::cannot_open(f.append, &nvlinkd_fs::as_named(&f.path, &req.args, &req.cwd)),
            Ok(mut h) => match h.write_all(&f.data).and_then(|()| h.flush()) {
                Ok(()) => continue,
                Err(_) if out.fwrite_output.as_ref() == Some(&f.path) => nvlinkd_core::request::NO_ROOM_FWRITE.into(),
                Err(_) => nvlinkd_core::request::NO_ROOM.into(),
            },
        };
        let _ = std::io::stdout().write_all(&out.stdout);
        let _ = std::io::stderr().write_all(&out.stderr);
        eprintln!("nvlink fatal   : {fatal}");
        return ExitCode::from(1);
    }
    let _ = std::io::stdout().write_all(&out.stdout);
    let _ = std::io::stderr().write_all(&out.stderr);
    if explain {
        eprintln!("nvlinkd exec: engine {:?}", out.engine);
        if let Some(why) = &out.routed {
            eprintln!("nvlinkd exec: not in process: {why}");
        }
    }
    ExitCode::from(out.exit_code as u8)
}
