//! Runs cells: a fresh database and (for Comb cells) a fresh `comb serve` per cell, set-up,
//! warm-up, the measured window with resource snapshots at its edges, and one [`Row`].

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use comb_harness::{Citus, Postgres, Server};
use tokio::runtime::Runtime;

use crate::cells::{Cell, Kind, Offered};
use crate::http::BoxError;
use crate::load::{self, ConsumerSpec, Rate};
use crate::meter::{Meter, Usage, usage};
use crate::nodes::{self, Node, NodeMeter, NodeSnapshot};
use crate::peers;
use crate::procstat;
use crate::profile::{self, Profile};
use crate::queen1;
use crate::report::Row;
use crate::scaleout;
use crate::stats::{Tally, Window, quantile_ms, slope};
use crate::stream_state;

/// PostgreSQL settings of every run. Durable: these are the numbers worth publishing.
/// `checkpoint_timeout` is long enough that no timed checkpoint lands inside a cell (each
/// cell starts right after a `CHECKPOINT`), so cells are comparable with each other.
pub const PG_SETTINGS: &[(&str, &str)] = &[
    ("fsync", "on"),
    ("synchronous_commit", "on"),
    ("full_page_writes", "on"),
    ("shared_buffers", "1GB"),
    ("max_wal_size", "4GB"),
    ("checkpoint_timeout", "30min"),
    ("max_connections", "400"),
];

/// How a run is done.
#[derive(Debug, Clone)]
pub struct Options {
    /// The `comb` binary (a release build).
    pub comb_bin: PathBuf,
    /// Extra `comb serve` flags for every Comb cell.
    pub comb_args: Vec<String>,
    /// Load before the window opens.
    pub warmup: Duration,
    /// The measured window.
    pub duration: Duration,
    /// Messages per partition pre-filled for the `pop` cell.
    pub pop_fill_per_partition: usize,
    /// Partitions the ceiling's rows are spread over (100 like the push cells; 10,000
    /// shows what many partitions cost the database itself).
    pub ceiling_partitions: usize,
    /// Collect profiles.
    pub profile: Option<Profile>,
    /// Rates of cells that did not run in this run (from an earlier run's results), used
    /// for fixed-rate cells that derive their rate from them.
    pub baseline: Vec<Row>,
    /// Offered rate for `steady` (overrides push1's rate).
    pub steady_rate: Option<f64>,
    /// Offered rate for `fanout` (overrides half of push10's rate).
    pub fanout_rate: Option<f64>,
    /// Partitions one consumer's pop may lease (the suite's cells use 1).
    pub pop_partitions: usize,
    /// The ICU collation of each cell's database on plain PostgreSQL (`--icu-locale`);
    /// `None`: the cluster's `C`.
    pub icu_locale: Option<String>,
    /// Other servers speaking Queen's HTTP API, each run through every Comb cell right after
    /// Comb (`--peer NAME=PROGRAM`).
    pub peers: Vec<Peer>,
    /// Also run every Comb cell on a Citus cluster (a coordinator and two workers), with
    /// per-node figures for both ([`nodes`]).
    pub citus: bool,
    /// Workers of that cluster.
    pub citus_workers: Vec<usize>,
    /// `--citus-route` for the Comb servers on Citus (none: the server's default).
    pub citus_route: Option<String>,
}

/// Another server benchmarked with Comb's cells: started as `PROGRAM serve --listen ADDR`
/// with `DATABASE_URL`, ready once `GET /health` answers 200.
#[derive(Debug, Clone, PartialEq)]
pub struct Peer {
    /// The name its rows carry in the `system` column.
    pub name: String,
    /// The program.
    pub program: PathBuf,
}

impl std::str::FromStr for Peer {
    type Err = String;

    /// `NAME=PROGRAM`; the name must not be one of the systems the suite already has.
    fn from_str(s: &str) -> Result<Peer, String> {
        let (name, program) = s
            .split_once('=')
            .ok_or_else(|| format!("`{s}`: a peer is NAME=PROGRAM"))?;
        let name = name.trim();
        if name.is_empty() || program.is_empty() {
            return Err(format!("`{s}`: a peer is NAME=PROGRAM"));
        }
        if !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        {
            return Err(format!(
                "peer name `{name}`: letters, digits, `-`, `_`, `.`"
            ));
        }
        if ["comb", "ceiling", "skiplocked"].contains(&name) {
            return Err(format!("peer name `{name}` is taken by the suite"));
        }
        Ok(Peer {
            name: name.to_string(),
            program: PathBuf::from(program),
        })
    }
}

/// Rate used when neither this run nor an earlier one measured the cell a fixed-rate cell
/// derives its rate from.
const FALLBACK_RATE: f64 = 2_000.0;

/// A run in progress: the cluster, the options and the rows so far.
pub struct Runner {
    /// The cluster every cell's database lives in.
    pub pg: Postgres,
    /// The Citus clusters Comb cells also run on (`--citus`), one per worker count.
    pub citus: Vec<Citus>,
    opts: Options,
    rt: Runtime,
    /// Results so far, in run order.
    pub rows: Vec<Row>,
    /// Whether [`Runner::fix_rates`] set the fixed-rate cells' rates (for their notes).
    rates_fixed: bool,
}

impl Runner {
    /// Starts the cluster with the suite's settings.
    pub fn new(opts: Options, rt: Runtime) -> Result<Runner, BoxError> {
        let mut settings: Vec<(&str, &str)> = PG_SETTINGS.to_vec();
        if opts.profile.is_some() {
            settings.extend_from_slice(profile::PG_SETTINGS);
        }
        let pg_settings: Vec<(&str, &str)> = match opts.citus {
            true => settings.iter().chain(nodes::PG_SETTINGS).copied().collect(),
            false => settings.clone(),
        };
        let pg = Postgres::start_with(&pg_settings)?;
        let mut citus = Vec::new();
        if opts.citus {
            let all: Vec<(&str, &str)> = settings
                .iter()
                .chain(nodes::CITUS_SETTINGS)
                .copied()
                .collect();
            for &workers in &opts.citus_workers {
                citus.push(Citus::start_workers(workers, &all)?);
            }
        }
        Ok(Runner {
            pg,
            citus,
            opts,
            rt,
            rows: Vec::new(),
            rates_fixed: false,
        })
    }

    /// Runs one cell on a fresh database and records its row.
    pub fn run(&mut self, cell: &Cell) -> Result<Row, BoxError> {
        self.run_on(cell, None)
    }

    /// Runs a Comb cell against another server (`--peer`) on a fresh database and records
    /// its row, named by the peer in the `system` column.
    pub fn run_with(&mut self, cell: &Cell, peer: &Peer) -> Result<Row, BoxError> {
        self.run_on(cell, Some(peer))
    }

    fn run_on(&mut self, cell: &Cell, peer: Option<&Peer>) -> Result<Row, BoxError> {
        let url = match &self.opts.icu_locale {
            Some(locale) => self.pg.create_database_with(
                cell.name,
                &format!("TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE '{locale}' LOCALE 'C'"),
            )?,
            None => self.pg.create_database(cell.name)?,
        };
        let db = url.rsplit('/').next().unwrap_or_default().to_string();
        if let Kind::Queen1 { .. } = cell.kind {
            // Queen 1.0's commit settings for this cell's database alone.
            self.pg.psql("postgres", &queen1::database_sql(&db))?;
        }
        let result = match cell.kind {
            Kind::Ceiling { .. } | Kind::SkipLocked { .. } => self.run_peer(cell, &url),
            _ => {
                // With `--citus`, plain PostgreSQL gets the same per-node accounting.
                let nodes = match !self.citus.is_empty() {
                    true => vec![Node {
                        role: "postgres".into(),
                        url: url.clone(),
                        citus: false,
                    }],
                    false => Vec::new(),
                };
                self.run_comb(cell, &url, peer, nodes)
            }
        };
        // Free the disk for the next cell (this also checkpoints).
        let _ = self
            .pg
            .psql("postgres", &format!("DROP DATABASE IF EXISTS \"{db}\""));
        let row = result?;
        self.rows.push(row.clone());
        Ok(row)
    }

    /// Runs a Comb cell on the `which`th Citus cluster (`--citus`) on a fresh database and
    /// records its row, named `comb-citus-Nw` for N workers, with a figure line per node.
    pub fn run_citus(&mut self, cell: &Cell, which: usize) -> Result<Row, BoxError> {
        let citus = self
            .citus
            .get(which)
            .ok_or("no Citus cluster (run with --citus)")?;
        let url = citus.create_database(cell.name)?;
        let db = url.rsplit('/').next().unwrap_or_default().to_string();
        // Citus turns TLS on; Comb reaches plain PostgreSQL without it, so the same here
        // (the nodes' own connections keep Citus's default).
        let url = format!("{url}?sslmode=disable");
        let all: Vec<&Postgres> = std::iter::once(citus.coordinator())
            .chain(citus.workers())
            .collect();
        let nodes: Vec<Node> = all
            .iter()
            .enumerate()
            .map(|(i, pg)| Node {
                role: match i {
                    0 => "coordinator".to_string(),
                    i => format!("worker{i}"),
                },
                url: pg.url(&db),
                citus: true,
            })
            .collect();
        let workers = citus.workers().len();
        let result = self.run_comb(cell, &url, None, nodes);
        if let Some(citus) = self.citus.get(which) {
            for pg in std::iter::once(citus.coordinator()).chain(citus.workers()) {
                let _ = pg.psql(
                    "postgres",
                    &format!("DROP DATABASE IF EXISTS \"{db}\" WITH (FORCE)"),
                );
            }
        }
        let mut row = result?;
        row.system = format!("comb-citus-{workers}w");
        self.rows.push(row.clone());
        Ok(row)
    }

    /// Benchmarks `bin` with `args` from the next cell on (for comparisons).
    pub fn use_comb(&mut self, bin: PathBuf, args: Vec<String>) {
        self.opts.comb_bin = bin;
        self.opts.comb_args = args;
    }

    /// Fixes the offered rates of the fixed-rate cells to what they would be now (given on
    /// the command line, else from the baseline), so that cells run later offer the same
    /// rates whatever this run measures meanwhile (for comparisons).
    pub fn fix_rates(&mut self) {
        let from_baseline = |cell: &str| {
            self.opts
                .baseline
                .iter()
                .find(|r| r.cell == cell)
                .map(|r| r.msgs_per_sec)
        };
        let steady = self.opts.steady_rate.or_else(|| from_baseline("push1"));
        let fanout = self.opts.fanout_rate.or_else(|| from_baseline("push10"));
        self.opts.steady_rate = steady.or(Some(FALLBACK_RATE));
        self.opts.fanout_rate = fanout.or(Some(FALLBACK_RATE));
        self.rates_fixed = true;
    }

    /// A measured rate of `cell` from this run, else from the baseline.
    fn rate_of(&self, cell: &str) -> Option<(f64, &'static str)> {
        if let Some(r) = self.rows.iter().find(|r| r.cell == cell) {
            return Some((r.msgs_per_sec, "this run"));
        }
        self.opts
            .baseline
            .iter()
            .find(|r| r.cell == cell)
            .map(|r| (r.msgs_per_sec, "an earlier run"))
    }

    /// The offered rate of a fixed-rate cell and where it came from.
    fn offered(&self, cell: &Cell) -> (f64, String) {
        let (source, fraction, forced) = match cell.kind {
            Kind::Steady {
                rate: Offered::Fixed(r),
                ..
            }
            | Kind::SkipLocked { rate: Some(r), .. }
            | Kind::Fanout { fixed: Some(r), .. }
            | Kind::Streams { rate: r, .. }
            | Kind::StreamState(crate::stream_state::Spec { rate: r, .. })
            | Kind::Exchange { rate: r, .. } => {
                return (r, "fixed by the cell".into());
            }
            Kind::Steady {
                rate: Offered::OfPush1(fraction),
                ..
            } => ("push1", fraction, self.opts.steady_rate),
            Kind::Fanout { fraction, .. } => ("push10", fraction, self.opts.fanout_rate),
            _ => return (0.0, String::new()),
        };
        if let Some(r) = forced {
            let from = if self.rates_fixed {
                "the rate fixed for the comparison (command line, else an earlier run)"
            } else {
                "the rate given on the command line"
            };
            return (r * fraction, format!("{fraction} x {from}"));
        }
        match self.rate_of(source) {
            Some((r, from)) => (r * fraction, format!("{fraction} x {source} of {from}")),
            None => (
                FALLBACK_RATE * fraction,
                format!("{fraction} x {FALLBACK_RATE} msg/s ({source} not measured)"),
            ),
        }
    }

    /// Where a `queen1` cell's rate search starts: its rate in this run or the last, else
    /// `queen1`'s (encryption costs more, so the search goes down from there), else a guess.
    fn queen1_start_rate(&self, cell: &str) -> f64 {
        self.rate_of(cell)
            .or_else(|| self.rate_of("queen1"))
            .map_or(4_000.0, |(r, _)| r)
    }

    fn run_comb(
        &mut self,
        cell: &Cell,
        url: &str,
        peer: Option<&Peer>,
        nodes: Vec<Node>,
    ) -> Result<Row, BoxError> {
        let on_citus = nodes.iter().any(|n| n.citus);
        let route_flag = self.opts.citus_route.clone().filter(|_| on_citus);
        let server = match peer {
            None => {
                let mut args = self.opts.comb_args.clone();
                let mut env = Vec::new();
                if let Kind::Queen1 { .. } = cell.kind {
                    args.extend(queen1::serve_args());
                    env = queen1::serve_env();
                }
                if let Some(route) = &route_flag {
                    args.extend(["--citus-route".to_string(), route.clone()]);
                }
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                Server::start_with_env(&self.opts.comb_bin, url, &args, &env)?
            }
            Some(p) => Server::start_program(&p.program, url, "/health")?,
        };
        let system = peer.map_or("comb", |p| p.name.as_str()).to_string();
        let (addr, pid) = (server.addr(), server.pid());
        let (offered, offered_from) = self.offered(cell);
        let opts = self.opts.clone();
        let kind = cell.kind.clone();
        let name = cell.name;
        // On Citus a fill request spread over every partition commits over every shard, in
        // two phases: filling there goes a partition at a time.
        let order = match nodes.iter().any(|n| n.citus) {
            true => load::Order::ByPartition,
            false => load::Order::Interleaved,
        };
        if let Kind::Queen1 { encrypted } = cell.kind {
            let start = self.queen1_start_rate(cell.name);
            let result = self.rt.block_on(queen1::run_cell(
                addr, pid, url, name, system, encrypted, start, &opts, nodes,
            ));
            let mut row = match result {
                Ok(row) => row,
                Err(e) => {
                    return Err(format!("{e}\n--- comb log ---\n{}", server.log_tail(12)).into());
                }
            };
            row.broker_rss_mb = procstat::peak_rss_mb(pid);
            return Ok(row);
        }
        let result = self.rt.block_on(async move {
            // Set-up: queue, groups, partitions, pre-fill.
            let mut state_cells = match &kind {
                Kind::StreamState(spec) => Some(stream_state::prepare(addr, spec).await?),
                _ => None,
            };
            match &kind {
                Kind::Push { partitions, .. } => {
                    load::fill(addr, *partitions, 1, 4).await?;
                }
                Kind::Steady { partitions, .. } => {
                    load::subscribe(addr, &[]).await?;
                    load::fill(addr, *partitions, 1, 4).await?;
                }
                Kind::Fanout {
                    partitions, groups, ..
                } => {
                    load::subscribe(addr, &group_names(*groups)).await?;
                    load::fill(addr, *partitions, 1, 4).await?;
                }
                Kind::Pop { partitions, .. } => {
                    let fill = opts.pop_fill_per_partition;
                    load::fill_in(addr, *partitions, fill, 4, order).await?;
                }
                Kind::Streams { partitions, .. } => {
                    load::fill(addr, *partitions, 1, 4).await?;
                }
                Kind::Idle { .. } => {
                    load::configure(addr, "{}").await?;
                    load::configure_queue(addr, IDLE_GROUPS_QUEUE, "{}").await?;
                }
                Kind::Exchange { .. } | Kind::StreamState(_) => {}
                _ => unreachable!("peers run elsewhere"),
            }
            let mut opts = opts;
            if let Kind::Idle { .. } = kind {
                opts.duration *= 3;
            }
            let (window, measuring) = start_window(url, Some(pid), name, &opts, nodes).await?;
            let mut row = Row {
                cell: name.to_string(),
                system,
                window_s: window.secs(),
                ..Row::default()
            };
            let requests: u64;
            match kind {
                Kind::Push {
                    msgs,
                    conns,
                    partitions,
                } => {
                    let t = load::closed_push(addr, conns, msgs, partitions, window).await;
                    requests = t.requests;
                    set_main(&mut row, &t, window);
                    row.pushed_per_sec = Some(row.msgs_per_sec);
                }
                Kind::Steady {
                    producers,
                    consumers,
                    batch,
                    partitions,
                    ..
                } => {
                    let pushed = Arc::new(AtomicU64::new(0));
                    let consumed = Arc::new(AtomicU64::new(0));
                    let rate = Rate {
                        msgs_per_sec: offered,
                        msgs_per_req: 1,
                        conns: producers,
                        partitions,
                    };
                    let spec = ConsumerSpec {
                        group: None,
                        conns: consumers,
                        batch,
                        partitions: opts.pop_partitions,
                    };
                    if consumers == 0 {
                        // Producers alone: the cell measures what pushing costs.
                        let p = load::open_push(addr, rate, window, pushed).await;
                        requests = p.requests;
                        set_main(&mut row, &p, window);
                        row.pushed_per_sec = Some(row.msgs_per_sec);
                        row.offered_per_sec = Some(offered);
                        row.note = Some(format!("msg/s = pushed; rate: {offered_from}"));
                        let measured = measuring.await?;
                        set_usage(&mut row, &measured.usage, requests);
                        set_nodes(&mut row, measured);
                        return Ok(row);
                    }
                    let sampler = tokio::spawn(sample_backlog(
                        window,
                        pushed.clone(),
                        vec![consumed.clone()],
                    ));
                    let (p, c) = tokio::join!(
                        load::open_push(addr, rate, window, pushed),
                        load::consume(addr, spec, window, consumed)
                    );
                    let samples = sampler.await?;
                    requests = p.requests + c.pops.requests + c.empty_pops + c.acks.requests;
                    set_main(&mut row, &p, window);
                    row.pushed_per_sec = Some(p.messages as f64 / window.secs());
                    row.msgs_per_sec = c.pops.messages as f64 / window.secs();
                    row.consumed_per_sec = Some(row.msgs_per_sec);
                    row.errors += c.pops.errors + c.acks.errors;
                    set_consumer(&mut row, &c);
                    set_backlog(&mut row, &samples, offered);
                    row.offered_per_sec = Some(offered);
                    row.note = Some(format!("rate: {offered_from}"));
                }
                Kind::Fanout {
                    groups,
                    consumers_per_group,
                    producers,
                    batch,
                    partitions,
                    ..
                } => {
                    let pushed = Arc::new(AtomicU64::new(0));
                    let counters: Vec<Arc<AtomicU64>> =
                        (0..groups).map(|_| Arc::new(AtomicU64::new(0))).collect();
                    let rate = Rate {
                        msgs_per_sec: offered,
                        msgs_per_req: 10,
                        conns: producers,
                        partitions,
                    };
                    let sampler =
                        tokio::spawn(sample_backlog(window, pushed.clone(), counters.clone()));
                    let consumers =
                        group_names(groups)
                            .into_iter()
                            .zip(counters)
                            .map(|(g, counter)| {
                                let spec = ConsumerSpec {
                                    group: Some(g),
                                    conns: consumers_per_group,
                                    batch,
                                    partitions: opts.pop_partitions,
                                };
                                tokio::spawn(load::consume(addr, spec, window, counter))
                            });
                    let consumers: Vec<_> = consumers.collect();
                    let p = load::open_push(addr, rate, window, pushed).await;
                    let mut all = Vec::new();
                    for c in consumers {
                        all.push(c.await?);
                    }
                    let samples = sampler.await?;
                    let mut merged = load::Consumed {
                        pops: Tally::default(),
                        empty_pops: 0,
                        acks: Tally::default(),
                        e2e: crate::stats::histogram(),
                        last_delivery: None,
                    };
                    let mut slowest = f64::INFINITY;
                    for c in &all {
                        merged.pops.merge(&c.pops);
                        merged.acks.merge(&c.acks);
                        merged.empty_pops += c.empty_pops;
                        merged.e2e.add(&c.e2e).expect("same bounds");
                        slowest = slowest.min(c.pops.messages as f64 / window.secs());
                    }
                    requests = p.requests
                        + merged.pops.requests
                        + merged.empty_pops
                        + merged.acks.requests;
                    set_main(&mut row, &p, window);
                    row.pushed_per_sec = Some(p.messages as f64 / window.secs());
                    row.msgs_per_sec = merged.pops.messages as f64 / window.secs();
                    row.consumed_per_sec = Some(slowest);
                    row.errors += merged.pops.errors + merged.acks.errors;
                    set_consumer(&mut row, &merged);
                    set_backlog(&mut row, &samples, offered);
                    row.offered_per_sec = Some(offered);
                    row.note = Some(format!(
                        "msg/s = deliveries over {groups} groups; rate: {offered_from}"
                    ));
                }
                Kind::Pop { conns, batch, .. } => {
                    let consumed = Arc::new(AtomicU64::new(0));
                    let spec = ConsumerSpec {
                        group: None,
                        conns,
                        batch,
                        partitions: opts.pop_partitions,
                    };
                    let c = load::consume(addr, spec, window, consumed).await;
                    requests = c.pops.requests + c.empty_pops + c.acks.requests;
                    // If the queue ran dry inside the window, rate over the time it had work.
                    let busy = c
                        .last_delivery
                        .map(|t| (t - window.start).as_secs_f64())
                        .unwrap_or(window.secs());
                    let secs = if busy < window.secs() * 0.95 {
                        row.note = Some(format!("queue ran dry after {busy:.1} s of the window"));
                        busy.max(0.001)
                    } else {
                        window.secs()
                    };
                    row.msgs_per_sec = c.pops.messages as f64 / secs;
                    row.consumed_per_sec = Some(row.msgs_per_sec);
                    row.p50_ms = c.pops.quantile_ms(0.5);
                    row.p99_ms = c.pops.quantile_ms(0.99);
                    row.errors = c.pops.errors + c.acks.errors;
                    set_consumer(&mut row, &c);
                    // The messages are as old as the pre-fill: their age says nothing.
                    row.e2e_p50_ms = None;
                    row.e2e_p99_ms = None;
                }
                Kind::Exchange { conns, .. } => {
                    let t = load::open_exchange(addr, offered, conns, window).await;
                    requests = t.requests;
                    set_main(&mut row, &t, window);
                    row.note = Some(format!(
                        "offered {offered:.0} req/s ({offered_from}); msg/s = requests \
                         answered (404, no database)"
                    ));
                }
                Kind::Idle {
                    consumers,
                    groups,
                    timeout_ms,
                } => {
                    let queue_mode = format!(
                        "/api/v1/pop/queue/{}?batch=50&wait=true&timeout={timeout_ms}",
                        load::QUEUE
                    );
                    let by_group = group_names(groups).into_iter().map(|g| {
                        load::long_poll_until(
                            addr,
                            format!(
                                "/api/v1/pop/queue/{IDLE_GROUPS_QUEUE}?batch=50&wait=true\
                                 &timeout={timeout_ms}&consumerGroup={g}"
                            ),
                            1,
                            window.end,
                        )
                    });
                    let (q, g) = tokio::join!(
                        load::long_poll_until(addr, queue_mode, consumers, window.end),
                        futures_util::future::join_all(by_group)
                    );
                    let mut polled = q;
                    for p in g {
                        polled.requests += p.requests;
                        polled.deliveries += p.deliveries;
                        polled.errors += p.errors;
                    }
                    requests = polled.requests;
                    row.errors = polled.errors + polled.deliveries;
                    row.note = Some(format!(
                        "{consumers} consumers + {groups} groups long-polling for {:.0} s; \
                         {:.2} pops/s answered",
                        window.secs(),
                        polled.requests as f64 / window.secs()
                    ));
                }
                Kind::Streams {
                    partitions,
                    runners,
                    batch,
                    ..
                } => {
                    let query = load::register_stream(addr).await?;
                    let pushed = Arc::new(AtomicU64::new(0));
                    let rate = Rate {
                        msgs_per_sec: offered,
                        msgs_per_req: 1,
                        conns: 20,
                        partitions,
                    };
                    let (p, s) = tokio::join!(
                        load::open_push(addr, rate, window, pushed),
                        load::run_streams(addr, query, runners, batch, window)
                    );
                    requests = p.requests + s.requests;
                    set_main(&mut row, &p, window);
                    row.pushed_per_sec = Some(p.messages as f64 / window.secs());
                    row.msgs_per_sec = s.messages as f64 / window.secs();
                    row.consumed_per_sec = Some(row.msgs_per_sec);
                    row.errors += s.errors;
                    row.offered_per_sec = Some(offered);
                    row.note = Some(format!(
                        "{:.0} cycles/s, {} windows emitted; CPU per msg = per source message",
                        s.cycles as f64 / window.secs(),
                        s.emitted
                    ));
                }
                Kind::StreamState(spec) => {
                    let prepared = state_cells.take().ok_or("the state cell's set-up")?;
                    let t = stream_state::run(addr, &spec, prepared, window).await;
                    requests = t.requests;
                    set_main(&mut row, &t, window);
                    row.offered_per_sec = Some(offered);
                    row.note = Some(stream_state::note(&spec));
                }
                _ => unreachable!(),
            }
            let measured = measuring.await?;
            set_usage(&mut row, &measured.usage, requests);
            set_nodes(&mut row, measured);
            Ok::<Row, BoxError>(row)
        });
        let mut row = match result {
            Ok(row) => row,
            // What the server logged says why, where the answer only gave a request id.
            Err(e) => return Err(format!("{e}\n--- comb log ---\n{}", server.log_tail(12)).into()),
        };
        row.broker_rss_mb = procstat::peak_rss_mb(pid);
        if on_citus {
            let log = std::fs::read_to_string(server.log_path()).unwrap_or_default();
            let logs_info = scaleout::logs_info();
            row.route = Some(scaleout::route_of(&log, route_flag.as_deref(), logs_info));
        }
        drop(server);
        Ok(row)
    }

    fn run_peer(&mut self, cell: &Cell, url: &str) -> Result<Row, BoxError> {
        let (offered, _) = self.offered(cell);
        if let Kind::Ceiling { .. } = cell.kind {
            // Comb's own schema, so the rows land in the very table Comb writes.
            let out = std::process::Command::new(&self.opts.comb_bin)
                .arg("migrate")
                .env("DATABASE_URL", url)
                .env("COMB_LOG", "warn")
                .output()?;
            if !out.status.success() {
                return Err(format!(
                    "comb migrate failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                )
                .into());
            }
        }
        let opts = self.opts.clone();
        let kind = cell.kind.clone();
        let name = cell.name;
        self.rt.block_on(async move {
            if let Kind::SkipLocked { .. } = kind {
                peers::connect(url)
                    .await?
                    .batch_execute(peers::SKIP_LOCKED_SCHEMA)
                    .await?;
            }
            let (window, measuring) = start_window(url, None, name, &opts, Vec::new()).await?;
            let mut row = Row {
                cell: name.to_string(),
                system: match kind {
                    Kind::Ceiling { .. } => "ceiling".into(),
                    _ => "skiplocked".into(),
                },
                window_s: window.secs(),
                ..Row::default()
            };
            let requests;
            match kind {
                Kind::Ceiling { conns, batch } => {
                    let per_conn = (opts.ceiling_partitions / conns).max(1);
                    let t = peers::ceiling(url, conns, batch, per_conn, window).await?;
                    requests = t.requests;
                    set_main(&mut row, &t, window);
                }
                Kind::SkipLocked { enq, deq, rate } => {
                    let s = peers::skip_locked(url, enq, deq, rate, window).await?;
                    requests = s.enqueued.requests + s.dequeued.requests + s.empty;
                    set_main(&mut row, &s.enqueued, window);
                    row.pushed_per_sec = Some(row.msgs_per_sec);
                    if deq > 0 {
                        row.msgs_per_sec = s.dequeued.messages as f64 / window.secs();
                        row.consumed_per_sec = Some(row.msgs_per_sec);
                        row.pop_p99_ms = s.dequeued.quantile_ms(0.99);
                        row.e2e_p50_ms = quantile_ms(&s.e2e, 0.5);
                        row.e2e_p99_ms = quantile_ms(&s.e2e, 0.99);
                        row.errors += s.dequeued.errors;
                        let enq_rate = row.pushed_per_sec.unwrap_or(0.0);
                        row.keeps_up = Some(row.msgs_per_sec >= 0.98 * enq_rate);
                        row.note = Some("msg/s = dequeued".into());
                        if rate.is_some() {
                            row.offered_per_sec = Some(offered);
                            row.keeps_up = Some(
                                enq_rate >= 0.97 * offered && row.msgs_per_sec >= 0.98 * enq_rate,
                            );
                        }
                    }
                }
                _ => unreachable!(),
            }
            let measured = measuring.await?;
            set_usage(&mut row, &measured.usage, requests);
            set_nodes(&mut row, measured);
            Ok(row)
        })
    }
}

/// The second queue of the `idle` cell, read by its consumer groups.
const IDLE_GROUPS_QUEUE: &str = "bench-groups";

/// Consumer group names of the fan-out cell.
fn group_names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("g{i}")).collect()
}

/// What the window's edges read: the machine's usage, and each node's counters when asked.
pub(crate) struct Measured {
    pub(crate) usage: Usage,
    pub(crate) nodes: Option<(NodeMeter, NodeSnapshot, NodeSnapshot)>,
}

pub(crate) type Measuring = tokio::task::JoinHandle<Measured>;

/// Checkpoints and analyses the set-up's data, then opens the window after the warm-up and
/// starts the task that snapshots resources at its edges (and profiles, when asked).
pub(crate) async fn start_window(
    url: &str,
    broker_pid: Option<u32>,
    cell: &'static str,
    opts: &Options,
    nodes: Vec<Node>,
) -> Result<(Window, Measuring), BoxError> {
    let node_meter = match nodes.is_empty() {
        true => None,
        false => Some(NodeMeter::new(&nodes).await?),
    };
    let client = peers::connect(url).await?;
    client.batch_execute("ANALYZE; CHECKPOINT").await?;
    if opts.profile.is_some() {
        profile::prepare(&client).await?;
    }
    let meter = Meter::new(broker_pid, client).await?;
    let window = Window::after(opts.warmup, opts.duration);
    let prof = opts.profile.clone();
    let task = tokio::spawn(async move {
        tokio::time::sleep_until(window.start.into()).await;
        let wal_from = match prof {
            Some(_) => {
                profile::reset(meter.client()).await;
                profile::wal_lsn(meter.client()).await
            }
            None => None,
        };
        let node_a = match &node_meter {
            Some(m) => Some(m.snapshot().await),
            None => None,
        };
        let a = meter.snapshot().await;
        let perf = prof
            .as_ref()
            .filter(|p| p.perf)
            .map(|p| profile::start_perf(&p.dir, cell, window.secs(), broker_pid));
        let waits = match &prof {
            Some(_) => Some(profile::Waits::sample(meter.client(), window.end.into()).await),
            None => {
                tokio::time::sleep_until(window.end.into()).await;
                None
            }
        };
        let b = meter.snapshot().await;
        let node_b = match &node_meter {
            Some(m) => Some(m.snapshot().await),
            None => None,
        };
        let u = usage(&a, &b);
        if let Some(p) = &prof {
            let mut text = format!("Cell {cell}\n\n");
            text.push_str(&profile::statements(meter.client(), u.secs).await);
            text.push('\n');
            text.push_str(&waits.unwrap_or_default().text());
            text.push_str(&wal_text(&u));
            if let Some(from) = &wal_from {
                text.push_str(&profile::wal_records(meter.client(), from, u.secs).await);
            }
            let _ = std::fs::create_dir_all(&p.dir);
            let _ = std::fs::write(p.dir.join(format!("{cell}.txt")), text);
            if let Some(child) = perf {
                let dir = p.dir.clone();
                let _ =
                    tokio::task::spawn_blocking(move || profile::finish_perf(child, &dir, cell))
                        .await;
            }
        }
        Measured {
            usage: u,
            nodes: node_meter
                .zip(node_a)
                .zip(node_b)
                .map(|((m, a), b)| (m, a, b)),
        }
    });
    Ok((window, task))
}

/// Where the cell's time went outside PostgreSQL's statements: commits, WAL flushes and
/// their duration, CPU by party.
fn wal_text(u: &Usage) -> String {
    let per = |x: Option<f64>| x.map(|v| v / u.secs).unwrap_or(0.0);
    let syncs = u.wal_syncs.unwrap_or(0.0);
    format!(
        "\nCommits {:.0}/s, WAL flushes {:.0}/s, mean flush {:.3} ms ({:.0}% of one backend's time), \
         WAL {:.1} MB/s\nCPU cores: broker {:.2}, PostgreSQL {:.2}, load generator {:.2}, others {:.2}\n",
        per(u.commits),
        per(u.wal_syncs),
        u.wal_sync_ms.unwrap_or(0.0) / syncs.max(1.0),
        u.wal_sync_ms.unwrap_or(0.0) / u.secs / 10.0,
        per(u.wal_bytes) / 1e6,
        u.broker_cpu.unwrap_or(0.0) / u.secs,
        u.pg_cpu / u.secs,
        u.loadgen_cpu / u.secs,
        u.other_cpu / u.secs,
    )
}

/// Rate, request latency and errors from the cell's main kind of request.
fn set_main(row: &mut Row, t: &Tally, window: Window) {
    row.msgs_per_sec = t.messages as f64 / window.secs();
    row.p50_ms = t.quantile_ms(0.5);
    row.p99_ms = t.quantile_ms(0.99);
    row.errors += t.errors;
}

fn set_consumer(row: &mut Row, c: &load::Consumed) {
    row.e2e_p50_ms = quantile_ms(&c.e2e, 0.5);
    row.e2e_p99_ms = quantile_ms(&c.e2e, 0.99);
    row.pop_p99_ms = c.pops.quantile_ms(0.99);
    row.ack_p99_ms = c.acks.quantile_ms(0.99);
}

/// Backlog trend of the worst group; consumers keep up when producers met the offered rate
/// (within 3 %) and no group's backlog grew by more than 2 % of the offered rate per second.
pub(crate) fn set_backlog(row: &mut Row, samples: &[(f64, u64, Vec<u64>)], offered: f64) {
    let groups = samples.first().map(|s| s.2.len()).unwrap_or(0);
    let mut worst_slope = f64::NEG_INFINITY;
    let mut worst_end = 0.0f64;
    for g in 0..groups {
        let pts: Vec<(f64, f64)> = samples
            .iter()
            .map(|(t, pushed, consumed)| (*t, *pushed as f64 - consumed[g] as f64))
            .collect();
        if let Some(s) = slope(&pts) {
            worst_slope = worst_slope.max(s);
        }
        if let Some(last) = pts.last() {
            worst_end = worst_end.max(last.1);
        }
    }
    if worst_slope.is_finite() {
        row.backlog_slope = Some(worst_slope);
        row.backlog_end = Some(worst_end);
        let producers_ok = row.pushed_per_sec.unwrap_or(0.0) >= 0.97 * offered;
        row.keeps_up = Some(producers_ok && worst_slope <= 0.02 * offered);
    }
}

/// Samples (seconds into the window, pushed, consumed per group) every 250 ms of the window.
pub(crate) async fn sample_backlog(
    window: Window,
    pushed: Arc<AtomicU64>,
    consumed: Vec<Arc<AtomicU64>>,
) -> Vec<(f64, u64, Vec<u64>)> {
    tokio::time::sleep_until(window.start.into()).await;
    let mut out = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    while std::time::Instant::now() < window.end {
        tick.tick().await;
        out.push((
            (std::time::Instant::now() - window.start).as_secs_f64(),
            pushed.load(Ordering::Relaxed),
            consumed.iter().map(|c| c.load(Ordering::Relaxed)).collect(),
        ));
    }
    out
}

/// Resource figures of the window.
pub(crate) fn set_usage(row: &mut Row, u: &Usage, requests: u64) {
    let per_sec = |x: f64| x / u.secs;
    let msgs = row.msgs_per_sec * row.window_s;
    if let Some(cpu) = u.broker_cpu {
        row.broker_cpu_cores = Some(per_sec(cpu));
        row.broker_cpu_us_per_req = (requests > 0).then(|| cpu * 1e6 / requests as f64);
        row.broker_cpu_us_per_msg = (msgs > 0.0).then(|| cpu * 1e6 / msgs);
    }
    row.req_per_sec = Some(requests as f64 / row.window_s);
    row.pg_cpu_cores = Some(per_sec(u.pg_cpu));
    let all_in = u.broker_cpu.unwrap_or(0.0) + u.pg_cpu;
    row.all_in_cpu_cores = Some(per_sec(all_in));
    row.all_in_cpu_us_per_msg = (msgs > 0.0).then(|| all_in * 1e6 / msgs);
    row.loadgen_cpu_cores = Some(per_sec(u.loadgen_cpu));
    row.other_cpu_cores = Some(per_sec(u.other_cpu));
    row.machine_busy = Some(u.machine_busy);
    row.machine_steal = Some(u.machine_steal);
    row.pg_commits_per_sec = u.commits.map(per_sec);
    row.pg_wal_syncs_per_sec = u.wal_syncs.map(per_sec);
    row.pg_wal_bytes_per_msg = u.wal_bytes.filter(|_| msgs > 0.0).map(|b| b / msgs);
}

/// Each node's figures of the window; on several nodes, PostgreSQL's CPU (and so the all-in
/// figures) is theirs added up, since the meter's own reading covers only the node Comb
/// connects to, and the other nodes' CPU leaves "other" (the meter counted it there, as
/// processes not its own; the model check takes the machine's cores less "other").
pub(crate) fn set_nodes(row: &mut Row, measured: Measured) {
    let Some((meter, a, b)) = measured.nodes else {
        return;
    };
    let u = &measured.usage;
    let msgs = row.msgs_per_sec * row.window_s;
    row.nodes = meter.rows(&a, &b, u.secs, msgs);
    if row.nodes.len() > 1 {
        let pg_cpu: f64 = row.nodes.iter().map(|n| n.cpu_cores).sum::<f64>() * u.secs;
        row.pg_cpu_cores = Some(pg_cpu / u.secs);
        let all_in = u.broker_cpu.unwrap_or(0.0) + pg_cpu;
        row.all_in_cpu_cores = Some(all_in / u.secs);
        row.other_cpu_cores = Some(other_beside_nodes(u.other_cpu, u.pg_cpu, pg_cpu) / u.secs);
        row.all_in_cpu_us_per_msg = (msgs > 0.0).then(|| all_in * 1e6 / msgs);
        row.pg_wal_bytes_per_msg = nodes::sum(&row.nodes).wal_bytes_per_msg;
    }
}

/// CPU seconds of processes other than ours when PostgreSQL is several nodes: the meter's
/// "other" (`other`) less the nodes' CPU (`nodes`) beyond the one node it read (`metered`).
fn other_beside_nodes(other: f64, metered: f64, nodes: f64) -> f64 {
    (other - (nodes - metered).max(0.0)).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_other_nodes_cpu_is_not_counted_as_other_processes() {
        // The coordinator metered at 9 s, the cluster's nodes 17 s, the meter's other 8.6 s:
        // 8 s of it were the workers.
        assert!((other_beside_nodes(8.6, 9.0, 17.0) - 0.6).abs() < 1e-9);
        assert_eq!(other_beside_nodes(1.0, 9.0, 17.0), 0.0);
        assert_eq!(other_beside_nodes(1.0, 9.0, 9.0), 1.0);
    }

    #[test]
    fn backlog_verdicts() {
        let flat: Vec<(f64, u64, Vec<u64>)> = (0..20)
            .map(|i| (i as f64 * 0.25, 1000 * i + 30, vec![1000 * i]))
            .collect();
        let mut row = Row {
            pushed_per_sec: Some(4000.0),
            ..Row::default()
        };
        set_backlog(&mut row, &flat, 4000.0);
        assert_eq!(row.keeps_up, Some(true));
        assert_eq!(row.backlog_end, Some(30.0));

        let growing: Vec<(f64, u64, Vec<u64>)> = (0..20)
            .map(|i| (i as f64 * 0.25, 1000 * i, vec![1000 * i, 800 * i]))
            .collect();
        set_backlog(&mut row, &growing, 4000.0);
        assert_eq!(row.keeps_up, Some(false));
        assert!((row.backlog_slope.unwrap() - 800.0).abs() < 1e-6);

        // Flat backlog, but the producers could not offer the load.
        row.pushed_per_sec = Some(3000.0);
        set_backlog(&mut row, &flat, 4000.0);
        assert_eq!(row.keeps_up, Some(false));
    }
}
