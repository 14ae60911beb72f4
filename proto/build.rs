//! Compiles the .proto files with protox (pure Rust, no protoc binary needed).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/replica.proto", "proto/engine.proto", "proto/instance.proto", "proto/csi.proto"];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure().bytes(".").compile_fds(descriptors)?;
    Ok(())
}
