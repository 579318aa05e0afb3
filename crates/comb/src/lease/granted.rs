//! The leases this server granted, remembered on Citus so that an extension by the lease id
//! alone (what Queen's clients send) finds its cursors without a look-up over every shard.
//!
//! A lease id names one grant, so what is remembered (its queue, group and partitions) never
//! becomes wrong: it can only end, and the extension itself checks on the partition's worker
//! that the lease is still the cursor's and still live. The map is bounded ([`CAPACITY`],
//! oldest first out) and an entry is dropped once its lease has ended (at grant the end is
//! not known here, so it is kept for [`HORIZON`]; an extension renews it with the new end).
//! Only pops answered by this server add entries, so nothing a client sends grows memory
//! beyond the bound. A lease this server does not remember is looked up over every shard.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// At most this many leases are remembered; the oldest is forgotten first.
const CAPACITY: usize = 65_536;

/// How long a lease is remembered when its end is not known (at grant): a lease held longer
/// is extended, which remembers it again until its new end.
const HORIZON: Duration = Duration::from_secs(3600);

/// One cursor a lease holds.
#[derive(Debug, Clone)]
pub(crate) struct Cursor {
    pub(crate) partition: Uuid,
    pub(crate) group: Arc<str>,
    pub(crate) queue: Arc<str>,
}

struct Entry {
    cursors: Vec<Cursor>,
    until: DateTime<Utc>,
    /// Which record of `order` is this entry's latest.
    stamp: u64,
}

#[derive(Default)]
struct Granted {
    by_lease: HashMap<Uuid, Entry>,
    /// Leases in the order they were remembered, with the stamp they were given.
    order: VecDeque<(Uuid, u64)>,
    next: u64,
}

static GRANTED: LazyLock<Mutex<Granted>> = LazyLock::new(Mutex::default);

impl Granted {
    fn insert(&mut self, lease: Uuid, cursors: Vec<Cursor>, until: DateTime<Utc>, cap: usize) {
        let now = Utc::now();
        while let Some(&(old, stamp)) = self.order.front() {
            let live = self.by_lease.get(&old).filter(|e| e.stamp == stamp);
            match live {
                // A record superseded by a later one of its lease.
                None => {}
                Some(e) if e.until <= now || self.by_lease.len() >= cap => {
                    self.by_lease.remove(&old);
                }
                Some(_) => break,
            }
            self.order.pop_front();
        }
        self.next += 1;
        let stamp = self.next;
        self.by_lease.insert(
            lease,
            Entry {
                cursors,
                until,
                stamp,
            },
        );
        self.order.push_back((lease, stamp));
        // Superseded records are skipped above; keep them from piling up behind a live head.
        if self.order.len() > 2 * cap {
            let by_lease = &self.by_lease;
            self.order
                .retain(|(l, s)| by_lease.get(l).is_some_and(|e| e.stamp == *s));
        }
    }

    fn cursors_of(&mut self, lease: Uuid, partition: Option<Uuid>) -> Option<Vec<Cursor>> {
        let entry = self.by_lease.get(&lease)?;
        if entry.until <= Utc::now() {
            self.by_lease.remove(&lease);
            return None;
        }
        let cursors: Vec<Cursor> = entry
            .cursors
            .iter()
            .filter(|c| partition.is_none_or(|p| c.partition == p))
            .cloned()
            .collect();
        (!cursors.is_empty()).then_some(cursors)
    }
}

/// Remembers the lease a pop of this server was answered with: `queue`'s `group` cursors of
/// `partitions`. Nothing happens off Citus, where the look-up reads one index.
pub(crate) fn granted(
    backend: crate::backend::Backend,
    lease: Uuid,
    queue: &str,
    group: &str,
    partitions: &[Uuid],
) {
    if backend.finds_leases_by_id() || partitions.is_empty() {
        return;
    }
    let (queue, group): (Arc<str>, Arc<str>) = (queue.into(), group.into());
    let cursors = partitions
        .iter()
        .map(|&partition| Cursor {
            partition,
            group: group.clone(),
            queue: queue.clone(),
        })
        .collect();
    let until = Utc::now() + HORIZON;
    lock().insert(lease, cursors, until, CAPACITY);
}

/// Remembers a lease extended now, until its new end.
pub(crate) fn remember(lease: Uuid, cursors: Vec<Cursor>, until: DateTime<Utc>) {
    lock().insert(lease, cursors, until, CAPACITY);
}

/// Forgets a lease found ended.
pub(crate) fn forget(lease: Uuid) {
    lock().by_lease.remove(&lease);
}

/// The cursors of a remembered live lease (those of `partition`, when given), or `None`.
pub(crate) fn cursors_of(lease: Uuid, partition: Option<Uuid>) -> Option<Vec<Cursor>> {
    lock().cursors_of(lease, partition)
}

/// How many leases are remembered (`comb_registry_entries{registry="leases_granted"}`).
pub(crate) fn entries() -> usize {
    lock().by_lease.len()
}

fn lock() -> std::sync::MutexGuard<'static, Granted> {
    GRANTED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cursor(p: Uuid) -> Vec<Cursor> {
        vec![Cursor {
            partition: p,
            group: "g".into(),
            queue: "q".into(),
        }]
    }

    #[test]
    fn remembers_within_its_bound_and_forgets_ended_leases() {
        let mut g = Granted::default();
        let later = Utc::now() + chrono::Duration::seconds(60);
        let leases: Vec<Uuid> = (0..5).map(|_| Uuid::new_v4()).collect();
        let p = Uuid::new_v4();
        for l in &leases {
            g.insert(*l, cursor(p), later, 3);
        }
        assert_eq!(g.by_lease.len(), 3, "bounded");
        assert!(g.cursors_of(leases[0], None).is_none(), "oldest forgotten");
        assert_eq!(g.cursors_of(leases[4], None).unwrap()[0].partition, p);
        assert!(g.cursors_of(leases[4], Some(Uuid::new_v4())).is_none());
        let ended = Uuid::new_v4();
        g.insert(
            ended,
            cursor(p),
            Utc::now() - chrono::Duration::seconds(1),
            3,
        );
        assert!(g.cursors_of(ended, None).is_none(), "an ended lease");
        // Renewing a lease many times keeps one entry and a bounded order.
        for _ in 0..20 {
            g.insert(leases[4], cursor(p), later, 3);
        }
        assert!(g.order.len() <= 6, "{}", g.order.len());
        assert!(g.by_lease.len() <= 3);
    }
}
