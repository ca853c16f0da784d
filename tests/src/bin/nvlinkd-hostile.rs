//! A hostile nvlinkd for the shim's tests (tests/tests/security.rs): it speaks
//! the protocol over plain TCP on 127.0.0.1 and, for every link, does the one
//! thing its mode names that a daemon must never get a shim to do:
//!
//! - `read-secret`: asks for `/etc/shadow`, then answers success with junk output;
//! - `write-parent`: writes `<dir of -o>/../<name>` (a `../` escape);
//! - `write-absolute`: writes the absolute path given as the second argument;
//! - `exit-256`: writes junk to `-o` and exits 256 (0 once truncated to a byte);
//! - `exit-0-no-output`: exits 0 without writing `-o`;
//! - `stage`: says it wrote `-o` itself beside it (a staged output, which only
//!   a local daemon may send) and exits 0;
//! - `silent`: never says anything.
//! - `big-output`: answers success with an `-o` file of PATH MiB (pieces of
//!   1 MiB, made as they are sent) — not hostile, large.
//!
//! Usage: `nvlinkd-hostile MODE [PATH]`; prints its port on stdout, then serves
//! until killed.

use std::io::Write;
use std::pin::Pin;

use nvlinkd_proto::v1::nvlinkd_server::{Nvlinkd, NvlinkdServer};
use nvlinkd_proto::v1::{
    client_message, file_request, server_message, CancelReply, CancelRequest, ClientMessage, Event, EventsRequest,
    FileRequest, LinkResult, OutputFile, PingReply, PingRequest, RecipesReply, RecipesRequest, ServerMessage,
    ShutdownReply, ShutdownRequest, Start, StatsReply, StatsRequest, WatchEvent,
};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

struct Hostile {
    mode: String,
    path: String,
}

type Out = Pin<Box<dyn Stream<Item = Result<ServerMessage, Status>> + Send>>;

fn output(path: String, data: &[u8]) -> ServerMessage {
    ServerMessage {
        msg: Some(server_message::Msg::Output(OutputFile {
            path,
            data: bytes::Bytes::copy_from_slice(data),
            append: false,
            more: false,
            ..Default::default()
        })),
    }
}

fn result(exit_code: i32) -> ServerMessage {
    ServerMessage { msg: Some(server_message::Msg::Result(LinkResult { exit_code, ..Default::default() })) }
}

#[tonic::async_trait]
impl Nvlinkd for Hostile {
    type LinkStream = Out;

    async fn link(&self, request: Request<Streaming<ClientMessage>>) -> Result<Response<Out>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let (mode, path) = (self.mode.clone(), self.path.clone());
        tokio::spawn(async move {
            let Ok(Some(ClientMessage { msg: Some(client_message::Msg::Start(start)) })) = inbound.message().await
            else {
                return;
            };
            let cwd = std::path::PathBuf::from(&start.cwd);
            let o = start.args.iter().position(|a| a == "-o").and_then(|i| start.args.get(i + 1)).cloned();
            let o = cwd.join(o.unwrap_or_default());
            if mode == "big-output" {
                let mib: usize = path.parse().unwrap_or(1);
                for i in 0..mib {
                    let piece = OutputFile {
                        path: o.display().to_string(),
                        data: bytes::Bytes::from(vec![(i % 251) as u8; 1 << 20]),
                        more: i + 1 < mib,
                        ..Default::default()
                    };
                    if tx.send(Ok(ServerMessage { msg: Some(server_message::Msg::Output(piece)) })).await.is_err() {
                        return;
                    }
                }
                let _ = tx.send(Ok(result(0))).await;
                while let Ok(Some(_)) = inbound.message().await {}
                return;
            }
            let msgs = match mode.as_str() {
                "read-secret" => vec![
                    ServerMessage {
                        msg: Some(server_message::Msg::File(FileRequest {
                            id: 1,
                            path: "/etc/shadow".into(),
                            op: file_request::Op::Read as i32,
                        })),
                    },
                    output(o.display().to_string(), b"junk"),
                    result(0),
                ],
                "write-parent" => {
                    let name = o.file_name().unwrap_or_default().to_string_lossy().into_owned();
                    let escape = o.parent().unwrap_or(&cwd).join("..").join(name);
                    vec![
                        output(o.display().to_string(), b"junk"),
                        output(escape.display().to_string(), b"junk"),
                        result(0),
                    ]
                }
                "write-absolute" => vec![output(o.display().to_string(), b"junk"), output(path, b"junk"), result(0)],
                "exit-256" => vec![output(o.display().to_string(), b"junk"), result(256)],
                "exit-0-no-output" => vec![result(0)],
                "stage" => {
                    let name = o.file_name().unwrap_or_default().to_string_lossy().into_owned();
                    let staged = o.with_file_name(format!(".{name}.nvlinkd-1-0.tmp"));
                    let msg = OutputFile {
                        path: o.display().to_string(),
                        staged: staged.display().to_string(),
                        staged_size: 4,
                        ..Default::default()
                    };
                    vec![ServerMessage { msg: Some(server_message::Msg::Output(msg)) }, result(0)]
                }
                _ => Vec::new(),
            };
            for m in msgs {
                if tx.send(Ok(m)).await.is_err() {
                    return;
                }
            }
            // Keep the stream open (silent) until the shim goes away.
            while let Ok(Some(_)) = inbound.message().await {}
            drop(tx);
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    type EventsStream = Pin<Box<dyn Stream<Item = Result<Event, Status>> + Send>>;

    async fn events(&self, _: Request<EventsRequest>) -> Result<Response<Self::EventsStream>, Status> {
        Err(Status::unimplemented("a hostile daemon has no events"))
    }

    type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchEvent, Status>> + Send>>;

    async fn watch(&self, _: Request<Start>) -> Result<Response<Self::WatchStream>, Status> {
        Err(Status::unimplemented("a hostile daemon does not watch"))
    }

    async fn stats(&self, _: Request<StatsRequest>) -> Result<Response<StatsReply>, Status> {
        Ok(Response::new(StatsReply { json: "{}".into() }))
    }

    async fn ping(&self, _: Request<PingRequest>) -> Result<Response<PingReply>, Status> {
        Ok(Response::new(PingReply::default()))
    }

    async fn shutdown(&self, _: Request<ShutdownRequest>) -> Result<Response<ShutdownReply>, Status> {
        Ok(Response::new(ShutdownReply {}))
    }

    async fn cancel(&self, _: Request<CancelRequest>) -> Result<Response<CancelReply>, Status> {
        Err(Status::unimplemented("a hostile daemon cancels nothing"))
    }

    async fn recipes(&self, _: Request<RecipesRequest>) -> Result<Response<RecipesReply>, Status> {
        Err(Status::unimplemented("a hostile daemon keeps nothing fresh"))
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().expect("usage: nvlinkd-hostile MODE [PATH]");
    let path = args.next().unwrap_or_default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("address").port();
    println!("{port}");
    std::io::stdout().flush().expect("stdout");
    tonic::transport::Server::builder()
        .add_service(NvlinkdServer::new(Hostile { mode, path }))
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
        .await
        .expect("serve");
}
