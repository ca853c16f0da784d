//! # nvlinkd-core
//!
//! Everything nvlinkd knows about `nvlink`, as a synchronous library that needs no
//! daemon: the command line and its modes, the inputs and how nvlink treats them,
//! the link plan, the engines that carry a plan out (libnvJitLink in process, or
//! the real nvlink), the finalizer that makes nvJitLink's output byte-identical to
//! nvlink's, and the content-addressed cache.
//!
//! See ARCHITECTURE.md at the repository root for how a request flows.

// These docs are for maintainers (`cargo doc --document-private-items`, as CI
// builds them): module docs point at the private items that carry the rules.
#![allow(rustdoc::private_intra_doc_links)]

pub mod cache;
pub mod cancel;
pub mod cli;
pub mod confine;
pub mod declined;
pub mod diag;
pub mod elf;
pub mod engine;
pub mod fatbin;
pub mod finalize;
pub mod fs;
pub mod fuzz;
pub mod heap;
mod hooks;
pub mod input;
pub mod jitlink;
pub mod link;
pub mod linkcache;
mod lru;
pub mod observe;
pub mod plan;
pub mod regbin;
pub mod request;
pub mod sched;
pub mod speculate;
pub mod stats;
pub mod toolkit;
pub mod verify;
pub mod worker;

pub use link::{Linker, LinkerConfig};
