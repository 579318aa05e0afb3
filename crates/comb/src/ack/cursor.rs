//! The ack rules: a pure state machine over one (partition, group) cursor.

use uuid::Uuid;

use super::{AckRefusal, AckStatus};
use crate::cursor::Cursor;
use crate::queue::QueueOptions;

/// What applying one ack did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Applied {
    pub(crate) lease_released: bool,
    /// The message must be copied to the dead letters, after this many failed attempts.
    pub(crate) dead_letter: Option<i32>,
    /// The message exhausted `retryLimit` and the queue keeps no dead letters for that: it was
    /// settled without a copy.
    pub(crate) discarded: bool,
}

impl Cursor {
    /// Applies one ack of the message at `pos` (in segment `seg`).
    /// With `strict`, the message must be under the live lease even when no lease id is
    /// given, and acking a settled message is refused: exactly-once pipelines rely on it.
    pub(crate) fn apply(
        &mut self,
        pos: i64,
        seg: i32,
        status: AckStatus,
        lease_id: Option<Uuid>,
        opts: &QueueOptions,
        strict: bool,
    ) -> Result<Applied, AckRefusal> {
        let settled = pos <= self.cursor_pos || self.settled.binary_search(&pos).is_ok();
        if settled && !strict {
            // Already settled: acking again changes nothing and is not an error.
            return Ok(Applied::default());
        }
        let under_live_lease = self.request_lease.is_some() && pos <= self.lease_upto;
        match lease_id {
            Some(l) if self.request_lease != Some(l) || settled => {
                return Err(AckRefusal::LeaseInvalid);
            }
            None if strict && (settled || !under_live_lease) => {
                return Err(AckRefusal::LeaseInvalid);
            }
            _ if pos > self.lease_upto => return Err(AckRefusal::NotDelivered),
            _ => {}
        }
        let mut applied = Applied::default();
        match status {
            AckStatus::Completed => self.settle(pos, seg),
            AckStatus::Retry => self.end_lease(&mut applied),
            AckStatus::Dlq => {
                applied.dead_letter = Some(self.attempts_of(pos));
                self.settle(pos, seg);
            }
            AckStatus::Failed => {
                let attempts = self.attempts_of(pos) + 1;
                if opts.exhausted(attempts) {
                    if opts.dead_letters_exhausted() {
                        applied.dead_letter = Some(attempts);
                    } else {
                        applied.discarded = true;
                    }
                    self.settle(pos, seg);
                } else {
                    self.set_attempts(pos, attempts);
                    self.rest_ms = Some(opts.retry_delay);
                }
                self.end_lease(&mut applied);
            }
        }
        if self.lease_id.is_some() && self.cursor_pos >= self.lease_upto {
            self.end_lease(&mut applied);
        }
        Ok(applied)
    }

    /// Starts judging a new request's acks against the lease as it is now.
    pub(crate) fn begin_request(&mut self) {
        self.request_lease = self.lease_id.filter(|_| self.lease_live);
    }

    /// Ends an expired lease: every message it handed out and nobody settled counts an
    /// attempt; those past the retry limit (their first attempt and `retryLimit` retries all
    /// failed) are dead-lettered (returned with their attempts).
    pub(crate) fn expire(&mut self, opts: &QueueOptions) -> Vec<(i64, i32)> {
        let mut dead = Vec::new();
        for pos in (self.cursor_pos + 1)..=self.lease_upto {
            if pos <= self.cursor_pos || self.settled.binary_search(&pos).is_ok() {
                continue;
            }
            let attempts = self.attempts_of(pos) + 1;
            if opts.exhausted(attempts) {
                dead.push((pos, attempts));
                self.settle(pos, self.cursor_seg);
            } else {
                self.set_attempts(pos, attempts);
            }
        }
        self.lease_id = None;
        self.lease_live = false;
        dead
    }

    /// Failed attempts recorded for `pos`.
    pub(crate) fn attempts_of(&self, pos: i64) -> i32 {
        match self.attempts.binary_search_by_key(&pos, |a| a.0) {
            Ok(i) => self.attempts[i].1,
            Err(_) => 0,
        }
    }

    fn set_attempts(&mut self, pos: i64, n: i32) {
        match self.attempts.binary_search_by_key(&pos, |a| a.0) {
            Ok(i) => self.attempts[i].1 = n,
            Err(i) => self.attempts.insert(i, (pos, n)),
        }
    }

    fn end_lease(&mut self, applied: &mut Applied) {
        if self.lease_id.is_some() {
            applied.lease_released = true;
        }
        self.lease_id = None;
        self.lease_live = false;
    }

    /// Marks `pos` settled and moves the position over the settled run.
    pub(crate) fn settle(&mut self, pos: i64, seg: i32) {
        if let Err(i) = self.settled.binary_search(&pos) {
            self.settled.insert(i, pos);
        }
        let run = self
            .settled
            .iter()
            .enumerate()
            .take_while(|(i, p)| **p == self.cursor_pos + 1 + *i as i64)
            .count();
        if run > 0 {
            self.cursor_pos += run as i64;
            self.settled.drain(..run);
            if pos <= self.cursor_pos {
                self.cursor_seg = self.cursor_seg.max(seg);
            }
            let cut = self.cursor_pos;
            self.attempts.retain(|a| a.0 > cut);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leased(upto: i64) -> (Cursor, Uuid) {
        let lease = Uuid::new_v4();
        (
            Cursor {
                cursor_pos: 0,
                cursor_seg: 1,
                settled: vec![],
                attempts: vec![],
                lease_id: Some(lease),
                lease_live: true,
                request_lease: Some(lease),
                lease_upto: upto,
                rest_ms: None,
            },
            lease,
        )
    }

    fn opts() -> QueueOptions {
        QueueOptions::default()
    }

    #[test]
    fn out_of_order_acks_move_the_position_over_the_settled_run() {
        let (mut c, l) = leased(3);
        c.apply(2, 1, AckStatus::Completed, Some(l), &opts(), false)
            .unwrap();
        assert_eq!(c.cursor_pos, 0);
        assert_eq!(c.settled, vec![2]);
        c.apply(1, 1, AckStatus::Completed, Some(l), &opts(), false)
            .unwrap();
        assert_eq!(c.cursor_pos, 2);
        assert!(c.settled.is_empty());
        let a = c
            .apply(3, 1, AckStatus::Completed, Some(l), &opts(), false)
            .unwrap();
        assert_eq!(c.cursor_pos, 3);
        assert!(a.lease_released, "the whole batch is settled");
        assert_eq!(c.lease_id, None);
    }

    #[test]
    fn failed_between_completed_does_not_move_past_the_failure() {
        let (mut c, l) = leased(3);
        c.apply(1, 1, AckStatus::Completed, Some(l), &opts(), false)
            .unwrap();
        let f = c
            .apply(2, 1, AckStatus::Failed, Some(l), &opts(), false)
            .unwrap();
        assert!(f.lease_released);
        assert_eq!(c.cursor_pos, 1);
        assert_eq!(c.attempts_of(2), 1);
        assert_eq!(c.rest_ms, Some(1000));
        // The rest of the same request still counts against the lease it found…
        c.apply(3, 1, AckStatus::Completed, Some(l), &opts(), false)
            .unwrap();
        assert_eq!(c.cursor_pos, 1, "message 2 still pending");
        assert_eq!(c.settled, vec![3]);
        // …but in a later request the ended lease is no longer valid.
        c.begin_request();
        assert_eq!(
            c.apply(3, 1, AckStatus::Failed, Some(l), &opts(), false),
            Ok(Applied::default()),
            "settled already: a no-op"
        );
        let (mut c, l) = leased(3);
        c.apply(1, 1, AckStatus::Failed, Some(l), &opts(), false)
            .unwrap();
        c.begin_request();
        assert_eq!(
            c.apply(2, 1, AckStatus::Completed, Some(l), &opts(), false),
            Err(AckRefusal::LeaseInvalid)
        );
        // An ack without a lease id still settles a delivered message.
        c.apply(2, 1, AckStatus::Completed, None, &opts(), false)
            .unwrap();
        assert_eq!(c.settled, vec![2]);
    }

    #[test]
    fn retry_limit_dead_letters_and_moves_on() {
        // retryLimit 1: the first attempt and one retry, then a dead letter.
        let o = QueueOptions {
            retry_limit: 1,
            ..opts()
        };
        let (mut c, l) = leased(2);
        let a = c
            .apply(1, 1, AckStatus::Failed, Some(l), &o, false)
            .unwrap();
        assert_eq!(a.dead_letter, None);
        c.lease_id = Some(l);
        c.lease_live = true;
        let a = c
            .apply(1, 1, AckStatus::Failed, Some(l), &o, false)
            .unwrap();
        assert_eq!(a.dead_letter, Some(2));
        assert_eq!(c.cursor_pos, 1);
        assert!(c.attempts.is_empty());
    }

    #[test]
    fn retry_does_not_count() {
        let (mut c, l) = leased(1);
        let a = c
            .apply(1, 1, AckStatus::Retry, Some(l), &opts(), false)
            .unwrap();
        assert!(a.lease_released);
        assert_eq!(c.attempts_of(1), 0);
        assert_eq!(c.rest_ms, None);
        assert_eq!(c.cursor_pos, 0);
    }

    #[test]
    fn dlq_settles_at_once() {
        let (mut c, l) = leased(2);
        let a = c
            .apply(1, 1, AckStatus::Dlq, Some(l), &opts(), false)
            .unwrap();
        assert_eq!(a.dead_letter, Some(0));
        assert_eq!(c.cursor_pos, 1);
        assert!(!a.lease_released, "message 2 is still leased");
    }

    #[test]
    fn wrong_or_expired_lease_is_refused() {
        let (mut c, _) = leased(1);
        assert_eq!(
            c.apply(
                1,
                1,
                AckStatus::Completed,
                Some(Uuid::new_v4()),
                &opts(),
                false
            ),
            Err(AckRefusal::LeaseInvalid)
        );
        let (mut c, l) = leased(1);
        c.lease_live = false;
        c.begin_request();
        assert_eq!(
            c.apply(1, 1, AckStatus::Completed, Some(l), &opts(), false),
            Err(AckRefusal::LeaseInvalid)
        );
    }

    #[test]
    fn undelivered_message_is_refused_and_settled_one_is_a_no_op() {
        let (mut c, l) = leased(1);
        assert_eq!(
            c.apply(5, 1, AckStatus::Completed, None, &opts(), false),
            Err(AckRefusal::NotDelivered)
        );
        c.apply(1, 1, AckStatus::Completed, Some(l), &opts(), false)
            .unwrap();
        assert_eq!(
            c.apply(
                1,
                1,
                AckStatus::Completed,
                Some(Uuid::new_v4()),
                &opts(),
                false
            ),
            Ok(Applied::default())
        );
    }

    #[test]
    fn an_expired_lease_counts_an_attempt_for_each_unsettled_message() {
        let o = QueueOptions {
            retry_limit: 1,
            ..opts()
        };
        let (mut c, l) = leased(3);
        c.apply(2, 1, AckStatus::Completed, Some(l), &o, false)
            .unwrap();
        assert!(c.expire(&o).is_empty());
        assert_eq!(
            (c.attempts_of(1), c.attempts_of(2), c.attempts_of(3)),
            (1, 0, 1)
        );
        assert_eq!(c.lease_id, None);
        // The second expiry passes retryLimit 1: 1 and 3 are dead-lettered, the position moves on.
        c.lease_id = Some(l);
        let dead = c.expire(&o);
        assert_eq!(dead, vec![(1, 2), (3, 2)]);
        assert_eq!(c.cursor_pos, 3);
        assert!(c.settled.is_empty() && c.attempts.is_empty());
    }

    #[test]
    fn strict_acks_need_the_live_lease() {
        let (mut c, l) = leased(2);
        assert_eq!(
            c.apply(1, 1, AckStatus::Completed, None, &opts(), true),
            Ok(Applied::default())
        );
        assert_eq!(c.cursor_pos, 1);
        // Settled already: a transaction may not count it twice.
        assert_eq!(
            c.apply(1, 1, AckStatus::Completed, Some(l), &opts(), true),
            Err(AckRefusal::LeaseInvalid)
        );
        c.lease_live = false;
        c.begin_request();
        assert_eq!(
            c.apply(2, 1, AckStatus::Completed, None, &opts(), true),
            Err(AckRefusal::LeaseInvalid)
        );
    }
}
