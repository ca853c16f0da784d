//! The nvlinkd gRPC API: see `proto/nvlinkd.proto` for the protocol.

#![allow(clippy::all, missing_docs)]

pub mod v1 {
    tonic::include_proto!("nvlinkd.v1");
}

/// Largest message either side accepts or sends. A gRPC frame announcing more
/// is refused before anything is allocated for it (a hostile 5-byte header
/// announcing 1 GiB costs nothing).
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// Largest piece of a file (`FileReply.data`, `OutputFile.data`) in one
/// message; files larger than this travel in several (see the proto).
pub const CHUNK_BYTES: usize = 1 << 20;

pub mod paths;
pub mod shared;
