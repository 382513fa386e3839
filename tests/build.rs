//! Compiles the etcd API subset that coord-bench drives, with `protox` (no system `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "protos/etcd_subset.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["protos"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .bytes(".")
        .compile_fds(fds)?;
    Ok(())
}
