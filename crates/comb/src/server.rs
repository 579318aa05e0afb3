//! Wiring: connect, migrate, start the workers, serve until SIGTERM, then stop gracefully.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::ack::{self, Acker};
use crate::backend::Backend;
use crate::catalog::{self, Catalog};
use crate::config::ServeConfig;
use crate::http::{self, App};
use crate::metrics::Metrics;
use crate::pop::{self, Popper};
use crate::push::{self, Pusher};
use crate::queue::QueueOptions;
use crate::transaction::Transactions;
use crate::wake::Wake;
use crate::{db, lease, maintenance, schema};

/// Runs `comb serve` until SIGTERM or SIGINT.
pub async fn serve(config: ServeConfig) -> Result<(), Box<dyn std::error::Error>> {
    let keys = Arc::new(crate::encryption::Keys::from_env()?);
    let auth = crate::auth::Auth::from_config(&config.auth)?;
    if let Some(auth) = &auth {
        auth.start().await;
        tracing::info!("bearer tokens required");
    }
    let me = schema::servers::Registration::of_this_process(&config.listen.to_string());
    let (_, backend) = migrate_on(&config.database.database_url, Some(&me)).await?;
    let pools = db::Pools::new(
        &config.database.database_url,
        config.general_pool_size(),
        config.consumer_pool_size(),
        backend.plans_for_each_execution(),
    )?;
    let router = if backend.distributes_schema() && config.citus_route == "direct" {
        let size = config.citus_worker_pool_size;
        db::route::Router::direct(
            &pools,
            &config.database.database_url,
            size.unwrap_or(config.general_pool_size()),
            size.unwrap_or(config.consumer_pool_size()),
        )
    } else {
        db::route::Router::through_pools()
    };
    let pool = pools.general.clone();
    tokio::spawn(heartbeat(
        pool.clone(),
        me.clone(),
        config.database.database_url.clone(),
    ));
    let metrics = Arc::new(Metrics::default());
    tokio::spawn(maintenance::run(
        config.database.database_url.clone(),
        maintenance::Settings {
            segment_seconds: config.segment_seconds,
            generation_seconds: config.generation_seconds,
            stream_state_generations: config.stream_state_generations,
            interval: std::time::Duration::from_millis(config.maintenance_interval_ms),
            lock_timeout: std::time::Duration::from_millis(config.maintenance_lock_timeout_ms),
            server: format!("{} pid {}", config.listen, std::process::id()),
            backend,
        },
        metrics.clone(),
    ));
    tokio::spawn(crate::admin::status::record(
        pool.clone(),
        metrics.clone(),
        format!("{} pid {}", config.listen, std::process::id()),
        std::time::Duration::from_millis(config.stats_interval_ms),
    ));
    let wake = Arc::new(Wake::default());
    let catalog = Arc::new(Catalog::new(backend));
    tokio::spawn(crate::wake::relay(
        config.database.database_url.clone(),
        wake.clone(),
        catalog.on_stale(),
    ));
    let default_lease = QueueOptions::default().lease_time as f64;
    crate::wake::start_broadcast(&wake, pool.clone());
    let replication = Arc::new(crate::replication::Status::default());
    tokio::spawn(crate::replication::watch(pool.clone(), replication.clone()));
    let (stop_signal, stopping) = watch::channel(false);
    let pusher = Arc::new(Pusher::start(
        pool.clone(),
        catalog.clone(),
        wake.clone(),
        metrics.clone(),
        keys.clone(),
        router.clone(),
        config.push_workers,
        config.fuse_max_items,
    ));
    let acker = Arc::new(Acker::start(
        pools.consumer.clone(),
        backend,
        router.clone(),
        metrics.clone(),
        wake.clone(),
        config.ack_workers,
        config.fuse_max_items,
    ));
    let popper = Popper::start(
        &pools,
        &config.database.database_url,
        catalog.clone(),
        wake.clone(),
        metrics.clone(),
        keys.clone(),
        router.clone(),
        config.pop_workers,
        default_lease,
        pop::Waits {
            max_waiting: config.max_waiting_pops,
            poll_fallback: std::time::Duration::from_millis(config.poll_fallback_ms),
            stopping,
            handoff: config.handoff == "on",
        },
    );
    let transactions = Transactions::new(
        pool.clone(),
        router.clone(),
        pusher.clone(),
        acker.clone(),
        wake.clone(),
    );
    let streams = crate::streams::Streams::new(
        pool.clone(),
        pusher.clone(),
        acker.clone(),
        wake.clone(),
        metrics.fusion.cycle.clone(),
    );
    let app = Arc::new(App {
        backend,
        router,
        pusher,
        popper,
        acker,
        transactions,
        streams,
        catalog,
        wake,
        pool,
        pools,
        metrics,
        replication,
        stopping: AtomicBool::new(false),
        stop_signal,
        durations: http::route_durations(),
        modes: Default::default(),
        started: std::time::Instant::now(),
        keys,
        auth,
        config,
    });
    let listener = http::limits::LimitedListener::new(
        TcpListener::bind(app.config.listen).await?,
        app.config.max_connections,
    );
    let registry = app.pool.clone();
    match (&app.config.tls.tls_cert, &app.config.tls.tls_key) {
        (Some(cert), Some(key)) => {
            let listener = http::tls::TlsListener::new(listener, cert.clone(), key.clone())?;
            tracing::info!(addr = %app.config.listen, "comb is serving HTTPS");
            serve_on(listener, app).await?;
        }
        _ => {
            tracing::info!(addr = %app.config.listen, "comb is serving");
            serve_on(listener, app).await?;
        }
    }
    // Off the registry at once, rather than forgotten after missed beats.
    if let Ok(client) = registry.get().await
        && let Err(e) = schema::servers::leave(&client, me.id).await
    {
        tracing::warn!(error = %e, "could not leave the server registry");
    }
    tracing::info!("stopped");
    Ok(())
}

/// Beats in the server registry every [`schema::servers::HEARTBEAT`]. A server the leader
/// forgot (it missed its beats: a frozen host, a lost network) registers again and makes its
/// data-path functions again, which may have been dropped meanwhile.
async fn heartbeat(pool: deadpool_postgres::Pool, me: schema::servers::Registration, url: String) {
    loop {
        tokio::time::sleep(schema::servers::HEARTBEAT).await;
        let beat = match pool.get().await {
            Ok(client) => schema::servers::beat(&client, &me).await,
            Err(e) => {
                tracing::debug!(error = %e, "no connection for the heartbeat");
                continue;
            }
        };
        match beat {
            Ok(false) => {}
            Ok(true) => {
                tracing::warn!("this server had been forgotten by the registry; registered again");
                if let Err(e) = install_functions(&url).await {
                    tracing::warn!(error = %e, "could not make this server's functions again");
                }
            }
            Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
        }
    }
}

/// Serves the API on `listener` until SIGTERM or SIGINT, then finishes in-flight requests.
async fn serve_on<L>(listener: L, app: Arc<App>) -> std::io::Result<()>
where
    L: axum::serve::Listener<Addr = std::net::SocketAddr>,
{
    let stopper = app.clone();
    // The JSON API and, on the same port, the dashboard's pages (kept out of the API's
    // route list and its OpenAPI document).
    let service = http::router(app.clone()).merge(crate::dashboard::router(app.clone()));
    axum::serve(listener, service)
        .with_graceful_shutdown(async move {
            stop_requested().await;
            tracing::info!("stopping: finishing in-flight requests");
            stopper.begin_stop();
        })
        .await
}

/// Applies pending migrations and reports what was done.
pub async fn migrate(database_url: &str) -> Result<Vec<i32>, Box<dyn std::error::Error>> {
    Ok(migrate_on(database_url, None).await?.0)
}

/// [`migrate`], and the storage the database is: read here, once, and handed to the use
/// cases as a value. A server (`me`) registers itself before it makes its functions, so that
/// the maintenance leader never drops a set a starting server is about to call.
async fn migrate_on(
    database_url: &str,
    me: Option<&schema::servers::Registration>,
) -> Result<(Vec<i32>, Backend), Box<dyn std::error::Error>> {
    let mut client = db::connect(database_url).await?;
    let (applied, backend) = schema::migrate(&mut client).await?;
    if let Some(me) = me {
        schema::servers::beat(&client, me).await?;
    }
    make_functions(&mut client, backend).await?;
    if applied.is_empty() {
        tracing::info!(version = schema::latest_version(), "schema is up to date");
    } else {
        tracing::info!(?applied, "schema migrated");
    }
    Ok((applied, backend))
}

/// This build's data-path functions on one PostgreSQL, by name: the hand-off first, which the
/// push's function calls.
type Plain = (&'static str, &'static std::sync::LazyLock<String>);
const PLAIN_FUNCTIONS: [Plain; 3] = [
    (push::HAND_OFF_NAME, &push::HAND_OFF_FUNCTION),
    (push::STORE_NAME, &push::STORE_FUNCTION),
    (ack::COMPLETE_NAME, &ack::COMPLETE_FUNCTION),
];

/// This build's data-path functions on Citus, each run whole on a partition's worker: the
/// claim of a partition, the judgement of acks, a lease's extension and a partition's
/// creation, with their signatures and distribution arguments.
type Delegated = (
    &'static std::sync::LazyLock<String>,
    (&'static str, &'static str, bool),
);
const CITUS_FUNCTIONS: [Delegated; 4] = [
    (&pop::CLAIM_CITUS_FUNCTION, pop::CLAIM_CITUS_SIGNATURE),
    (&ack::JUDGE_CITUS_FUNCTION, ack::JUDGE_CITUS_SIGNATURE),
    (&lease::EXTEND_CITUS_FUNCTION, lease::EXTEND_CITUS_SIGNATURE),
    (
        &catalog::CREATE_CITUS_FUNCTION,
        catalog::CREATE_CITUS_SIGNATURE,
    ),
];

/// Makes this build's data-path functions again, on a connection of its own.
async fn install_functions(database_url: &str) -> Result<(), Box<dyn std::error::Error>> {
    let mut client = db::connect(database_url).await?;
    let backend = crate::backend::Backend::detect(&client).await?;
    make_functions(&mut client, backend).await
}

/// This build's data-path functions, on one PostgreSQL or delegated on Citus.
async fn make_functions(
    client: &mut tokio_postgres::Client,
    backend: Backend,
) -> Result<(), Box<dyn std::error::Error>> {
    // On one PostgreSQL, a push (with its hand-off to waiting pops) and the completing acks
    // are each one call. The hand-off first: the push's function calls it.
    schema::install_functions(
        client,
        backend,
        &PLAIN_FUNCTIONS.map(|(n, f)| (n, f.as_str())),
    )
    .await?;
    // On Citus, the claim of a partition, the judgement of acks and a lease's extension run
    // whole on the partition's worker, each as one call, and so does a partition's creation.
    schema::citus::delegate(
        client,
        backend,
        &CITUS_FUNCTIONS.map(|(f, s)| (f.as_str(), s)),
    )
    .await?;
    // On Citus, whether partitions made before their ids were derived are left.
    catalog::record_legacy(client, backend).await?;
    Ok(())
}

async fn stop_requested() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// FNV-1a, 64 bits: a hash that stays the same across builds and platforms.
    fn fnv(text: &str) -> u64 {
        text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    }

    /// Every data-path function of this build's set: its name and its text.
    fn functions() -> Vec<(&'static str, &'static str)> {
        PLAIN_FUNCTIONS
            .iter()
            .map(|(n, f)| (*n, f.as_str()))
            .chain(CITUS_FUNCTIONS.iter().map(|(f, s)| (s.0, f.as_str())))
            .collect()
    }

    /// The hash of each function's text, for [`schema::FUNCTIONS_VERSION`] 4.
    const PINNED: &[(&str, u64)] = &[
        ("comb.hand_off_v4", 11773745731277536330),
        ("comb.store_batch_v4", 2082012627891878399),
        ("comb.complete_acks_v4", 16130906088514217700),
        (
            "comb.claim_partition_v4(uuid, text, uuid[], bigint, double precision, boolean, uuid, \
             bigint, uuid, boolean, boolean)",
            4572909931727709031,
        ),
        (
            "comb.judge_acks_v4(uuid[], text[], uuid[], text[], integer[], integer[], bytea[], uuid)",
            18261601995749108198,
        ),
        (
            "comb.extend_lease_v4(uuid, text, uuid, double precision)",
            2861562235400588675,
        ),
        (
            "comb.create_partition_v4(uuid, uuid, text)",
            2504895162733278802,
        ),
    ];

    /// A body changes only with the set's version: servers of the same version call the same
    /// set, made once (never replaced), so a changed body under an old version would run on
    /// some databases and not on others. To change a body: bump `functions_version!` in
    /// `schema/mod.rs` and pin the new hashes here.
    #[test]
    fn every_function_body_is_pinned_to_the_functions_version() {
        assert_eq!(schema::FUNCTIONS_VERSION, 4, "pin the new version's bodies");
        let have: Vec<(String, u64)> = functions()
            .into_iter()
            .map(|(n, f)| (n.to_string(), fnv(f)))
            .collect();
        let want: Vec<(String, u64)> = PINNED.iter().map(|(n, h)| (n.to_string(), *h)).collect();
        assert_eq!(
            have, want,
            "a data-path function's text changed without a new functions version: bump \
             functions_version! (schema/mod.rs) and pin the new hashes"
        );
    }

    /// The coordinator's own functions on Citus are made once per database
    /// (`schema::citus::make_once`), not replaced by each server's start: their texts are
    /// pinned here. To change one, give the changed function a new name (and its callers),
    /// and keep the old one while a release that calls it may run.
    #[test]
    fn the_coordinators_functions_are_pinned_and_name_what_they_make() {
        let have: Vec<u64> = schema::citus::COORDINATOR_FUNCTIONS
            .iter()
            .map(|(text, _)| fnv(text))
            .collect();
        assert_eq!(
            have,
            [
                15309982502527310284,
                11308260598857997530,
                17950248103342523739
            ],
            "a coordinator function's text changed: give the changed function a new name"
        );
        for (text, signatures) in schema::citus::COORDINATOR_FUNCTIONS {
            let made = text.matches("FUNCTION comb.").count();
            assert_eq!(made, signatures.len(), "{signatures:?}");
            for sig in *signatures {
                let name = sig.split('(').next().unwrap();
                assert!(text.contains(&format!("FUNCTION {name}(")), "{sig}");
            }
        }
    }

    /// Each function is named in its set's version, and its text makes that name, never
    /// replacing one.
    #[test]
    fn every_function_is_made_under_its_versioned_name_and_never_replaced() {
        let suffix = format!("_v{}", schema::FUNCTIONS_VERSION);
        for (name, text) in functions() {
            let bare = name.split('(').next().unwrap();
            assert!(bare.ends_with(&suffix), "{name}");
            assert!(
                text.contains(&format!("FUNCTION {bare}(")),
                "{name}: {text}"
            );
            assert!(!text.contains("OR REPLACE"), "{name}");
        }
    }
}
