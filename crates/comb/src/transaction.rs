//! Transactions: acks and pushes committed together, or not at all.
//!
//! This is what makes exactly-once pipelines possible: a consumer acks what it read and pushes
//! what it produced in one PostgreSQL transaction. Every ack must be under the live lease of
//! its partition (named or not); one refused ack fails the whole transaction.

use std::sync::Arc;

use bytes::Bytes;
use deadpool_postgres::Pool;
use uuid::Uuid;

use crate::ack::{AckItem, AckOutcome, AckStatus, Acker, settle_in};
use crate::code::Code;
use crate::db::DbError;
use crate::push::{Item, NewMessage, Pusher, Stored, store_in};
use crate::refusal::Refusal;
use crate::wake::Wake;

/// What a committed transaction did: each ack's outcome, and the messages pushed with what
/// became of each, in the order they were given.
pub(crate) struct Committed {
    pub(crate) acks: Vec<AckOutcome>,
    pub(crate) messages: Vec<NewMessage>,
    pub(crate) stored: Vec<Stored>,
}

/// The handle of the transaction use case.
pub(crate) struct Transactions {
    pool: Pool,
    /// On Citus's direct route, a transaction whose partitions one worker holds runs there.
    router: crate::db::route::Router,
    pusher: Arc<Pusher>,
    acker: Arc<Acker>,
    wake: Arc<Wake>,
}

impl Transactions {
    /// A handle running transactions on `pool`, pushing and acking as the other routes do.
    pub(crate) fn new(
        pool: Pool,
        router: crate::db::route::Router,
        pusher: Arc<Pusher>,
        acker: Arc<Acker>,
        wake: Arc<Wake>,
    ) -> Transactions {
        Transactions {
            pool,
            router,
            pusher,
            acker,
            wake,
        }
    }

    /// Runs the acks, then the pushes, in one transaction; any refusal rolls everything back.
    /// `body` holds the bytes the pushed items were decoded from.
    pub(crate) async fn commit(
        &self,
        acks: &[AckItem],
        items: Vec<Item<'_>>,
        body: &Bytes,
        producer_sub: Option<Arc<str>>,
    ) -> Result<Committed, Refusal> {
        let messages = if items.is_empty() {
            Vec::new()
        } else {
            self.pusher.check_capacity(&items).await?;
            self.pusher.resolve(items, body, producer_sub).await?
        };
        let touched: Vec<Uuid> = acks
            .iter()
            .map(|a| a.partition_id)
            .chain(messages.iter().map(|m| m.partition_id))
            .collect();
        let pool = self.router.general_of_all(&self.pool, &touched).await;
        let mut client = pool.get().await.map_err(DbError::from)?;
        let tx = client.transaction().await.map_err(DbError::from)?;
        crate::catalog::enlist_workers(&tx, self.pusher.backend(), &touched).await?;
        let ack_refs: Vec<&AckItem> = acks.iter().collect();
        let outcomes = if acks.is_empty() {
            Vec::new()
        } else {
            settle_in(&tx, self.pusher.backend(), &ack_refs, true).await?
        };
        if let Some((i, refusal)) = outcomes
            .iter()
            .enumerate()
            .find_map(|(i, o)| o.result.err().map(|r| (i, r)))
        {
            // Dropping the transaction rolls it back: nothing of this request happened.
            return Err(refusal.refusal(&format!("ack {i}: ")));
        }
        let msg_refs: Vec<&NewMessage> = messages.iter().collect();
        let stored = if messages.is_empty() {
            Vec::new()
        } else {
            store_in(&tx, self.pusher.backend(), &msg_refs).await?
        };
        if let Some(i) = stored.iter().position(|s| *s == Stored::PartitionGone) {
            self.pusher.forget_queue(&messages[i].queue);
            return Err(Refusal::conflict(
                Code::QueueDeleted,
                format!(
                    "queue `{}` was deleted while the transaction was in flight; retry it",
                    messages[i].queue
                ),
            ));
        }
        tx.commit().await.map_err(DbError::from)?;
        let acked: Vec<(Uuid, String, AckStatus)> = acks
            .iter()
            .map(|a| (a.partition_id, a.group.to_string(), a.status))
            .collect();
        self.acker.record(&acked, &outcomes);
        self.pusher.record(&messages, &stored);
        crate::push::announce(&self.wake, messages.iter());
        Ok(Committed {
            acks: outcomes,
            messages,
            stored,
        })
    }
}
