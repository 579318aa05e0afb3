//! Wake-ups for waiting pops: a push wakes the pops waiting on its queue on this server at once,
//! and, through PostgreSQL notifications, on every other server.
//!
//! Notifications are sent after the push committed, coalesced: at most one `NOTIFY` per
//! [`BROADCAST_EVERY`] per server, naming every queue pushed meanwhile. Sending them inside
//! the push transaction would be simpler and is what serialises Postgres queues: `NOTIFY`
//! takes a cluster-wide lock that is held through the commit's WAL flush, so no two pushing
//! transactions could ever share a flush. A server alone on its database sends none: the
//! statement notifies only while another server's relay is connected ([`BROADCAST_SQL`]).
//!
//! Pops of a group that wait ([`Ready`]) are woken one at a time, and learn which partitions
//! were pushed: a push hands each of its partitions to the groups that wait on its queue here
//! and wakes one waiting pop per partition, which claims that partition alone instead of
//! walking the group's cursors. Everything the hints do not cover (pushes through other
//! servers, whose notifications name only queues) marks the group's last empty walk stale,
//! so the next pop walks again. Hints are only hints: the claim reads the truth.
//!
//! Pops of a named partition wait on a version counter per queue name: a pop reads it before
//! it looks in the database and, if it found nothing, waits for it to change; a push that
//! commits between the look and the wait has already bumped it, so no wake-up is lost.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::sync::{Notify, watch};
use tokio_postgres::AsyncMessage;
use uuid::Uuid;

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

/// Sends a push notification (`$1` channel, `$2` payload) only if a relay of another server
/// (`application_name` like `$4`, [`RELAY_NAME`] and an origin, other than `$3`) is connected
/// to this database. Alone, the statement commits nothing: no commit record, no flush, no listener
/// woken. No wake-up is lost to the check: a relay that connects after it listens after this
/// server's push committed, and its server's pops look again once it listens.
const BROADCAST_SQL: &str = "
SELECT pg_notify($1, $2) FROM pg_stat_activity a
WHERE a.datname = current_database() AND a.application_name LIKE $4
  AND a.application_name <> $3
LIMIT 1";

/// The `application_name` of a relay's connection: this prefix, then its server's origin.
const RELAY_NAME: &str = "comb relay";

/// The `application_name` of the relay of the server of `origin`.
fn relay_name(origin: Uuid) -> String {
    format!("{RELAY_NAME} {origin}")
}

/// Largest notification payload PostgreSQL accepts is 8000 bytes; beyond this, wake all.
const NOTIFY_MAX: usize = 7_900;

/// Most partitions a group's hints hold; beyond, they are dropped and the group walks again.
const READY_MAX: usize = 4_096;

/// Why a group's next pop walks its cursors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WalkDue {
    /// Something the hints do not name changed (or the group never walked).
    Changed,
    /// Only the fallback timer: the last empty walk is older than the poll fallback.
    Aged,
}

/// What the waiting pops of one (queue, group) on this server know between claims.
#[derive(Default)]
pub(crate) struct Ready {
    state: Mutex<ReadyState>,
    /// Wakes one waiting pop per hint (or per unhinted change).
    notify: Notify,
}

#[derive(Default)]
struct ReadyState {
    /// Partitions pushed into (or whose lease ended) since a pop last took them, oldest first.
    hints: VecDeque<Uuid>,
    hinted: HashSet<Uuid>,
    /// Partitions that may hold messages behind a lease (a claim of them found nothing, or
    /// handed out a full batch): the end of that lease hands them out again.
    /// Each with the mark of the claim that last set it.
    blocked: HashMap<Uuid, u64>,
    marks: u64,
    /// Counts changes the hints do not name; a walk that found nothing at `changes == n`
    /// sets `clean_at = Some((n, when))`.
    changes: u64,
    clean_at: Option<(u64, Instant)>,
}

impl Ready {
    /// The waiting pop that [`Ready::notify`] will wake: enable it before looking, so that a
    /// hint given after the look still wakes it.
    pub(crate) fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// Takes the oldest hinted partition.
    pub(crate) fn take_one(&self) -> Option<Uuid> {
        let mut st = self.state.lock().expect("ready hints poisoned");
        let p = st.hints.pop_front()?;
        st.hinted.remove(&p);
        Some(p)
    }

    /// Takes up to `n` hinted partitions, oldest first.
    #[cfg(test)]
    fn take(&self, n: usize) -> Vec<Uuid> {
        let mut st = self.state.lock().expect("ready hints poisoned");
        let k = n.min(st.hints.len());
        let taken: Vec<Uuid> = st.hints.drain(..k).collect();
        for p in &taken {
            st.hinted.remove(p);
        }
        taken
    }

    /// A claim of `partition` begins (or handed out a full batch): until it succeeds, the
    /// partition may hold messages behind a lease, so the lease's end must hint it.
    /// Returns the mark to give [`Ready::unblocked`].
    pub(crate) fn may_be_blocked(&self, partition: Uuid) -> u64 {
        let mut st = self.state.lock().expect("ready hints poisoned");
        if st.blocked.len() >= READY_MAX {
            st.blocked.clear();
            st.changes += 1;
        }
        st.marks += 1;
        let mark = st.marks;
        st.blocked.insert(partition, mark);
        mark
    }

    /// The claim that set `mark` on `partition` handed out all it held (less than a batch),
    /// and no claim marked it since: nothing waits behind its lease.
    pub(crate) fn unblocked(&self, partition: Uuid, mark: u64) {
        let mut st = self.state.lock().expect("ready hints poisoned");
        if st.blocked.get(&partition) == Some(&mark) {
            st.blocked.remove(&partition);
        }
    }

    /// Hints `partition` again: it handed out a full batch without a lease (auto-ack), so
    /// more may be there now.
    pub(crate) fn again(&self, partition: Uuid) {
        self.hint(&[partition]);
    }

    /// A mark to give [`Ready::walked_empty`] once a walk that starts now found nothing.
    pub(crate) fn mark(&self) -> u64 {
        self.state.lock().expect("ready hints poisoned").changes
    }

    /// A walk begun at `mark` found nothing: until something unhinted changes, only hinted
    /// partitions can have messages to claim (as far as this server can know).
    pub(crate) fn walked_empty(&self, mark: u64) {
        self.state.lock().expect("ready hints poisoned").clean_at = Some((mark, Instant::now()));
    }

    /// Whether a walk could find something the hints do not name, and why: something
    /// unhinted changed since the last empty walk, or it is older than `max_age` (leases end,
    /// delayed messages come due and other servers' acks release partitions without a word
    /// here).
    pub(crate) fn walk_due(&self, max_age: Duration) -> Option<WalkDue> {
        let st = self.state.lock().expect("ready hints poisoned");
        match st.clean_at {
            Some((n, _)) if n != st.changes => Some(WalkDue::Changed),
            Some((_, at)) if at.elapsed() >= max_age => Some(WalkDue::Aged),
            Some(_) => None,
            None => Some(WalkDue::Changed),
        }
    }

    /// [`Ready::walk_due`], or [`WalkDue::Aged`] when nothing else is due but this pop's own
    /// fallback timer fired (`timer_fired`). A change the hints do not name outranks the timer:
    /// a walk for it must not count as empty just because it found a hinted partition first.
    pub(crate) fn walk_due_or_timer(
        &self,
        max_age: Duration,
        timer_fired: bool,
    ) -> Option<WalkDue> {
        self.walk_due(max_age)
            .or(timer_fired.then_some(WalkDue::Aged))
    }

    /// A walk due to age only ([`WalkDue::Aged`]), begun at `mark`, claimed `partitions`, and
    /// the hints named every one of them: it found nothing they did not already name, so it
    /// counts as an empty walk. Without this, under a steady trickle of pushes every walk finds
    /// the partition just pushed, and the group's pops walk all its cursors on every claim
    /// instead of claiming the hinted partition alone.
    pub(crate) fn walked_hinted(&self, mark: u64, partitions: &[Uuid]) {
        let mut st = self.state.lock().expect("ready hints poisoned");
        if partitions.iter().all(|p| st.hinted.contains(p)) {
            st.clean_at = Some((mark, Instant::now()));
        }
    }

    /// Wakes one more waiting pop: a claim found messages, so there may be more, or hints are
    /// left that nobody is looking at.
    pub(crate) fn pass_on(&self) {
        self.notify.notify_one();
    }

    /// Whether hints are waiting for a pop.
    pub(crate) fn has_hints(&self) -> bool {
        !self
            .state
            .lock()
            .expect("ready hints poisoned")
            .hints
            .is_empty()
    }

    fn hint(&self, partitions: &[Uuid]) {
        let mut added = 0;
        {
            let mut st = self.state.lock().expect("ready hints poisoned");
            for &p in partitions {
                if st.hinted.len() >= READY_MAX {
                    st.hints.clear();
                    st.hinted.clear();
                    st.changes += 1;
                    added += 1;
                    break;
                }
                if st.hinted.insert(p) {
                    st.hints.push_back(p);
                    added += 1;
                }
            }
        }
        for _ in 0..added {
            self.notify.notify_one();
        }
    }

    fn changed(&self) {
        self.state.lock().expect("ready hints poisoned").changes += 1;
        self.notify.notify_one();
    }

    fn wake_all(&self) {
        self.state.lock().expect("ready hints poisoned").changes += 1;
        self.notify.notify_waiters();
    }
}

/// The wake-up registry of one server.
pub(crate) struct Wake {
    /// Names this server in the notifications it sends, so that its relay ignores them: its
    /// own pushes already woke its pops, with hints, and a notification would only make them
    /// walk.
    origin: Uuid,
    queues: Mutex<HashMap<String, watch::Sender<u64>>>,
    /// Per queue name, per group: the groups whose pops wait here.
    ready: Mutex<HashMap<String, HashMap<String, Arc<Ready>>>>,
    /// Queue names to announce to other servers (see [`broadcast`]).
    outbox: std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<String>>,
    /// Pops waiting here that a push may hand its messages to ([`Wake::offer`]).
    offers: Offers,
}

impl Default for Wake {
    fn default() -> Wake {
        Wake {
            origin: Uuid::new_v4(),
            queues: Mutex::default(),
            ready: Mutex::default(),
            outbox: std::sync::OnceLock::new(),
            offers: Offers::default(),
        }
    }
}

impl Wake {
    /// The hints and waiting pops of `group` on `queue`, held while the returned hold lives
    /// (made on first use: until a pop of the group has walked, it walks). The entry goes when
    /// its last hold goes and no partition of it waits for a lease to end, so names that no
    /// pop uses any more (a client trying random names) leave nothing behind.
    pub(crate) fn ready(&self, queue: &str, group: &str) -> ReadyHold<'_> {
        let mut map = self.ready.lock().expect("wake registry poisoned");
        let groups = map.entry(queue.to_string()).or_default();
        let ready = match groups.get(group) {
            Some(r) => r.clone(),
            None => {
                if groups.len() >= READY_MAX {
                    // Entries kept only for a lease's end (no pop holds them) are hints, and
                    // a group without its entry walks: drop them rather than grow.
                    groups.retain(|_, r| Arc::strong_count(r) > 1);
                }
                let r = Arc::new(Ready::default());
                groups.insert(group.to_string(), r.clone());
                r
            }
        };
        ReadyHold {
            wake: self,
            queue: queue.to_string(),
            group: group.to_string(),
            ready,
        }
    }

    /// Removes the entry of (`queue`, `group`) if nothing holds it (the registry's own
    /// reference aside) and nothing of it waits for a lease to end. Called with the map locked.
    fn tidy(
        map: &mut HashMap<String, HashMap<String, Arc<Ready>>>,
        queue: &str,
        group: &str,
        extra_refs: usize,
    ) {
        let Some(groups) = map.get_mut(queue) else {
            return;
        };
        let idle = groups.get(group).is_some_and(|r| {
            Arc::strong_count(r) <= 1 + extra_refs
                && r.state
                    .lock()
                    .expect("ready hints poisoned")
                    .blocked
                    .is_empty()
        });
        if idle {
            groups.remove(group);
            if groups.is_empty() {
                map.remove(queue);
            }
        }
    }

    /// Entries of the registries keyed by names clients send: (queue, group) hints and
    /// queues with pops of a named partition waiting. What `/metrics` reports, so that
    /// operators (and tests) see that they follow the pops that wait, not the names ever
    /// tried.
    pub(crate) fn sizes(&self) -> (usize, usize) {
        let groups = self
            .ready
            .lock()
            .expect("wake registry poisoned")
            .values()
            .map(HashMap::len)
            .sum();
        let queues = self.queues.lock().expect("wake registry poisoned").len();
        (groups, queues)
    }

    /// Entries of the hand-off registry: (queue, group) pairs with a pop offering itself.
    pub(crate) fn offer_entries(&self) -> usize {
        let map = self.offers.0.lock().expect("offers poisoned");
        map.values().map(HashMap::len).sum()
    }

    /// Lease of `group` on `partition` of `queue` ended here (an ack settled it). If messages
    /// came back (`returned`: a failed or retried ack) or may wait behind the lease (see
    /// [`Ready::may_be_blocked`]), one waiting pop claims the partition.
    pub(crate) fn released(&self, queue: &str, group: &str, partition: Uuid, returned: bool) {
        let r = {
            let map = self.ready.lock().expect("wake registry poisoned");
            map.get(queue).and_then(|g| g.get(group)).cloned()
        };
        if let Some(r) = r {
            let blocked = r
                .state
                .lock()
                .expect("ready hints poisoned")
                .blocked
                .remove(&partition)
                .is_some();
            if blocked || returned {
                r.hint(&[partition]);
            }
            // The entry stayed for this lease's end; with no pop holding it, it goes now.
            let mut map = self.ready.lock().expect("wake registry poisoned");
            Wake::tidy(&mut map, queue, group, 1);
        }
    }

    fn groups_of(&self, queue: &str) -> Vec<Arc<Ready>> {
        let map = self.ready.lock().expect("wake registry poisoned");
        map.get(queue)
            .map(|g| g.values().cloned().collect())
            .unwrap_or_default()
    }

    /// A receiver whose `changed()` fires on the next push to `queue`. The queue's entry goes
    /// when its last listener is dropped.
    pub(crate) fn listen(&self, queue: &str) -> Listening<'_> {
        let mut map = self.queues.lock().expect("wake registry poisoned");
        let tx = map
            .entry(queue.to_string())
            .or_insert_with(|| watch::channel(0).0);
        let mut rx = tx.subscribe();
        rx.mark_unchanged();
        Listening {
            wake: self,
            queue: queue.to_string(),
            rx,
        }
    }

    /// A push into `partitions` of `queue` committed: hand them to the groups waiting here
    /// (one woken pop per partition), wake pops of a named partition, and tell other servers
    /// soon.
    pub(crate) fn pushed(&self, queue: &str, partitions: &[Uuid]) {
        self.pushed_except(queue, partitions, &[]);
    }

    /// [`Wake::pushed`], except that `handed` (partition, group) pairs are not hinted to their
    /// group: the push handed all it stored there to a pop of that group ([`Wake::offer`]), so
    /// a hint would only send the group's next pop to claim a partition it holds.
    pub(crate) fn pushed_except(&self, queue: &str, partitions: &[Uuid], handed: &[(Uuid, &str)]) {
        if handed.is_empty() {
            for r in self.groups_of(queue) {
                r.hint(partitions);
            }
        } else {
            let groups: Vec<(String, Arc<Ready>)> = {
                let map = self.ready.lock().expect("wake registry poisoned");
                map.get(queue)
                    .map(|g| g.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                    .unwrap_or_default()
            };
            for (group, r) in groups {
                let left: Vec<Uuid> = partitions
                    .iter()
                    .copied()
                    .filter(|p| !handed.contains(&(*p, group.as_str())))
                    .collect();
                r.hint(&left);
            }
        }
        self.bump(queue);
        if let Some(outbox) = self.outbox.get() {
            let _ = outbox.send(queue.to_string());
        }
    }

    /// Messages of `queue` became deliverable here in partitions not named (dead letters
    /// stored again): each group's next pop walks, and other servers hear of it soon.
    pub(crate) fn requeued(&self, queue: &str) {
        self.notify(queue);
        if let Some(outbox) = self.outbox.get() {
            let _ = outbox.send(queue.to_string());
        }
    }

    /// Something changed in `queue` that names no partition (a push through another server):
    /// each group's next pop walks, and one waiting pop per group is woken to do it.
    pub(crate) fn notify(&self, queue: &str) {
        for r in self.groups_of(queue) {
            r.changed();
        }
        self.bump(queue);
    }

    /// Wakes every pop waiting on a named partition of `queue`. Cheap when nobody waits.
    fn bump(&self, queue: &str) {
        let mut map = self.queues.lock().expect("wake registry poisoned");
        if let Some(tx) = map.get(queue) {
            if tx.receiver_count() == 0 {
                map.remove(queue);
            } else {
                tx.send_modify(|v| *v += 1);
            }
        }
    }

    /// Wakes every waiting pop, each of which walks (at shutdown so that they answer at
    /// once; after notifications may have been missed).
    pub(crate) fn notify_all(&self) {
        {
            let map = self.queues.lock().expect("wake registry poisoned");
            for tx in map.values() {
                tx.send_modify(|v| *v += 1);
            }
        }
        let all: Vec<Arc<Ready>> = {
            let map = self.ready.lock().expect("wake registry poisoned");
            map.values().flat_map(|g| g.values().cloned()).collect()
        };
        for r in all {
            r.wake_all();
        }
    }
}

/// A message a push handed to a waiting pop, as stored: what the pop answers with.
#[derive(Debug, Clone)]
pub(crate) struct HandedMessage {
    pub(crate) pos: i64,
    pub(crate) message_id: Uuid,
    pub(crate) transaction_id: String,
    pub(crate) trace_id: Option<String>,
    pub(crate) producer_sub: Option<String>,
    /// The payload as stored (sealed in queues that encrypt): the pop opens it.
    pub(crate) payload: bytes::Bytes,
    pub(crate) created_at: chrono::DateTime<chrono::Utc>,
}

/// What a push leased to a waiting pop in its own transaction, given to the pop after commit.
#[derive(Debug, Clone)]
pub(crate) struct HandedOff {
    pub(crate) partition_id: Uuid,
    pub(crate) partition: Arc<str>,
    pub(crate) lease_id: Uuid,
    pub(crate) messages: Vec<HandedMessage>,
}

/// What a pop offering itself for a hand-off can take.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wants {
    /// Most messages.
    pub(crate) batch: i32,
    /// The lease's length when the queue sets no `leaseTime`.
    pub(crate) default_lease_secs: f64,
}

/// A waiting pop a push took out of the registry ([`Wake::reserve`]): the push leases it
/// messages in its transaction and, after commit, sends them. Dropping it unsent lets the pop
/// look for itself again.
pub(crate) struct Reserved {
    pub(crate) group: String,
    pub(crate) wants: Wants,
    pub(crate) to: tokio::sync::oneshot::Sender<HandedOff>,
}

/// Pops offering themselves, per queue name and group, oldest first.
#[derive(Default)]
struct Offers(Mutex<HashMap<String, HashMap<String, VecDeque<Offered>>>>);

struct Offered {
    id: u64,
    wants: Wants,
    to: tokio::sync::oneshot::Sender<HandedOff>,
}

static OFFER_IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A waiting pop's offer to take a push's messages directly (see [`Wake::offer`]). Withdrawn
/// with [`Offer::withdraw`] (or when dropped).
pub(crate) struct Offer<'a> {
    wake: &'a Wake,
    queue: String,
    group: String,
    id: u64,
    rx: Option<tokio::sync::oneshot::Receiver<HandedOff>>,
}

impl Offer<'_> {
    /// Resolves when a push sent messages (`Some`), or when a push that reserved this offer
    /// leased nothing to it (`None`).
    pub(crate) async fn handed(&mut self) -> Option<HandedOff> {
        let Some(rx) = &mut self.rx else {
            return std::future::pending().await;
        };
        let handed = rx.await.ok();
        self.rx = None;
        handed
    }

    /// Takes the offer back. If a push has reserved it already, its transaction may be leasing
    /// messages to this pop right now: waits for its outcome, so nothing is leased to nobody.
    pub(crate) async fn withdraw(mut self) -> Option<HandedOff> {
        if self.wake.offers.remove(&self.queue, &self.group, self.id) {
            return None;
        }
        let rx = self.rx.take()?;
        rx.await.ok()
    }
}

impl Drop for Offer<'_> {
    fn drop(&mut self) {
        // A pop that goes away unanswered (its client left): if a push reserved it, that push
        // finds the receiver gone and gives the lease back.
        self.wake.offers.remove(&self.queue, &self.group, self.id);
    }
}

impl Offers {
    /// Removes the offer `id`; false when it is no longer there (a push reserved it).
    fn remove(&self, queue: &str, group: &str, id: u64) -> bool {
        let mut map = self.0.lock().expect("offers poisoned");
        let Some(groups) = map.get_mut(queue) else {
            return false;
        };
        let Some(offers) = groups.get_mut(group) else {
            return false;
        };
        let before = offers.len();
        offers.retain(|o| o.id != id);
        let removed = offers.len() < before;
        if offers.is_empty() {
            groups.remove(group);
            if groups.is_empty() {
                map.remove(queue);
            }
        }
        removed
    }
}

impl Wake {
    /// Offers a pop of `group` waiting on the whole of `queue` to the pushes of this server:
    /// a push into the queue may lease it messages in its own transaction and send them. Only
    /// for pops that take one partition under a lease of their own, acked explicitly.
    pub(crate) fn offer(&self, queue: &str, group: &str, wants: Wants) -> Offer<'_> {
        let (to, rx) = tokio::sync::oneshot::channel();
        let id = OFFER_IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut map = self.offers.0.lock().expect("offers poisoned");
        map.entry(queue.to_string())
            .or_default()
            .entry(group.to_string())
            .or_default()
            .push_back(Offered { id, wants, to });
        Offer {
            wake: self,
            queue: queue.to_string(),
            group: group.to_string(),
            id,
            rx: Some(rx),
        }
    }

    /// Whether some pop offers itself on `queue` (cheap: one look-up).
    pub(crate) fn has_offers(&self, queue: &str) -> bool {
        let map = self.offers.0.lock().expect("offers poisoned");
        map.contains_key(queue)
    }

    /// Takes the oldest offer of each group of `queue` out of the registry (one pop per group:
    /// a push fans out to every group once).
    pub(crate) fn reserve(&self, queue: &str) -> Vec<Reserved> {
        let mut map = self.offers.0.lock().expect("offers poisoned");
        let Some(groups) = map.get_mut(queue) else {
            return Vec::new();
        };
        let mut out = Vec::with_capacity(groups.len());
        groups.retain(|group, offers| {
            while let Some(o) = offers.pop_front() {
                if o.to.is_closed() {
                    continue;
                }
                out.push(Reserved {
                    group: group.clone(),
                    wants: o.wants,
                    to: o.to,
                });
                break;
            }
            !offers.is_empty()
        });
        if groups.is_empty() {
            map.remove(queue);
        }
        out
    }
}

/// Announces pushed queues to other servers: one `NOTIFY` per [`BROADCAST_EVERY`] at most,
/// outside any push transaction, and none while no other server listens ([`BROADCAST_SQL`]).
/// A failed send is not retried: the waiting pops elsewhere fall back to re-checking on their
/// own timer.
pub(crate) fn start_broadcast(wake: &Wake, pool: deadpool_postgres::Pool) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    if wake.outbox.set(tx).is_err() {
        return;
    }
    let origin = wake.origin;
    let own_relay = relay_name(origin);
    let relays = format!("{RELAY_NAME} %");
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
            let payload = notification(origin, &joined);
            names.clear();
            match pool.get().await {
                Ok(client) => {
                    let sent = async {
                        let statement = client.prepare_cached(BROADCAST_SQL).await?;
                        client
                            .execute(
                                &statement,
                                &[&NOTIFY_CHANNEL, &payload, &own_relay, &relays],
                            )
                            .await
                    }
                    .await;
                    match sent {
                        Ok(0) => crate::metrics::BROADCASTS_UNHEARD.add(1),
                        Ok(_) => crate::metrics::BROADCASTS.add(1),
                        Err(e) => tracing::debug!(error = %e, "push notification not sent"),
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
///
/// The connection goes to the primary (notifications are only sent there) and is pinged every
/// [`PING_EVERY`], so that a primary that went silent or was demoted is noticed and the relay
/// moves to the new one; every cached catalog id is forgotten then too.
pub(crate) async fn relay(database_url: String, wake: Arc<Wake>, on_stale: OnStale) {
    let connector = match crate::db::Connector::new(&database_url) {
        // Named, so that other servers see a listener here ([`BROADCAST_SQL`]).
        Ok(c) => c.named(&relay_name(wake.origin)),
        Err(e) => {
            tracing::error!(error = %e, "push notification relay disabled");
            return;
        }
    };
    loop {
        if let Err(e) = relay_once(&connector, &wake, &on_stale).await {
            tracing::warn!(error = %e, "push notification relay lost its connection; reconnecting");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// How often the relay checks that its connection still reaches a live primary.
const PING_EVERY: Duration = Duration::from_secs(5);

async fn relay_once(
    connector: &crate::db::Connector,
    wake: &Wake,
    on_stale: &OnStale,
) -> Result<(), tokio_postgres::Error> {
    let (client, mut conn) = connector.connect().await?;
    let client = Arc::new(client);
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
    // Whatever was pushed or deleted before this connection listened (while the last one was
    // lost, or before the first) went unheard: let every waiting pop look again, and trust
    // no cached id. Done once listening, so what commits after the pops' new look is heard.
    wake.notify_all();
    on_stale(Stale::All);
    // Pings go out from a task of their own; their failure (silence, a read-only refusal)
    // ends the connection, which the loop below sees.
    let pinger = tokio::spawn({
        let client = client.clone();
        async move {
            loop {
                tokio::time::sleep(PING_EVERY).await;
                if client.simple_query("SELECT 1").await.is_err() {
                    return;
                }
            }
        }
    });
    let _stop_pinger = AbortOnDrop(pinger);
    while let Some(m) = messages.next().await {
        if let AsyncMessage::Notification(n) = m? {
            if n.channel() == CATALOG_CHANNEL {
                on_stale(Stale::Queue(n.payload()));
            } else {
                match pushed_elsewhere(n.payload(), wake.origin) {
                    Pushed::Own => {}
                    Pushed::Everything => wake.notify_all(),
                    Pushed::Queues(queues) => {
                        for queue in queues {
                            wake.notify(queue);
                        }
                    }
                }
            }
        }
    }
    Ok(())
}

/// The payload of a push notification: the sending server's origin on the first line (`@`
/// cannot start a queue name), then the queues pushed, one per line, or `*` for all of them
/// when they would not fit.
fn notification(origin: Uuid, queues: &str) -> String {
    if queues.len() > NOTIFY_MAX {
        format!("@{origin}\n*")
    } else {
        format!("@{origin}\n{queues}")
    }
}

/// What a push notification asks of this server's pops.
#[derive(Debug, PartialEq, Eq)]
enum Pushed<'a> {
    /// This server sent it: its pops already know.
    Own,
    Everything,
    Queues(Vec<&'a str>),
}

/// Reads a push notification; one without an origin line (from an older server) names
/// queues only.
fn pushed_elsewhere(payload: &str, origin: Uuid) -> Pushed<'_> {
    let mut lines = payload.split('\n').peekable();
    if let Some(first) = lines.peek()
        && let Some(sender) = first.strip_prefix('@')
    {
        if sender.parse::<Uuid>() == Ok(origin) {
            return Pushed::Own;
        }
        lines.next();
    }
    let queues: Vec<&str> = lines.collect();
    if queues == ["*"] {
        Pushed::Everything
    } else {
        Pushed::Queues(queues)
    }
}

/// A pop's hold on its group's [`Ready`]; the registry forgets the entry once no hold is
/// left and no lease of it is awaited (see [`Wake::ready`]).
pub(crate) struct ReadyHold<'a> {
    wake: &'a Wake,
    queue: String,
    group: String,
    ready: Arc<Ready>,
}

impl std::ops::Deref for ReadyHold<'_> {
    type Target = Ready;

    fn deref(&self) -> &Ready {
        &self.ready
    }
}

impl Drop for ReadyHold<'_> {
    fn drop(&mut self) {
        let mut map = self.wake.ready.lock().expect("wake registry poisoned");
        // This hold's own reference is still alive here: one beyond the registry's.
        Wake::tidy(&mut map, &self.queue, &self.group, 1);
    }
}

/// A pop listening for pushes to a queue (see [`Wake::listen`]); the queue's entry goes with
/// its last listener.
pub(crate) struct Listening<'a> {
    wake: &'a Wake,
    queue: String,
    rx: watch::Receiver<u64>,
}

impl Listening<'_> {
    /// Fires on the next push to the queue after this listener was made.
    pub(crate) async fn changed(&mut self) {
        // The sender lives in the registry while this receiver does.
        let _ = self.rx.changed().await;
    }
}

impl Drop for Listening<'_> {
    fn drop(&mut self) {
        let mut map = self.wake.queues.lock().expect("wake registry poisoned");
        // New listeners subscribe under this lock, so a count of one is this listener alone.
        if map
            .get(&self.queue)
            .is_some_and(|tx| tx.receiver_count() <= 1)
        {
            map.remove(&self.queue);
        }
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
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
            .expect("woken");
    }

    /// Entries follow their users: a listener's queue and a waiting pop's group are forgotten
    /// when the last of them goes, so names nobody uses any more leave nothing behind.
    #[test]
    fn entries_go_with_their_last_user() {
        let wake = Wake::default();
        let (a, b) = (wake.listen("q"), wake.listen("q"));
        let (r1, r2) = (wake.ready("q", "g"), wake.ready("q", "g"));
        let _other = wake.ready("q2", "g");
        assert_eq!(wake.sizes(), (2, 1));
        drop(a);
        drop(r1);
        assert_eq!(wake.sizes(), (2, 1), "still used");
        drop(b);
        drop(r2);
        assert_eq!(wake.sizes(), (1, 0));
    }

    /// An entry whose partition waits for a lease to end stays while no pop holds it (the
    /// lease's end hands the partition to the next pop), and goes with that end.
    #[test]
    fn an_entry_awaiting_a_lease_end_stays_until_it_ends() {
        let wake = Wake::default();
        let p = Uuid::now_v7();
        let ready = wake.ready("q", "g");
        ready.may_be_blocked(p);
        drop(ready);
        assert_eq!(wake.sizes(), (1, 0), "kept for the lease's end");
        wake.released("q", "g", p, false);
        assert_eq!(wake.sizes(), (0, 0), "gone with it");
    }

    #[tokio::test]
    async fn a_push_wakes_one_waiting_pop_per_partition_and_names_it() {
        let wake = Wake::default();
        let ready = wake.ready("q", "g");
        let (a, b) = (ready.notified(), ready.notified());
        tokio::pin!(a, b);
        a.as_mut().enable();
        b.as_mut().enable();
        let p = Uuid::now_v7();
        wake.pushed("q", &[p, p]);
        tokio::time::timeout(Duration::from_secs(1), &mut a)
            .await
            .expect("the first waiter is woken");
        // One partition (named twice): the second waiter sleeps on.
        assert!(
            tokio::time::timeout(Duration::from_millis(50), &mut b)
                .await
                .is_err()
        );
        assert_eq!(ready.take(4), [p]);
        assert!(ready.take(4).is_empty());
        // Another group of the queue hears of it too; a group of another queue does not.
        let other = wake.ready("q", "h");
        let elsewhere = wake.ready("r", "g");
        wake.pushed("q", &[p]);
        assert_eq!(other.take(1), [p]);
        assert!(elsewhere.take(1).is_empty());
    }

    #[tokio::test]
    async fn an_empty_walk_holds_until_something_unhinted_changes() {
        let wake = Wake::default();
        let ready = wake.ready("q", "g");
        let age = Duration::from_secs(3600);
        assert!(ready.walk_due(age).is_some(), "a group never walked walks");
        let mark = ready.mark();
        ready.walked_empty(mark);
        assert_eq!(ready.walk_due(age), None);
        assert_eq!(
            ready.walk_due(Duration::ZERO),
            Some(WalkDue::Aged),
            "an old empty walk is walked again"
        );
        wake.pushed("q", &[Uuid::now_v7()]);
        assert_eq!(ready.walk_due(age), None, "a push names its partition");
        // A push through another server names only the queue.
        wake.notify("q");
        assert_eq!(ready.walk_due(age), Some(WalkDue::Changed));
        // A walk that began before the change does not hide it.
        let stale = mark;
        ready.walked_empty(stale);
        assert!(ready.walk_due(age).is_some());
        let mark = ready.mark();
        ready.walked_empty(mark);
        let (p, q) = (Uuid::now_v7(), Uuid::now_v7());
        wake.released("q", "g", p, true);
        assert_eq!(ready.walk_due(age), None);
        assert_eq!(ready.take(5).len(), 2, "returned messages are hinted");
        // A completed lease hints its partition only if messages may wait behind it.
        wake.released("q", "g", p, false);
        assert!(ready.take(5).is_empty());
        ready.may_be_blocked(p);
        let first = ready.may_be_blocked(q);
        let second = ready.may_be_blocked(q);
        ready.unblocked(q, first);
        wake.released("q", "g", q, false);
        assert_eq!(ready.take(5), [q], "a later claim's mark stays");
        ready.may_be_blocked(q);
        let last = ready.may_be_blocked(q);
        assert!(last > second);
        ready.unblocked(q, last);
        wake.released("q", "g", q, false);
        wake.released("q", "g", p, false);
        assert_eq!(ready.take(5), [p]);
        wake.released("q", "g", p, false);
        assert!(ready.take(5).is_empty(), "once");
        assert_eq!(ready.take_one(), None);
        wake.notify_all();
        assert!(ready.walk_due(age).is_some());
    }

    #[test]
    fn a_server_ignores_its_own_notifications_and_reads_others() {
        let me = Uuid::new_v4();
        let other = Uuid::new_v4();
        assert_eq!(pushed_elsewhere(&notification(me, "a\nb"), me), Pushed::Own);
        assert_eq!(
            pushed_elsewhere(&notification(other, "a\nb"), me),
            Pushed::Queues(vec!["a", "b"])
        );
        let many = "q".repeat(NOTIFY_MAX + 1);
        assert_eq!(pushed_elsewhere(&notification(me, &many), me), Pushed::Own);
        assert_eq!(
            pushed_elsewhere(&notification(other, &many), me),
            Pushed::Everything
        );
        // An origin line that names no server is skipped; the queues are read.
        assert_eq!(
            pushed_elsewhere("@not-a-server\na", me),
            Pushed::Queues(vec!["a"])
        );
        // From a server that sends no origin.
        assert_eq!(pushed_elsewhere("a\nb", me), Pushed::Queues(vec!["a", "b"]));
        assert_eq!(pushed_elsewhere("*", me), Pushed::Everything);
    }

    #[test]
    fn an_aged_walk_that_found_only_hinted_partitions_counts_as_empty() {
        let wake = Wake::default();
        let ready = wake.ready("q", "g");
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        assert_eq!(
            ready.walk_due(Duration::from_secs(60)),
            Some(WalkDue::Changed)
        );
        ready.walked_empty(ready.mark());
        assert_eq!(ready.walk_due(Duration::from_secs(60)), None);
        assert_eq!(ready.walk_due(Duration::ZERO), Some(WalkDue::Aged));
        wake.pushed("q", &[a]);
        // The walk claimed a partition nobody hinted: more may be there, walk again.
        let mark = ready.mark();
        ready.walked_hinted(mark, &[b]);
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(
            ready.walk_due(Duration::from_millis(1)),
            Some(WalkDue::Aged)
        );
        // The walk claimed the hinted partition: it found nothing new.
        ready.walked_hinted(mark, &[a]);
        assert_eq!(ready.walk_due(Duration::from_secs(60)), None);
        assert_eq!(
            ready.walk_due_or_timer(Duration::from_secs(60), true),
            Some(WalkDue::Aged),
            "a pop whose timer fired walks"
        );
        assert_eq!(
            ready.walk_due_or_timer(Duration::from_secs(60), false),
            None
        );
        // Something unhinted changed meanwhile: the next pop walks.
        wake.notify("q");
        assert_eq!(
            ready.walk_due(Duration::from_secs(60)),
            Some(WalkDue::Changed)
        );
        assert_eq!(
            ready.walk_due_or_timer(Duration::from_secs(60), true),
            Some(WalkDue::Changed),
            "an unnamed change outranks the timer"
        );
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
