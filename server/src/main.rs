//! `coordinator`: runs one replica of a coord ensemble. See `coordinator --help`.

use std::process::ExitCode;

/// A faster allocator than glibc malloc for the many small allocations of gRPC and HTTP/2 (the
/// `system-alloc` feature leaves glibc's, which heap profilers hook).
#[cfg(not(feature = "system-alloc"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,openraft=warn,h2=warn,tower=warn"));
    // Colours only for a person at a terminal, not in files, journald or container logs.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout())
        && std::env::var_os("NO_COLOR").is_none();
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false)
        .with_ansi(ansi)
        .init();
    let args = coord_server::Args::parse();
    let id = args.id;
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if args.worker_threads > 0 {
        runtime.worker_threads(args.worker_threads);
    }
    let runtime = match runtime.enable_all().thread_name("coord-worker").build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("coordinator: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(coord_server::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("replica {id} cannot run: {e}");
            eprintln!("coordinator: {e}");
            ExitCode::FAILURE
        }
    }
}
