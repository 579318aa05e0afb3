//! The `comb` binary: `comb serve` and `comb migrate` (the server, from the `comb` library),
//! and the client commands of [`client`], which speak to a running server over HTTP. The
//! HTTP client lives here so that the server crate carries none for it.

mod client;

use clap::{Parser, Subcommand};
use comb::config::{DatabaseConfig, ServeConfig};

/// The `comb` command line.
#[derive(Debug, Parser)]
#[command(
    name = "comb",
    version,
    about = "A partitioned message queue on PostgreSQL"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// What the binary is asked to do.
#[derive(Debug, Subcommand)]
enum Command {
    /// Apply pending schema migrations, then serve the HTTP API.
    Serve(Box<ServeConfig>),
    /// Apply pending schema migrations and exit.
    Migrate(DatabaseConfig),
    #[command(flatten)]
    Client(client::ClientCommand),
}

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
        Command::Serve(config) => comb::server::serve(*config).await,
        Command::Migrate(db) => comb::server::migrate(&db.database_url).await.map(|_| ()),
        Command::Client(command) => std::process::exit(client::run(command).await),
    };
    if let Err(e) = result {
        // With its causes: "error communicating with the server" alone says too little.
        let mut message = format!("comb: {e}");
        let mut cause = e.source();
        while let Some(c) = cause {
            message.push_str(&format!(": {c}"));
            cause = c.source();
        }
        eprintln!("{message}");
        std::process::exit(1);
    }
}
