//! `GET /api/v1/system/servers`: the servers running on this database, as they registered
//! themselves (`schema::servers`), with their release and the set of data-path functions each
//! calls: what a rolling upgrade has reached.

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::Refusal;
use super::wire::iso;

/// `GET /api/v1/system/servers`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub(crate) struct ServerList {
    /// Oldest start first.
    pub servers: Vec<RegisteredServer>,
}

/// One server, as it registered itself and last beat.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RegisteredServer {
    pub id: Uuid,
    /// The machine's name.
    pub host: String,
    /// The address it serves on.
    pub listen: String,
    pub pid: i32,
    /// Its release (`comb --version`).
    pub version: String,
    /// The set of data-path functions it calls (`comb.store_batch_v4`: 4).
    pub functions_version: i32,
    /// The newest schema version it knows.
    pub schema_version: i32,
    #[serde(serialize_with = "iso")]
    pub started_at: DateTime<Utc>,
    /// Its last beat; one that misses three (15 s) is forgotten.
    #[serde(serialize_with = "iso")]
    pub heartbeat_at: DateTime<Utc>,
}

/// Every registered server.
pub async fn list(pool: &Pool) -> Result<ServerList, Refusal> {
    let client = pool.get().await?;
    let servers = crate::schema::servers::list(&client)
        .await?
        .into_iter()
        .map(|s| RegisteredServer {
            id: s.id,
            host: s.host,
            listen: s.listen,
            pid: s.pid,
            version: s.version,
            functions_version: s.functions_version,
            schema_version: s.schema_version,
            started_at: s.started_at,
            heartbeat_at: s.heartbeat_at,
        })
        .collect();
    Ok(ServerList { servers })
}
