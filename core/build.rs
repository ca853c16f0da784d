//! The digest of the code that computes answers: this crate's sources and
//! those of `nvlinkd-fs` (how inputs are read), the workspace's `Cargo.lock`
//! (the crates that read objects and decompress members) and the compiler's
//! version, as `NVLINKD_ENGINE_DIGEST`.
//! Every cache key carries it (`cache::KeyBuilder`), so a build whose code
//! differs in any way never reads an entry another build wrote: a fix that
//! changes an answer cannot meet the wrong entries of the builds before it,
//! in a persistent cache directory or in a fleet's shared tier.

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn main() {
    let here = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let roots = [here.join("src"), here.join("../fs/src"), here.join("build.rs"), here.join("../Cargo.lock")];
    let mut files = Vec::new();
    for root in &roots {
        println!("cargo:rerun-if-changed={}", root.display());
        if root.is_dir() {
            sources(root, &mut files);
        } else {
            files.push(root.clone());
        }
    }
    // Named relative to the crate, in one order, so that the digest depends
    // on the code only (not on where the checkout lies).
    let mut named: Vec<(String, PathBuf)> = files
        .into_iter()
        .map(|p| (p.strip_prefix(&here).unwrap_or(&p).to_string_lossy().replace("/src/../", "/"), p))
        .collect();
    named.sort();
    let mut h = blake3::Hasher::new();
    for (name, path) in &named {
        let data = std::fs::read(path).expect("a source file");
        h.update(&(name.len() as u64).to_le_bytes()).update(name.as_bytes());
        h.update(&(data.len() as u64).to_le_bytes()).update(&data);
    }
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let version = std::process::Command::new(rustc).arg("-vV").output().map(|o| o.stdout).unwrap_or_default();
    h.update(&(version.len() as u64).to_le_bytes()).update(&version);
    println!("cargo:rustc-env=NVLINKD_ENGINE_DIGEST={}", h.finalize().to_hex());
}
