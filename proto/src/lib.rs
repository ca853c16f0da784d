//! The nvlinkd gRPC API: see `proto/nvlinkd.proto` for the protocol.

#![allow(clippy::all, missing_docs)]

pub mod v1 {
    tonic::include_proto!("nvlinkd.v1");
}

/// Largest message either side accepts or sends. A gRPC frame announcing more
/// is refused before anything is allocated for it (a hostile 5-byte header
/// announcing 1 GiB costs nothing).
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// Most files one `Start` announces (`Start.files`): far above any real
/// link's inputs and `-l` candidates. A daemon refuses a `Start` announcing
/// more (`RESOURCE_EXHAUSTED`: the shim runs the real nvlink).
pub const MAX_ANNOUNCED_FILES: usize = 8192;

/// Largest piece of a file (`FileReply.data`, `OutputFile.data`) in one
/// message; files larger than this travel in several (see the proto).
pub const CHUNK_BYTES: usize = 1 << 20;

/// A file's contents as the messages carry it: `CHUNK_BYTES` pieces, slices
/// of `data` (not copies), each with whether more follow; an empty file is one
/// empty piece.
pub fn pieces(data: &bytes::Bytes) -> impl Iterator<Item = (bytes::Bytes, bool)> + '_ {
    let n = data.len().div_ceil(CHUNK_BYTES).max(1);
    (0..n).map(move |i| (data.slice(i * CHUNK_BYTES..data.len().min((i + 1) * CHUNK_BYTES)), i + 1 < n))
}

pub mod codec;
pub mod paths;
pub mod policy;
pub mod shared;
