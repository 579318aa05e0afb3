//! The servers running on this database (`comb.servers`): each registers itself at start,
//! beats every [`HEARTBEAT`] and leaves when it stops; the maintenance leader forgets one that
//! missed [`MISSED_BEATS`] beats (a crash, a frozen host). Operators read it
//! (`GET /api/v1/system/servers`, the dashboard's "Servers connected"), and the schema reads
//! it before dropping a set of data-path functions: never one a registered server calls.
//!
//! A beat is an `UPDATE` of the server's own row: a handful of rows, written every few
//! seconds, off the data path.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_postgres::Client;
use uuid::Uuid;

/// How often a server beats.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(5);

/// Beats a server may miss before it is forgotten.
pub(crate) const MISSED_BEATS: u32 = 3;

/// A server as it registers itself.
#[derive(Debug, Clone)]
pub(crate) struct Registration {
    pub(crate) id: Uuid,
    /// The machine's name.
    pub(crate) host: String,
    /// The address it serves on.
    pub(crate) listen: String,
    pub(crate) pid: i32,
}

impl Registration {
    /// This process, serving on `listen`.
    pub(crate) fn of_this_process(listen: &str) -> Registration {
        let host = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .map(|h| h.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".to_string());
        Registration {
            id: Uuid::now_v7(),
            host,
            listen: listen.to_string(),
            pid: std::process::id() as i32,
        }
    }
}

/// A registered server, as the registry holds it.
#[derive(Debug, Clone)]
pub(crate) struct Registered {
    pub(crate) id: Uuid,
    pub(crate) host: String,
    pub(crate) listen: String,
    pub(crate) pid: i32,
    pub(crate) version: String,
    pub(crate) functions_version: i32,
    pub(crate) schema_version: i32,
    pub(crate) started_at: DateTime<Utc>,
    pub(crate) heartbeat_at: DateTime<Utc>,
}

/// Registers `me` (or beats, when registered already). True when the row was made now: at
/// start, or after the leader forgot this server (it missed its beats), in which case the
/// functions it calls may have been dropped and must be made again.
pub(crate) async fn beat(
    client: &Client,
    me: &Registration,
) -> Result<bool, tokio_postgres::Error> {
    let row = client
        .query_one(
            "INSERT INTO comb.servers (id, host, listen, pid, version, functions_version,
                                       schema_version)
             VALUES ($1, $2, $3, $4, $5, $6, $7)
             ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()
             RETURNING xmax = 0",
            &[
                &me.id,
                &me.host,
                &me.listen,
                &me.pid,
                &super::SERVER_VERSION,
                &super::FUNCTIONS_VERSION,
                &super::latest_version(),
            ],
        )
        .await?;
    Ok(row.get(0))
}

/// Takes `id` off the registry: a server stopping.
pub(crate) async fn leave(client: &Client, id: Uuid) -> Result<(), tokio_postgres::Error> {
    client
        .execute("DELETE FROM comb.servers WHERE id = $1", &[&id])
        .await
        .map(|_| ())
}

/// Forgets the servers that missed [`MISSED_BEATS`] beats; returns how many.
pub(crate) async fn forget_silent(client: &Client) -> Result<u64, tokio_postgres::Error> {
    let silent = (HEARTBEAT * MISSED_BEATS).as_secs_f64();
    client
        .execute(
            "DELETE FROM comb.servers
             WHERE heartbeat_at < now() - make_interval(secs => $1)",
            &[&silent],
        )
        .await
}

/// Every registered server, oldest first.
pub(crate) async fn list(client: &Client) -> Result<Vec<Registered>, tokio_postgres::Error> {
    Ok(client
        .query(
            "SELECT id, host, listen, pid, version, functions_version, schema_version,
                    started_at, heartbeat_at
             FROM comb.servers ORDER BY started_at, id LIMIT 1000",
            &[],
        )
        .await?
        .iter()
        .map(|r| Registered {
            id: r.get("id"),
            host: r.get("host"),
            listen: r.get("listen"),
            pid: r.get("pid"),
            version: r.get("version"),
            functions_version: r.get("functions_version"),
            schema_version: r.get("schema_version"),
            started_at: r.get("started_at"),
            heartbeat_at: r.get("heartbeat_at"),
        })
        .collect())
}
