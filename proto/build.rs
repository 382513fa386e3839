//! Compiles every `.proto` under `protos/` with `protox` (pure Rust), so a machine with only the
//! Rust toolchain builds the crate: no system `protoc`.

use std::path::{Path, PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new("protos");
    let mut files = Vec::new();
    collect_protos(root, &mut files)?;
    files.sort();
    // The directory too, so that a new .proto triggers a rebuild.
    println!("cargo:rerun-if-changed={}", root.display());
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    let fds = protox::compile(&files, [root])?;
    // The compiled schema itself, so that a test can hold TensorFlow's messages up against the
    // wheel's own descriptors (`tests/tf/tf_schema.py check`).
    let out = PathBuf::from(std::env::var("OUT_DIR")?).join("coord_descriptors.bin");
    std::fs::write(out, prost::Message::encode_to_vec(&fds))?;
    tonic_prost_build::configure()
        // Values and Raft payloads are handed around without copies.
        .bytes(".")
        // Small initial buffers: a replica holds thousands of calls at once.
        .codec_path("crate::codec::SmallBufferCodec")
        // Carries a device list encoded once for the whole job (see `wait_answer.rs`).
        .extern_path(
            ".tensorflow.WaitForAllTasksResponse",
            "crate::tensorflow::WaitForAllTasksResponse",
        )
        // Likewise a round's live tasks (see `alive_answer.rs`).
        .extern_path(
            ".xla.coordination.GetAliveTasksResponse",
            "crate::xla::coordination::GetAliveTasksResponse",
        )
        .compile_fds(fds)?;
    Ok(())
}

fn collect_protos(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect_protos(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path);
        }
    }
    Ok(())
}
