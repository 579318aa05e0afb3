//! The `comb` binary: `comb serve`, `comb migrate`, and the client commands of `comb::cli`.

use clap::Parser;
use comb::config::{Cli, Command};

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("COMB_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(config) => comb::server::serve(config).await,
        Command::Migrate(db) => comb::server::migrate(&db.database_url).await.map(|_| ()),
        Command::Client(command) => std::process::exit(comb::cli::run(command).await),
    };
    if let Err(e) = result {
        eprintln!("comb: {e}");
        std::process::exit(1);
    }
}
