//! Compile `proto/nvlinkd.proto` with protox (pure Rust), so no protoc is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/nvlinkd.proto");
    let fds = protox::compile(["proto/nvlinkd.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(fds)?;
    Ok(())
}
