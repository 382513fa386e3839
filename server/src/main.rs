//! `coordinator`: runs one replica of a coord ensemble. See `coordinator --help`.

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,openraft=warn,sled=warn,h2=warn,tower=warn"));
    tracing_subscriber::fmt().with_env_filter(filter).with_target(false).init();
    let args = coord_server::Args::parse();
    let id = args.id;
    match coord_server::run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("replica {id} cannot run: {e}");
            eprintln!("coordinator: {e}");
            ExitCode::FAILURE
        }
    }
}
