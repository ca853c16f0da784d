//! A link over the wire: the `Nvlinkd` service (one stream per link), the
//! caller's files read through that stream, and outputs staged for local shims.

pub mod admission;
pub mod service;
pub mod staging;
pub mod stream_fs;
