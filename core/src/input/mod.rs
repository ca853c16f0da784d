//! Inputs: what each file is ([`classify`]), what nvlink takes from host
//! objects ([`host`]), fatbin members, cubins ([`cubin`]) and archives
//! ([`archive`]); library search ([`libsearch`]); and loading everything a
//! link names into [`Unit`]s of device code ([`load`]).

pub mod archive;
mod canonical;
pub mod classify;
pub mod cubin;
pub mod files;
pub mod host;
pub mod libsearch;
pub mod lines;
pub mod load;
pub mod memo;
pub mod ptx;

use std::sync::Arc;

pub use load::{Code, Module, Unit};

/// Bytes shared between the loader, the plan and the cache.
pub type Bytes = Arc<[u8]>;
