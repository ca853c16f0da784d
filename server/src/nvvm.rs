//! `nvlinkd-nvvm`: the NVVM worker, `nvlinkd worker` on jemalloc.
//!
//! The pool (`core/src/worker.rs`, `NVVM_WORKER`) runs NVVM compiles (nvJitLink
//! `-lto`) in this executable when it lies beside `nvlinkd`. Its `malloc`,
//! `free`, ... are jemalloc's, unprefixed (the crate feature): the
//! libnvJitLink it loads binds to them, and NVVM (LLVM, allocation-heavy)
//! takes about 15% less CPU than on glibc's malloc, for the same PTX
//! (docs/benchmarks.md). Non-LTO links stay in `nvlinkd worker` on glibc's malloc:
//! nvJitLink's crash on a damaged cubin, like nvlink's, depends on it (test
//! `workers.rs`, `crashing_input_fails_only_its_link`).

use std::process::ExitCode;

#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// `nvlinkd-nvvm worker --lib LIB --release MAJOR.MINOR [--mem BYTES]`, as
/// `nvlinkd worker`.
fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1));
    let lib = value("--lib").zip(value("--release"));
    let lib = lib.and_then(|(lib, release)| nvlinkd_core::worker::LibSpec::with_release(lib.into(), release));
    let mem = value("--mem").map_or(Some(0), |m| m.parse().ok());
    match (args.first().map(String::as_str), lib, mem) {
        (Some("worker"), Some(lib), Some(mem)) => ExitCode::from(nvlinkd_core::worker::serve(&lib, mem) as u8),
        _ => {
            eprintln!("usage: nvlinkd-nvvm worker --lib LIB --release MAJOR.MINOR [--mem BYTES] (started by nvlinkd)");
            ExitCode::from(2)
        }
    }
}
