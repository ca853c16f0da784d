//! The nvlinkd gRPC API: see `proto/nvlinkd.proto` for the protocol.

#![allow(clippy::all, missing_docs)]

pub mod v1 {
    tonic::include_proto!("nvlinkd.v1");
}

/// Largest message either side accepts: whole input files travel in one message.
pub const MAX_MESSAGE_BYTES: usize = 1 << 30;

pub mod paths;
pub mod shared;
