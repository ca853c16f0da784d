//! Compile `proto/nvlinkd.proto` with protox (pure Rust), so no protoc is needed.
/// The messages of `Event.body`.
const EVENT_KINDS: [&str; 11] = [
    "LinkStarted",
    "LinkQueued",
    "LinkAdmitted",
    "PhaseStarted",
    "PhaseProgress",
    "PhaseFinished",
    "DiagnosticEvent",
    "LinkFinished",
    "LinkCancelled",
    "VerifyMismatch",
    "Lagged",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/nvlinkd.proto");
    let fds = protox::compile(["proto/nvlinkd.proto"], ["proto"])?;
    // File contents travel as `bytes::Bytes`: decoded without a copy (a slice
    // of the received buffer) and sent in pieces that share one output.
    // The codec bounds a `Start`'s decoded size before decoding it (`codec.rs`).
    let mut build = tonic_prost_build::configure()
        .codec_path("crate::codec::Codec")
        .bytes(".nvlinkd.v1.OutputFile.data")
        .bytes(".nvlinkd.v1.FileReply.data");
    // The events' kinds serialise to their JSON view (docs/events.md): the
    // fields in order, an unnamed optional field absent where a diagnostic
    // names nothing, null elsewhere.
    for kind in EVENT_KINDS {
        build = build.type_attribute(format!(".nvlinkd.v1.{kind}"), "#[derive(serde::Serialize)]");
    }
    // `Event.body` serialises as the kind's message itself.
    build = build.type_attribute(".nvlinkd.v1.Event.body", "#[derive(serde::Serialize)] #[serde(untagged)]");
    for field in
        ["symbol", "symbol_demangled", "object", "object_path", "member", "first_defined", "source_file", "line"]
    {
        build = build.field_attribute(
            format!(".nvlinkd.v1.DiagnosticEvent.{field}"),
            "#[serde(skip_serializing_if = \"Option::is_none\")]",
        );
    }
    build.compile_fds(fds)?;
    Ok(())
}
