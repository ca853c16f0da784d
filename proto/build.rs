//! Compile `proto/nvlinkd.proto` with protox (pure Rust), so no protoc is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/nvlinkd.proto");
    let fds = protox::compile(["proto/nvlinkd.proto"], ["proto"])?;
    // File contents travel as `bytes::Bytes`: decoded without a copy (a slice
    // of the received buffer) and sent in pieces that share one output.
    tonic_prost_build::configure()
        .bytes(".nvlinkd.v1.OutputFile.data")
        .bytes(".nvlinkd.v1.FileReply.data")
        .compile_fds(fds)?;
    Ok(())
}
