//! Maintenance modes, shared by every server on the database: while `push` is on, pushes are
//! answered 503 with `Retry-After` (nothing is accepted, so nothing is lost); while `pop` is
//! on, pops answer 204 at once.
//!
//! The modes are rows of `comb.system_modes`. Each server keeps them in memory and reads them
//! again, in the background, once they are a second old, so a change made through any server
//! reaches every server within about a second and requests never wait for the read (only
//! the very first one does, before anything was read).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use deadpool_postgres::Pool;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::code::Code;
use crate::db::DbError;
use crate::refusal::{Kind, Refusal};

/// How long a server trusts the modes it read.
pub const TTL: Duration = Duration::from_secs(1);

/// Which traffic a mode holds back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Push,
    Pop,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Push => "push",
            Mode::Pop => "pop",
        }
    }
}

/// This server's copy of the modes.
pub struct Modes {
    start: Instant,
    /// Milliseconds since `start` of the last read; 0 before the first.
    read_at: AtomicU64,
    refreshing: AtomicBool,
    push: AtomicBool,
    pop: AtomicBool,
}

impl Default for Modes {
    fn default() -> Modes {
        Modes {
            start: Instant::now(),
            read_at: AtomicU64::new(0),
            refreshing: AtomicBool::new(false),
            push: AtomicBool::new(false),
            pop: AtomicBool::new(false),
        }
    }
}

impl Modes {
    fn flag(&self, mode: Mode) -> &AtomicBool {
        match mode {
            Mode::Push => &self.push,
            Mode::Pop => &self.pop,
        }
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64 + 1
    }

    /// Whether `mode` is on, as this server last read it; reads again in the background when
    /// the copy is older than [`TTL`] (and waits only for the first read).
    pub async fn is_on(self: &Arc<Self>, pool: &Pool, mode: Mode) -> bool {
        let read_at = self.read_at.load(Ordering::Acquire);
        if read_at == 0 {
            if let Err(e) = self.refresh(pool).await {
                tracing::debug!(error = %e, "maintenance modes unread");
            }
        } else if self.now_ms().saturating_sub(read_at) > TTL.as_millis() as u64
            && !self.refreshing.swap(true, Ordering::AcqRel)
        {
            let (me, pool) = (self.clone(), pool.clone());
            tokio::spawn(async move {
                if let Err(e) = me.refresh(&pool).await {
                    tracing::debug!(error = %e, "maintenance modes unread");
                }
                me.refreshing.store(false, Ordering::Release);
            });
        }
        self.flag(mode).load(Ordering::Acquire)
    }

    /// Refuses pushes while push maintenance mode is on (503 with `Retry-After` at the edge):
    /// nothing is stored, so producers retry later and nothing is lost.
    pub async fn admit_push(self: &Arc<Self>, pool: &Pool) -> Result<(), Refusal> {
        if self.is_on(pool, Mode::Push).await {
            return Err(Refusal::new(
                Kind::Unavailable,
                Code::MaintenanceMode,
                "pushes are paused by maintenance mode; retry later",
            ));
        }
        Ok(())
    }

    async fn refresh(&self, pool: &Pool) -> Result<(), DbError> {
        let client = pool.get().await?;
        let rows = client
            .query("SELECT mode, enabled FROM comb.system_modes", &[])
            .await?;
        let (mut push, mut pop) = (false, false);
        for r in rows {
            match r.get::<_, &str>("mode") {
                "push" => push = r.get("enabled"),
                "pop" => pop = r.get("enabled"),
                _ => {}
            }
        }
        self.push.store(push, Ordering::Release);
        self.pop.store(pop, Ordering::Release);
        self.read_at.store(self.now_ms(), Ordering::Release);
        Ok(())
    }

    /// Turns a mode on or off for every server; this one knows at once. The time of the change
    /// is taken in `VALUES` and the update copies the row it would have inserted: Citus, where
    /// `comb.system_modes` is a reference table, refuses any function but an immutable one in
    /// `DO UPDATE SET` (`now()` there answered every change with 500).
    pub async fn set(&self, pool: &Pool, mode: Mode, enabled: bool) -> Result<ModeState, DbError> {
        let client = pool.get().await?;
        client
            .execute(
                "INSERT INTO comb.system_modes (mode, enabled, changed_at) VALUES ($1, $2, now())
                 ON CONFLICT (mode) DO UPDATE
                 SET enabled = excluded.enabled, changed_at = excluded.changed_at",
                &[&mode.name(), &enabled],
            )
            .await?;
        self.flag(mode).store(enabled, Ordering::Release);
        self.get(pool, mode).await
    }

    /// A mode as stored, in Queen's shape.
    pub async fn get(&self, pool: &Pool, mode: Mode) -> Result<ModeState, DbError> {
        let client = pool.get().await?;
        let row = client
            .query_opt(
                "SELECT enabled, changed_at FROM comb.system_modes WHERE mode = $1",
                &[&mode.name()],
            )
            .await?;
        let (enabled, changed_at): (bool, Option<DateTime<Utc>>) =
            row.map_or((false, None), |r| (r.get("enabled"), r.get("changed_at")));
        self.flag(mode).store(enabled, Ordering::Release);
        let what = match mode {
            Mode::Push => "pushes are answered 503 with Retry-After",
            Mode::Pop => "pops answer 204 without messages",
        };
        Ok(ModeState {
            maintenance_mode: enabled,
            enabled,
            mode: mode.name().to_string(),
            changed_at,
            effect: if enabled { what } else { "none" }.to_string(),
        })
    }
}

/// A maintenance mode as stored, in Queen's shape.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ModeState {
    /// Same as `enabled`, as Queen names it.
    pub maintenance_mode: bool,
    pub enabled: bool,
    /// `push` or `pop`.
    pub mode: String,
    #[serde(serialize_with = "super::wire::iso_opt")]
    pub changed_at: Option<DateTime<Utc>>,
    /// What the mode does to requests while on.
    pub effect: String,
}
