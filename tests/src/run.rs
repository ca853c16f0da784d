//! Running nvlink, or the shim, and collecting everything it did.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What one nvlink invocation printed and wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Run {
    pub code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Files in the output directory afterwards, by name.
    pub files: BTreeMap<String, Vec<u8>>,
}

/// An invocation: program, arguments, working directory, extra environment.
#[derive(Clone, Debug)]
pub struct Invocation {
    pub args: Vec<String>,
    pub cwd: PathBuf,
    pub env: Vec<(String, String)>,
    /// Directory the outputs go to (emptied before the run).
    pub out_dir: PathBuf,
}

impl Invocation {
    /// An invocation from a whitespace-separated argument template: `{OUT}` is
    /// the output directory, `{L}` the toolkit's `lib`, `{NVVM}` its `nvvm`.
    pub fn templated(args: &str, cwd: &Path, out: &crate::env::TempDir) -> Invocation {
        let home = crate::env::cuda_home();
        let args = args
            .replace("{L}", &home.join("lib").display().to_string())
            .replace("{NVVM}", &home.join("nvvm").display().to_string())
            .replace("{OUT}", &out.path().display().to_string());
        Invocation {
            args: args.split_whitespace().map(String::from).collect(),
            cwd: cwd.to_path_buf(),
            env: vec![],
            out_dir: out.path().to_path_buf(),
        }
    }
}

fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.path().is_file() {
                files.insert(e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap_or_default());
            }
        }
    }
    files
}

fn clear(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("output dir");
}

/// Run `program` for `inv`. Only the environment given (plus PATH and HOME) is set.
pub fn run(program: &Path, inv: &Invocation, extra_env: &[(String, String)]) -> Run {
    clear(&inv.out_dir);
    let mut cmd = Command::new(program);
    cmd.args(&inv.args).current_dir(&inv.cwd).env_clear();
    for k in ["PATH", "HOME", "TMPDIR"] {
        if let Ok(v) = std::env::var(k) {
            cmd.env(k, v);
        }
    }
    for (k, v) in inv.env.iter().chain(extra_env) {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
    Run { code: out.status.code().unwrap_or(-1), stdout: out.stdout, stderr: out.stderr, files: snapshot(&inv.out_dir) }
}
