//! Wake-ups for waiting pops: a push wakes the pops waiting on its queue on this server at once,
//! and, through PostgreSQL notifications, on every other server.
//!
//! Notifications are sent after the push committed, coalesced: at most one `NOTIFY` per
//! [`BROADCAST_EVERY`] per server, naming every queue pushed meanwhile. Sending them inside
//! the push transaction would be simpler and is what serialises Postgres queues: `NOTIFY`
//! takes a cluster-wide lock that is held through the commit's WAL flush, so no two pushing
//! transactions could ever share a flush.
//!
//! Each queue name has a version counter. A pop reads the version before it looks in the
//! database and, if it found nothing, waits for the version to change; a push that commits
//! between the look and the wait has already bumped the version, so no wake-up is lost.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::watch;
use tokio_postgres::AsyncMessage;

/// Channel push notifications are sent on.
pub(crate) const NOTIFY_CHANNEL: &str = "comb_push";

/// Channel on which servers tell each other that catalog entries changed (a queue deleted).
pub(crate) const CATALOG_CHANNEL: &str = "comb_catalog";

/// Tells every server, when `tx` commits, that `queue` was deleted: they forget its ids.
pub(crate) async fn announce_queue_deleted(
    tx: &deadpool_postgres::Transaction<'_>,
    queue: &str,
) -> Result<(), tokio_postgres::Error> {
    tx.execute("SELECT pg_notify($1, $2)", &[&CATALOG_CHANNEL, &queue])
        .await
        .map(|_| ())
}

/// What the relay tells the catalog: ids it holds may be stale.
pub(crate) enum Stale<'a> {
    /// This queue was deleted through some server.
    Queue(&'a str),
    /// Notifications may have been missed (the relay reconnected): trust no cached id.
    All,
}

/// Called by the relay with each catalog change; the catalog forgets what it names.
pub(crate) type OnStale = Arc<dyn Fn(Stale<'_>) + Send + Sync>;

/// Longest a push waits before other servers hear of it (besides the send itself).
pub(crate) const BROADCAST_EVERY: Duration = Duration::from_millis(10);

/// Largest notification payload PostgreSQL accepts is 8000 bytes; beyond this, wake all.
const NOTIFY_MAX: usize = 7_900;

/// The wake-up registry of one server.
#[derive(Default)]
pub(crate) struct Wake {
    queues: Mutex<HashMap<String, watch::Sender<u64>>>,
    /// Queue names to announce to other servers (see [`broadcast`]).
    outbox: std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<String>>,
}

impl Wake {
    /// A receiver whose `changed()` fires on the next push to `queue`.
    pub(crate) fn listen(&self, queue: &str) -> watch::Receiver<u64> {
        let mut map = self.queues.lock().expect("wake registry poisoned");
        let tx = map
            .entry(queue.to_string())
            .or_insert_with(|| watch::channel(0).0);
        let mut rx = tx.subscribe();
        rx.mark_unchanged();
        rx
    }

    /// A push to `queue` committed: wake its pops here now, and on other servers soon.
    pub(crate) fn pushed(&self, queue: &str) {
        self.notify(queue);
        if let Some(outbox) = self.outbox.get() {
            let _ = outbox.send(queue.to_string());
        }
    }

    /// Wakes every pop waiting on `queue`. Cheap when nobody waits.
    pub(crate) fn notify(&self, queue: &str) {
        let mut map = self.queues.lock().expect("wake registry poisoned");
        if let Some(tx) = map.get(queue) {
            if tx.receiver_count() == 0 {
                map.remove(queue);
            } else {
                tx.send_modify(|v| *v += 1);
            }
        }
    }

    /// Wakes every waiting pop (used at shutdown so that they answer at once).
    pub(crate) fn notify_all(&self) {
        let map = self.queues.lock().expect("wake registry poisoned");
        for tx in map.values() {
            tx.send_modify(|v| *v += 1);
        }
    }
}

/// Announces pushed queues to other servers: one `NOTIFY` per [`BROADCAST_EVERY`] at most,
/// outside any push transaction. A failed send is not retried: the waiting pops elsewhere
/// fall back to re-checking on their own timer.
pub(crate) fn start_broadcast(wake: &Wake, pool: deadpool_postgres::Pool) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    if wake.outbox.set(tx).is_err() {
        return;
    }
    tokio::spawn(async move {
        let mut names: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
        while let Some(first) = rx.recv().await {
            names.insert(first);
            tokio::time::sleep(BROADCAST_EVERY).await;
            while let Ok(more) = rx.try_recv() {
                names.insert(more);
            }
            let joined = names
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join("\n");
            let payload = if joined.len() > NOTIFY_MAX {
                "*".to_string()
            } else {
                joined
            };
            names.clear();
            match pool.get().await {
                Ok(client) => {
                    if let Err(e) = client
                        .execute("SELECT pg_notify($1, $2)", &[&NOTIFY_CHANNEL, &payload])
                        .await
                    {
                        tracing::debug!(error = %e, "push notification not sent");
                    }
                }
                Err(e) => tracing::debug!(error = %e, "push notification not sent"),
            }
        }
    });
}

/// Forwards push notifications from the database to this server's waiting pops, for pushes
/// made through other servers. Reconnects forever; while disconnected, waiting pops fall back
/// to re-checking on their own timer, so a lost connection delays but never loses a message.
///
/// The same connection carries catalog changes (a queue deleted through another server), so
/// that this server forgets ids that no longer exist.
pub(crate) async fn relay(database_url: String, wake: Arc<Wake>, on_stale: OnStale) {
    loop {
        if let Err(e) = relay_once(&database_url, &wake, &on_stale).await {
            tracing::warn!(error = %e, "push notification relay lost its connection; reconnecting");
        }
        // Whatever was missed while disconnected: let every waiting pop look again, and
        // trust no cached id.
        wake.notify_all();
        on_stale(Stale::All);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn relay_once(
    database_url: &str,
    wake: &Wake,
    on_stale: &OnStale,
) -> Result<(), tokio_postgres::Error> {
    let (client, mut conn) = tokio_postgres::connect(database_url, tokio_postgres::NoTls).await?;
    let messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
    futures_util::pin_mut!(messages);
    let sql = format!("LISTEN {NOTIFY_CHANNEL}; LISTEN {CATALOG_CHANNEL}");
    let listen = client.batch_execute(&sql);
    futures_util::pin_mut!(listen);
    // Drive the connection while LISTEN completes, then forward notifications.
    loop {
        tokio::select! {
            r = &mut listen => { r?; break; }
            m = messages.next() => match m {
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e),
                None => return Ok(()),
            },
        }
    }
    tracing::debug!("listening for pushes made through other servers");
    while let Some(m) = messages.next().await {
        if let AsyncMessage::Notification(n) = m? {
            if n.channel() == CATALOG_CHANNEL {
                on_stale(Stale::Queue(n.payload()));
            } else if n.payload() == "*" {
                wake.notify_all();
            } else {
                for queue in n.payload().split('\n') {
                    wake.notify(queue);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_push_after_listen_is_not_lost() {
        let wake = Wake::default();
        let mut rx = wake.listen("q");
        wake.notify("q");
        tokio::time::timeout(Duration::from_secs(1), rx.changed())
            .await
            .expect("woken")
            .unwrap();
    }

    #[tokio::test]
    async fn other_queues_do_not_wake() {
        let wake = Wake::default();
        let mut rx = wake.listen("q");
        wake.notify("other");
        assert!(
            tokio::time::timeout(Duration::from_millis(50), rx.changed())
                .await
                .is_err()
        );
    }
}
