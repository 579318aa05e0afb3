//! `comb-audit`: the delivery audit, the fault scenarios and the input fuzzer, from the
//! command line. `make chaos` runs `comb-audit chaos`, `comb-audit chaos-ha` and
//! `comb-audit fuzz`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use comb_audit::scenario::{self, Options, Outcome};

#[derive(Parser)]
#[command(
    name = "comb-audit",
    about = "Delivery audit, fault scenarios and fuzzing for Comb"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run fault scenarios, each with the delivery audit running throughout.
    Chaos {
        /// The comb binary to run.
        #[arg(long, default_value = "target/release/comb")]
        comb: PathBuf,
        /// Which scenarios: kills, crash, unreachable, pair, worker-lost, short (or all).
        #[arg(long, default_value = "all", value_delimiter = ',')]
        scenario: Vec<String>,
        /// Messages per second the producers push.
        #[arg(long, default_value_t = 250.0)]
        rate: f64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Length of the server-kill scenario, in seconds.
        #[arg(long, default_value_t = 180)]
        kill_for: u64,
        /// Seconds between server kills.
        #[arg(long, default_value_t = 20)]
        kill_every: u64,
        /// Seconds PostgreSQL stays unreachable.
        #[arg(long, default_value_t = 30)]
        outage: u64,
        /// Seconds a Citus worker stays stopped (scenario worker-lost).
        #[arg(long, default_value_t = 15)]
        worker_outage: u64,
    },
    /// Failover: two servers on a Patroni cluster of three PostgreSQL nodes, through a
    /// switchover, a crash of the primary, its return as a standby and a crash with
    /// asynchronous replication (needs `patroni`, `patronictl` and `etcd` on PATH).
    ChaosHa {
        /// The comb binary to run.
        #[arg(long, default_value = "target/release/comb")]
        comb: PathBuf,
        /// Messages per second the producers push.
        #[arg(long, default_value_t = 200.0)]
        rate: f64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Give up (and clean up) after this many seconds.
        #[arg(long, default_value_t = 840)]
        limit: u64,
    },
    /// Send generated and hand-written bad requests to every route.
    Fuzz {
        /// The comb binary to run.
        #[arg(long, default_value = "target/release/comb")]
        comb: PathBuf,
        /// Generated cases to send (the hand-written ones come on top).
        #[arg(long, default_value_t = 20_000)]
        cases: usize,
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Run against a server that requires bearer tokens, sending valid and broken ones.
        #[arg(long)]
        tokens: bool,
    },
    /// Flood a new server with requests on random names that exist nowhere and print its
    /// resident memory and registry sizes before and after.
    Flood {
        /// The comb binary to run.
        #[arg(long, default_value = "target/release/comb")]
        comb: PathBuf,
        /// Requests to send (ack batches carry 32 names each, so 25,000 carry about 100,000).
        #[arg(long, default_value_t = 25_000)]
        requests: usize,
        /// Floods one after another on the same server, each with new names: memory that
        /// stays flat from one to the next holds nothing per name.
        #[arg(long, default_value_t = 1)]
        rounds: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        match cli.command {
            Cmd::Chaos {
                comb,
                scenario: which,
                rate,
                seed,
                kill_for,
                kill_every,
                outage,
                worker_outage,
            } => {
                let opts = Options { comb, rate, seed };
                let all = which.iter().any(|w| w == "all");
                let wants = |s: &str| all || which.iter().any(|w| w == s);
                let mut outcomes: Vec<Outcome> = Vec::new();
                let mut run = |o: Outcome| {
                    println!("{}", o.render());
                    outcomes.push(o);
                };
                if wants("short") && !all {
                    let pg = tokio::task::spawn_blocking(comb_harness::Postgres::start)
                        .await
                        .expect("task")
                        .expect("PostgreSQL");
                    let url = pg.create_database("short").expect("database");
                    run(scenario::short_audit(&opts.comb, &url, 10_000).await);
                }
                if wants("kills") {
                    run(scenario::server_kills(
                        &opts,
                        Duration::from_secs(kill_every),
                        Duration::from_secs(kill_for),
                    )
                    .await);
                }
                if wants("crash") {
                    run(scenario::postgres_crash(&opts).await);
                }
                if wants("unreachable") {
                    run(scenario::postgres_unreachable(&opts, Duration::from_secs(outage)).await);
                }
                if wants("pair") {
                    run(scenario::two_servers(&opts).await);
                }
                if wants("worker-lost") {
                    run(scenario::worker_lost(&opts, Duration::from_secs(worker_outage)).await);
                }
                println!("| scenario | accepted | lost | duplicated | in flight at faults | out of order | result |");
                println!("|---|---|---|---|---|---|---|");
                for o in &outcomes {
                    println!(
                        "| {} | {} | {} | {} | {} | {} | {} |",
                        o.name,
                        o.report.accepted,
                        o.report.lost(),
                        o.report.duplicated(),
                        o.report.in_flight_at_faults,
                        o.report.out_of_order(),
                        if o.passed() { "pass" } else { "FAIL" }
                    );
                }
                if outcomes.iter().all(Outcome::passed) {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            }
            Cmd::ChaosHa {
                comb,
                rate,
                seed,
                limit,
            } => {
                let run = comb_audit::ha::run(comb, rate, seed);
                // Dropping the run (time limit, Ctrl-C) drops the cluster, which kills every
                // process it started.
                let report = tokio::select! {
                    r = tokio::time::timeout(Duration::from_secs(limit), run) => match r {
                        Ok(r) => r,
                        Err(_) => {
                            eprintln!("chaos-ha: not done within {limit} s; stopped");
                            return ExitCode::FAILURE;
                        }
                    },
                    _ = tokio::signal::ctrl_c() => {
                        eprintln!("chaos-ha: interrupted; cleaned up");
                        return ExitCode::FAILURE;
                    }
                };
                for l in &report.commit_latency {
                    println!("commit with a synchronous standby, {l}");
                }
                for p in &report.problems {
                    println!("FAILURE: {p}");
                }
                print!("{}", report.table());
                if report.passed() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            }
            Cmd::Fuzz {
                comb,
                cases,
                seed,
                tokens,
            } => {
                let pg = tokio::task::spawn_blocking(comb_harness::Postgres::start)
                    .await
                    .expect("task")
                    .expect("PostgreSQL");
                let url = pg.create_database("fuzz").expect("database");
                let run = if tokens {
                    comb_audit::fuzz::against_new_server_with_tokens(&comb, &url, cases, seed)
                        .await
                } else {
                    comb_audit::fuzz::against_new_server(&comb, &url, cases, seed).await
                };
                match run {
                    Ok(report) => {
                        println!("{}", report.summary());
                        if report.findings.is_empty() {
                            ExitCode::SUCCESS
                        } else {
                            ExitCode::FAILURE
                        }
                    }
                    Err(e) => {
                        eprintln!("fuzz could not run: {e}");
                        ExitCode::FAILURE
                    }
                }
            }
            Cmd::Flood {
                comb,
                requests,
                rounds,
                seed,
            } => {
                let pg = tokio::task::spawn_blocking(comb_harness::Postgres::start)
                    .await
                    .expect("task")
                    .expect("PostgreSQL");
                let url = pg.create_database("flood").expect("database");
                let server = tokio::task::spawn_blocking(move || {
                    comb_harness::Server::start(&comb, &url, &[])
                })
                .await
                .expect("task")
                .expect("comb");
                let mut failed = false;
                for round in 0..rounds {
                    println!("round {} of {rounds}", round + 1);
                    match comb_audit::fuzz::flood::flood(
                        server.addr(),
                        server.pid(),
                        requests,
                        seed.wrapping_add(round),
                        None,
                    )
                    .await
                    {
                        Ok(report) => {
                            print!("{}", report.summary());
                            failed |= !report.findings.is_empty();
                        }
                        Err(e) => {
                            eprintln!("flood could not run: {e}");
                            failed = true;
                        }
                    }
                }
                if failed {
                    ExitCode::FAILURE
                } else {
                    ExitCode::SUCCESS
                }
            }
        }
    })
}
