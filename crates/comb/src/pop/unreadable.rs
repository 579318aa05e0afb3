//! Messages a claim read but could not open: a payload sealed with a key this server does not
//! have (a key rotation gone wrong), or bytes that are no longer JSON. They are never handed
//! out and never consumed unseen: each goes to its group's dead letters with the reason
//! (`payload_unreadable`), settled as an ack with status `dlq` would settle it, and the rest
//! of the batch is delivered in order. Requeued once the key is back, it is delivered again.

use std::collections::HashMap;

use uuid::Uuid;

use crate::ack::{AckStatus, WriteStatements, write_back};
use crate::backend::Backend;
use crate::catalog::CURSOR_STATE;
use crate::cursor::{LOCK, locked_cursors};
use crate::db::{DbError, Pipelined, Prepared};
use crate::dead_letter::NewDeadLetter;
use crate::encryption::OpenError;

/// The queue and group whose claim read the messages.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Claimant<'a> {
    pub(crate) queue_id: Uuid,
    pub(crate) group: &'a str,
}

/// A message a claim handed out nothing of.
#[derive(Debug)]
pub(crate) struct Unreadable {
    pub(crate) partition_id: Uuid,
    pub(crate) pos: i64,
    /// The attempt it would have been (1 + failed attempts).
    pub(crate) attempt: i32,
    /// The lease the claim took on its partition; `None` with auto-ack.
    pub(crate) lease_id: Option<Uuid>,
    pub(crate) why: OpenError,
}

/// The reason stored with the dead letter (its `errorMessage`).
fn reason(why: &OpenError) -> &'static str {
    match why {
        OpenError::NoKey => {
            "payload_unreadable: sealed with a key this server does not have; requeue it once the key is configured (COMB_ENCRYPTION_KEY or COMB_ENCRYPTION_KEY_OLD)"
        }
        OpenError::NotJson => "payload_unreadable: the stored payload is not valid JSON",
    }
}

/// Dead-letters `unreadable` and settles them in their cursors (under the claim's lease; an
/// auto-ack claim has already moved past them). Inside the claim's transaction, which holds
/// the cursors' locks; or, with `alone`, in a transaction of its own (the claim has
/// committed), which locks them first. Returns how many were dead-lettered.
pub(crate) async fn settle(
    client: &deadpool_postgres::Client,
    backend: Backend,
    shape: Claimant<'_>,
    unreadable: &[Unreadable],
    alone: bool,
) -> Result<u64, DbError> {
    let writes = WriteStatements::prepare(client, backend).await?;
    let state = client.prepare_cached(backend.sql(&CURSOR_STATE)).await?;
    let lock = client.prepare_cached(backend.sql(&LOCK)).await?;
    let p = Pipelined::on(client);
    if !alone {
        return settle_in(&p, backend, shape, unreadable, &state, &writes).await;
    }
    p.begin().await?;
    let pids: Vec<Uuid> = unreadable.iter().map(|u| u.partition_id).collect();
    let groups: Vec<&str> = unreadable.iter().map(|_| shape.group).collect();
    let done = match p.query(&lock, &[&pids, &groups]).await {
        Ok(_) => settle_in(&p, backend, shape, unreadable, &state, &writes).await,
        Err(e) => Err(e.into()),
    };
    match done {
        Ok(n) => {
            p.commit().await?;
            Ok(n)
        }
        Err(e) => {
            p.roll_back().await;
            Err(e)
        }
    }
}

async fn settle_in(
    client: &Pipelined<'_>,
    backend: Backend,
    shape: Claimant<'_>,
    unreadable: &[Unreadable],
    state: &tokio_postgres::Statement,
    writes: &WriteStatements,
) -> Result<u64, DbError> {
    let mut dead = Vec::new();
    let mut leased: HashMap<Uuid, Vec<&Unreadable>> = HashMap::new();
    for u in unreadable {
        match u.lease_id {
            Some(_) => leased.entry(u.partition_id).or_default().push(u),
            // Auto-ack: the claim's own version already moved the position past it.
            None => dead.push(dead_letter(shape, u, u.attempt - 1)),
        }
    }
    let pids: Vec<Uuid> = leased.keys().copied().collect();
    let groups: Vec<&str> = pids.iter().map(|_| shape.group).collect();
    let rows = if pids.is_empty() {
        Vec::new()
    } else if !backend.statements_span_partitions() {
        // On Citus, a partition at a time, each read on its partition's worker.
        let mut rows = Vec::new();
        for p in &pids {
            rows.extend(
                client
                    .query(state, &[&vec![*p], &vec![shape.group], p])
                    .await?,
            );
        }
        rows
    } else {
        client.query(state, &[&pids, &groups]).await?
    };
    let mut cursors = locked_cursors(&rows);
    for ((partition_id, _), locked) in cursors.iter_mut() {
        let Some(these) = leased.get(partition_id) else {
            continue;
        };
        locked.cursor.begin_request();
        for u in these {
            let seg = locked.cursor.cursor_seg;
            // Refused only if the lease is no longer the claim's: then its end hands the
            // message out again, counted as any other attempt.
            let Ok(applied) = locked.cursor.apply(
                u.pos,
                seg,
                AckStatus::Dlq,
                u.lease_id,
                &locked.options,
                false,
            ) else {
                continue;
            };
            locked.changed = true;
            if let Some(attempts) = applied.dead_letter {
                dead.push(dead_letter(shape, u, attempts));
            }
        }
    }
    write_back(client, writes, &cursors, &dead).await?;
    Ok(dead.len() as u64)
}

fn dead_letter(shape: Claimant<'_>, u: &Unreadable, attempts: i32) -> NewDeadLetter {
    NewDeadLetter {
        queue_id: shape.queue_id,
        partition_id: u.partition_id,
        group: shape.group.to_string(),
        pos: u.pos,
        attempts,
        error: Some(reason(&u.why).to_string()),
    }
}
