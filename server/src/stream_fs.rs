//! The shim's filesystem, read over the link's gRPC stream.
//!
//! A link runs on a blocking thread; each read or stat sends a `FileRequest` to
//! the shim and blocks until the matching `FileReply` arrives (the connection's
//! reader task routes replies by id). If the shim goes away, every pending and
//! future request fails with `BrokenPipe`, so the link stops promptly.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::Mutex;

use dashmap::DashMap;
use nvlinkd_core::fs::{FileStat, InputFs};
use nvlinkd_proto::v1::{file_error, file_reply, file_request, server_message, FileReply, FileRequest, ServerMessage};
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

/// Replies awaited by the link thread, by request id.
pub type Pending = Arc<DashMap<u64, oneshot::Sender<FileReply>>>;

pub struct StreamFs {
    tx: mpsc::Sender<Result<ServerMessage, Status>>,
    pending: Pending,
    /// Reads already requested by `prefetch`, awaiting their replies.
    prefetched: Mutex<HashMap<PathBuf, oneshot::Receiver<FileReply>>>,
    next_id: AtomicU64,
    /// Total bytes read so far, against the per-request budget.
    bytes_read: AtomicU64,
    max_bytes: u64,
}

impl StreamFs {
    pub fn new(tx: mpsc::Sender<Result<ServerMessage, Status>>, pending: Pending, max_bytes: u64) -> Self {
        StreamFs {
            tx,
            pending,
            prefetched: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            bytes_read: AtomicU64::new(0),
            max_bytes,
        }
    }

    /// Send a request; the receiver gets the reply.
    fn send(&self, path: &Path, op: file_request::Op) -> io::Result<oneshot::Receiver<FileReply>> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.insert(id, tx);
        let req = FileRequest { id, path: path.to_string_lossy().into_owned(), op: op as i32 };
        if self.tx.blocking_send(Ok(ServerMessage { msg: Some(server_message::Msg::File(req)) })).is_err() {
            self.pending.remove(&id);
            return Err(gone());
        }
        Ok(rx)
    }

    fn ask(&self, path: &Path, op: file_request::Op) -> io::Result<file_reply::Result> {
        let early = match op {
            file_request::Op::Read => self.prefetched.lock().ok().and_then(|mut m| m.remove(path)),
            file_request::Op::Stat => None,
        };
        let rx = match early {
            Some(rx) => rx,
            None => self.send(path, op)?,
        };
        let reply = rx.blocking_recv().map_err(|_| gone())?;
        reply.result.ok_or_else(|| io::Error::other("empty file reply"))
    }
}

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the nvlink shim went away")
}

fn to_io(e: nvlinkd_proto::v1::FileError) -> io::Error {
    let kind = match file_error::Kind::try_from(e.kind).unwrap_or(file_error::Kind::Other) {
        file_error::Kind::NotFound => io::ErrorKind::NotFound,
        file_error::Kind::PermissionDenied => io::ErrorKind::PermissionDenied,
        file_error::Kind::IsDirectory => io::ErrorKind::IsADirectory,
        file_error::Kind::TooLarge => io::ErrorKind::FileTooLarge,
        file_error::Kind::Other => io::ErrorKind::Other,
    };
    io::Error::new(kind, e.message)
}

impl InputFs for StreamFs {
    fn read(&self, path: &Path) -> io::Result<Arc<[u8]>> {
        match self.ask(path, file_request::Op::Read)? {
            file_reply::Result::Data(d) => {
                let total = self.bytes_read.fetch_add(d.len() as u64, Ordering::Relaxed) + d.len() as u64;
                if total > self.max_bytes {
                    return Err(io::Error::new(
                        io::ErrorKind::FileTooLarge,
                        "request exceeds the daemon's input budget",
                    ));
                }
                Ok(d.into())
            }
            file_reply::Result::Error(e) => Err(to_io(e)),
            file_reply::Result::Stat(_) => Err(io::Error::other("unexpected stat reply")),
        }
    }

    fn prefetch(&self, paths: &[PathBuf]) {
        for p in paths {
            let known = self.prefetched.lock().map(|m| m.contains_key(p)).unwrap_or(true);
            if !known {
                if let Ok(rx) = self.send(p, file_request::Op::Read) {
                    if let Ok(mut m) = self.prefetched.lock() {
                        m.insert(p.clone(), rx);
                    }
                }
            }
        }
    }

    fn stat(&self, path: &Path) -> io::Result<FileStat> {
        match self.ask(path, file_request::Op::Stat)? {
            file_reply::Result::Stat(s) => Ok(FileStat { is_dir: s.is_dir, size: s.size }),
            file_reply::Result::Error(e) => Err(to_io(e)),
            file_reply::Result::Data(_) => Err(io::Error::other("unexpected data reply")),
        }
    }
}
