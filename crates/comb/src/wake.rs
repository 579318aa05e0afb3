//! Wake-ups for waiting pops: a push wakes the pops waiting on its queue on this server at once.
//!
//! Each queue name has a version counter. A pop reads the version before it looks in the
//! database and, if it found nothing, waits for the version to change; a push that commits
//! between the look and the wait has already bumped the version, so no wake-up is lost.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::watch;

/// The wake-up registry of one server.
#[derive(Default)]
pub struct Wake {
    queues: Mutex<HashMap<String, watch::Sender<u64>>>,
}

impl Wake {
    /// A receiver whose `changed()` fires on the next push to `queue`.
    pub fn listen(&self, queue: &str) -> watch::Receiver<u64> {
        let mut map = self.queues.lock().expect("wake registry poisoned");
        let tx = map
            .entry(queue.to_string())
            .or_insert_with(|| watch::channel(0).0);
        let mut rx = tx.subscribe();
        rx.mark_unchanged();
        rx
    }

    /// Wakes every pop waiting on `queue`. Cheap when nobody waits.
    pub fn notify(&self, queue: &str) {
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
    pub fn notify_all(&self) {
        let map = self.queues.lock().expect("wake registry poisoned");
        for tx in map.values() {
            tx.send_modify(|v| *v += 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
