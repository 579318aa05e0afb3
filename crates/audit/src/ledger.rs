//! What the audit saw, and the verdict on it.
//!
//! Every message gets a number that says who pushed it and in which order
//! ([`MessageNumber`]). Producers record which numbers were accepted (answered `queued` or
//! `duplicate`); consumers record every delivery in the order they received them, which of
//! them they deliberately left unsettled (a failed ack, or a consumer that died mid-batch),
//! and when each delivery was settled by a successful ack. [`check`] turns that into exact
//! counts: lost, duplicated and out-of-order messages per consumer group.
//!
//! The checker is pure: it sees only records, so its rules are unit-tested on hand-made
//! histories below.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// How many sequence numbers one producer may use; the rest of a message number names the
/// producer.
pub const PRODUCER_SPAN: u64 = 1_000_000_000;

/// The unique number of one message: `producer * PRODUCER_SPAN + seq`.
///
/// A producer pushes its messages in increasing `seq` and waits for each push to be answered
/// before the next, so within one partition a producer's messages must be stored, and
/// therefore handed out, in increasing number. That is what makes the order check possible
/// without knowing the server's positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageNumber(pub u64);

impl MessageNumber {
    /// The number of `producer`'s `seq`-th message.
    pub fn new(producer: u32, seq: u64) -> MessageNumber {
        assert!(seq < PRODUCER_SPAN, "sequence number {seq} out of range");
        MessageNumber(producer as u64 * PRODUCER_SPAN + seq)
    }

    /// Which producer pushed it.
    pub fn producer(self) -> u32 {
        (self.0 / PRODUCER_SPAN) as u32
    }

    /// Its place in its producer's sequence.
    pub fn seq(self) -> u64 {
        self.0 % PRODUCER_SPAN
    }

    /// The transaction id pushed with it: unique per run, so idempotency never folds two
    /// distinct messages together and a retried push is recognised as the same message.
    pub fn transaction_id(self, run: &str) -> String {
        format!("{run}-{}", self.0)
    }

    /// Reads the number back from a transaction id made by [`MessageNumber::transaction_id`].
    pub fn from_transaction_id(run: &str, id: &str) -> Option<MessageNumber> {
        id.strip_prefix(run)?
            .strip_prefix('-')?
            .parse()
            .ok()
            .map(MessageNumber)
    }
}

/// The name of partition `index` (zero-padded so names sort like numbers).
pub fn partition_name(index: u32) -> String {
    format!("p{index:03}")
}

/// One message handed to a consumer.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Consumer group index.
    pub group: usize,
    /// Partition the server said it came from.
    pub partition: u32,
    pub number: MessageNumber,
    /// The server's message id, to tell a redelivery from a second stored copy.
    pub message_id: String,
    /// When the pop answer arrived.
    pub at: Instant,
    /// The consumer did not settle it on purpose (failed ack, or died holding it): a
    /// redelivery of it is expected, not a duplicate.
    pub abandoned: bool,
    /// When an ack `completed` of this delivery was confirmed.
    pub settled_at: Option<Instant>,
}

/// A fault the scenario injected, for the in-flight bound on duplicates.
#[derive(Debug, Clone)]
pub struct Fault {
    pub name: String,
    pub start: Instant,
    /// When service was back (or the fault ended).
    pub end: Instant,
}

/// Everything recorded during a run.
#[derive(Debug, Default, Clone)]
pub struct History {
    /// Accepted pushes (answered `queued` or `duplicate`) and their partition.
    pub accepted: HashMap<MessageNumber, u32>,
    /// Pushes never answered although the producer retried (may or may not be stored).
    pub unconfirmed: HashMap<MessageNumber, u32>,
    /// Pushes refused with a 4xx that retrying cannot fix: the audit's or the server's bug.
    pub refused: u64,
    /// Deliveries in the order they were received.
    pub deliveries: Vec<Delivery>,
    pub faults: Vec<Fault>,
    /// How many consumer groups read the queue.
    pub groups: usize,
    /// The queue's lease length: a delivery nobody settles is in flight for this long.
    pub lease: Duration,
}

/// The verdict for one consumer group.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GroupCounts {
    /// Accepted messages never delivered to the group.
    pub lost: u64,
    /// Deliveries beyond the first that no deliberate abandonment explains.
    pub duplicated: u64,
    /// First deliveries of a message after a later message of the same producer and
    /// partition had been delivered.
    pub out_of_order: u64,
    /// Accepted messages delivered at least once.
    pub delivered: u64,
    /// All deliveries, redeliveries included.
    pub deliveries: u64,
    /// Redeliveries explained by deliberate failures or consumer deaths.
    pub expected_redeliveries: u64,
    /// Delivered messages that nobody pushed, or came from another partition than pushed.
    pub phantom: u64,
    /// Messages delivered under two different message ids (stored twice).
    pub stored_twice: u64,
    /// Accepted messages whose last delivery was never settled.
    pub unsettled: u64,
    /// A few of those, described, for diagnosis.
    pub unsettled_examples: Vec<String>,
    /// Their partitions.
    pub unsettled_partitions: Vec<u32>,
}

/// The verdict for a run.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    pub accepted: u64,
    pub unconfirmed: u64,
    pub refused: u64,
    pub groups: Vec<GroupCounts>,
    /// Deliveries in flight (delivered, not yet settled) during some fault: the most
    /// duplicates the faults can explain.
    pub in_flight_at_faults: u64,
}

impl Report {
    /// Lost, summed over groups.
    pub fn lost(&self) -> u64 {
        self.groups.iter().map(|g| g.lost).sum()
    }

    /// Duplicated, summed over groups.
    pub fn duplicated(&self) -> u64 {
        self.groups.iter().map(|g| g.duplicated).sum()
    }

    /// Out of order, summed over groups.
    pub fn out_of_order(&self) -> u64 {
        self.groups.iter().map(|g| g.out_of_order).sum()
    }

    /// Everything that makes a run fail, as sentences; empty when it passed.
    ///
    /// Loss, order violations, phantom or twice-stored messages and refused pushes always
    /// fail. Duplicates fail only beyond what was in flight at the faults.
    pub fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (i, g) in self.groups.iter().enumerate() {
            if g.lost > 0 {
                out.push(format!("group {i}: {} accepted messages lost", g.lost));
            }
            if g.out_of_order > 0 {
                out.push(format!(
                    "group {i}: {} delivered out of order",
                    g.out_of_order
                ));
            }
            if g.phantom > 0 {
                out.push(format!("group {i}: {} phantom deliveries", g.phantom));
            }
            if g.stored_twice > 0 {
                out.push(format!(
                    "group {i}: {} messages stored twice",
                    g.stored_twice
                ));
            }
        }
        if self.refused > 0 {
            out.push(format!("{} pushes refused", self.refused));
        }
        if self.duplicated() > self.in_flight_at_faults {
            out.push(format!(
                "{} duplicates, more than the {} messages in flight at faults",
                self.duplicated(),
                self.in_flight_at_faults
            ));
        }
        out
    }

    /// One line per group plus totals, for people.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "accepted {} (unconfirmed {}, refused {}); in flight at faults {}\n",
            self.accepted, self.unconfirmed, self.refused, self.in_flight_at_faults
        );
        for (i, g) in self.groups.iter().enumerate() {
            s.push_str(&format!(
                "group {i}: lost {} duplicated {} out-of-order {} | delivered {} deliveries {} \
                 expected redeliveries {} phantom {} stored twice {} unsettled {}\n",
                g.lost,
                g.duplicated,
                g.out_of_order,
                g.delivered,
                g.deliveries,
                g.expected_redeliveries,
                g.phantom,
                g.stored_twice,
                g.unsettled
            ));
            for e in &g.unsettled_examples {
                s.push_str(&format!("  unsettled: {e}\n"));
            }
        }
        s.push_str(&format!(
            "TOTAL lost {} duplicated {} out-of-order {}: {}",
            self.lost(),
            self.duplicated(),
            self.out_of_order(),
            if self.failures().is_empty() {
                "PASS"
            } else {
                "FAIL"
            }
        ));
        s
    }
}

/// Judges a run.
pub fn check(h: &History) -> Report {
    let mut report = Report {
        accepted: h.accepted.len() as u64,
        unconfirmed: h.unconfirmed.len() as u64,
        refused: h.refused,
        ..Report::default()
    };
    for group in 0..h.groups {
        report.groups.push(check_group(h, group));
    }
    report.in_flight_at_faults = in_flight_at_faults(h);
    report
}

fn check_group(h: &History, group: usize) -> GroupCounts {
    let mut c = GroupCounts::default();
    // Per message: deliveries, deliberate abandonments, ids seen, last delivery settled.
    struct Seen<'a> {
        deliveries: u64,
        abandoned: u64,
        first_id: &'a str,
        last_settled: bool,
        last_at: Instant,
        last_abandoned: bool,
        partition: u32,
    }
    let mut seen: HashMap<MessageNumber, Seen> = HashMap::new();
    let mut twice: HashSet<MessageNumber> = HashSet::new();
    // Per (partition, producer): the highest sequence delivered so far.
    let mut highest: HashMap<(u32, u32), u64> = HashMap::new();
    for d in h.deliveries.iter().filter(|d| d.group == group) {
        c.deliveries += 1;
        let pushed_to = h
            .accepted
            .get(&d.number)
            .or_else(|| h.unconfirmed.get(&d.number));
        if pushed_to != Some(&d.partition) {
            c.phantom += 1;
            continue;
        }
        let first = !seen.contains_key(&d.number);
        let s = seen.entry(d.number).or_insert(Seen {
            deliveries: 0,
            abandoned: 0,
            first_id: &d.message_id,
            last_settled: false,
            last_at: d.at,
            last_abandoned: false,
            partition: d.partition,
        });
        s.last_at = d.at;
        s.last_abandoned = d.abandoned;
        s.deliveries += 1;
        if d.abandoned {
            s.abandoned += 1;
        }
        s.last_settled = d.settled_at.is_some();
        if s.first_id != d.message_id {
            twice.insert(d.number);
        }
        let key = (d.partition, d.number.producer());
        let top = highest.entry(key).or_insert(0);
        if first && *top > d.number.seq() {
            c.out_of_order += 1;
        }
        *top = (*top).max(d.number.seq());
    }
    c.stored_twice = twice.len() as u64;
    for number in h.accepted.keys() {
        match seen.get(number) {
            None => c.lost += 1,
            Some(s) => {
                c.delivered += 1;
                if !s.last_settled {
                    c.unsettled += 1;
                    if c.unsettled_examples.len() < 5 {
                        c.unsettled_partitions.push(s.partition);
                        let since = h.faults.first().map(|f| f.start);
                        c.unsettled_examples.push(format!(
                            "message {} in partition {}: {} deliveries, the last {} ({:.1} s \
                             after the first fault began)",
                            number.0,
                            s.partition,
                            s.deliveries,
                            if s.last_abandoned {
                                "abandoned on purpose"
                            } else {
                                "never acked successfully"
                            },
                            since.map_or(0.0, |t| s
                                .last_at
                                .saturating_duration_since(t)
                                .as_secs_f64()),
                        ));
                    }
                }
            }
        }
    }
    for s in seen.values() {
        let expected = s.abandoned.min(s.deliveries - 1);
        c.expected_redeliveries += expected;
        c.duplicated += s.deliveries - 1 - expected;
    }
    c
}

/// Deliveries that were out with a consumer, not deliberately abandoned, at some moment of
/// some fault: delivered before the fault ended and settled (or, never settled, their lease
/// over) after it began. Counted once per fault they overlap.
fn in_flight_at_faults(h: &History) -> u64 {
    let slack = Duration::from_secs(2);
    let mut n = 0;
    for f in &h.faults {
        for d in h.deliveries.iter().filter(|d| !d.abandoned) {
            let out_until = d.settled_at.unwrap_or(d.at + h.lease + slack);
            if d.at <= f.end && out_until >= f.start {
                n += 1;
            }
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn number(producer: u32, seq: u64) -> MessageNumber {
        MessageNumber::new(producer, seq)
    }

    struct Builder {
        h: History,
        t0: Instant,
        clock: u64,
    }

    impl Builder {
        fn new(groups: usize) -> Builder {
            Builder {
                h: History {
                    groups,
                    lease: Duration::from_secs(5),
                    ..History::default()
                },
                t0: Instant::now(),
                clock: 0,
            }
        }

        fn accept(&mut self, n: MessageNumber, partition: u32) -> &mut Self {
            self.h.accepted.insert(n, partition);
            self
        }

        fn deliver(&mut self, group: usize, n: MessageNumber, abandoned: bool) -> &mut Self {
            self.clock += 1;
            let at = self.t0 + Duration::from_millis(self.clock * 10);
            let partition = self.h.accepted[&n];
            self.h.deliveries.push(Delivery {
                group,
                partition,
                number: n,
                message_id: format!("id-{}", n.0),
                at,
                abandoned,
                settled_at: (!abandoned).then_some(at + Duration::from_millis(1)),
            });
            self
        }
    }

    #[test]
    fn numbers_round_trip_through_transaction_ids() {
        let n = number(7, 123_456);
        assert_eq!(n.producer(), 7);
        assert_eq!(n.seq(), 123_456);
        let t = n.transaction_id("run1");
        assert_eq!(t, "run1-7000123456");
        assert_eq!(MessageNumber::from_transaction_id("run1", &t), Some(n));
        assert_eq!(MessageNumber::from_transaction_id("run2", &t), None);
        assert_eq!(MessageNumber::from_transaction_id("run1", "run1-x"), None);
        assert_eq!(partition_name(7), "p007");
        assert!(number(1, 0) > number(0, PRODUCER_SPAN - 1));
    }

    #[test]
    #[should_panic]
    fn sequence_numbers_cannot_overflow_into_the_producer() {
        number(0, PRODUCER_SPAN);
    }

    #[test]
    fn a_clean_run_passes() {
        let mut b = Builder::new(2);
        for s in 0..5 {
            b.accept(number(0, s), 1).accept(number(1, s), 1);
        }
        for g in 0..2 {
            for s in 0..5 {
                b.deliver(g, number(0, s), false)
                    .deliver(g, number(1, s), false);
            }
        }
        let r = check(&b.h);
        assert!(r.failures().is_empty(), "{}", r.summary());
        assert_eq!(r.groups[0].delivered, 10);
        assert_eq!(r.groups[1].deliveries, 10);
    }

    #[test]
    fn a_message_missing_from_one_group_is_lost_there_only() {
        let mut b = Builder::new(2);
        b.accept(number(0, 0), 0).accept(number(0, 1), 0);
        b.deliver(0, number(0, 0), false)
            .deliver(0, number(0, 1), false)
            .deliver(1, number(0, 1), false);
        let r = check(&b.h);
        assert_eq!(r.groups[0].lost, 0);
        assert_eq!(r.groups[1].lost, 1);
        assert_eq!(r.lost(), 1);
        assert!(!r.failures().is_empty());
    }

    #[test]
    fn unconfirmed_pushes_need_not_arrive_but_may() {
        let mut b = Builder::new(1);
        b.accept(number(0, 0), 0);
        b.h.unconfirmed.insert(number(0, 1), 0);
        b.h.unconfirmed.insert(number(0, 2), 0);
        b.deliver(0, number(0, 0), false);
        b.h.deliveries.push(Delivery {
            group: 0,
            partition: 0,
            number: number(0, 1),
            message_id: "x".into(),
            at: Instant::now(),
            abandoned: false,
            settled_at: Some(Instant::now()),
        });
        let r = check(&b.h);
        assert_eq!(r.lost(), 0);
        assert_eq!(r.groups[0].phantom, 0);
        assert!(r.failures().is_empty(), "{}", r.summary());
    }

    #[test]
    fn a_later_message_first_is_out_of_order_but_a_redelivery_is_not() {
        let mut b = Builder::new(1);
        for s in 0..3 {
            b.accept(number(0, s), 0);
        }
        // 0 failed on purpose, 1 completed, then 0 again: a redelivery, fine.
        b.deliver(0, number(0, 0), true)
            .deliver(0, number(0, 1), false)
            .deliver(0, number(0, 0), false);
        let r = check(&b.h);
        assert_eq!(r.out_of_order(), 0, "{}", r.summary());
        assert_eq!(r.duplicated(), 0);
        assert_eq!(r.groups[0].expected_redeliveries, 1);
        // 2 was skipped: lost for now. When it then arrives first-time after... nothing
        // later was delivered, so still in order.
        assert_eq!(r.lost(), 1);

        let mut b = Builder::new(1);
        for s in 0..3 {
            b.accept(number(0, s), 0);
        }
        b.deliver(0, number(0, 0), false)
            .deliver(0, number(0, 2), false)
            .deliver(0, number(0, 1), false);
        let r = check(&b.h);
        assert_eq!(r.out_of_order(), 1);
        assert_eq!(r.lost(), 0);
        assert!(!r.failures().is_empty());
    }

    #[test]
    fn order_is_per_producer_and_partition() {
        let mut b = Builder::new(1);
        b.accept(number(0, 5), 0)
            .accept(number(1, 1), 0)
            .accept(number(0, 1), 1);
        // Producers interleave freely, and other partitions do not count.
        b.deliver(0, number(0, 5), false)
            .deliver(0, number(1, 1), false)
            .deliver(0, number(0, 1), false);
        let r = check(&b.h);
        assert_eq!(r.out_of_order(), 0, "{}", r.summary());
    }

    #[test]
    fn unexplained_redeliveries_are_duplicates_bounded_by_faults() {
        let mut b = Builder::new(1);
        b.accept(number(0, 0), 0).accept(number(0, 1), 0);
        b.deliver(0, number(0, 0), false)
            .deliver(0, number(0, 0), false)
            .deliver(0, number(0, 1), false);
        let r = check(&b.h);
        assert_eq!(r.duplicated(), 1);
        assert_eq!(r.in_flight_at_faults, 0);
        assert!(
            !r.failures().is_empty(),
            "a duplicate without a fault fails"
        );

        // The same with a fault while the first delivery was out.
        let first = b.h.deliveries[0].at;
        b.h.faults.push(Fault {
            name: "kill".into(),
            start: first,
            end: first + Duration::from_millis(1),
        });
        let r = check(&b.h);
        assert_eq!(r.in_flight_at_faults, 1);
        assert!(r.failures().is_empty(), "{}", r.summary());
    }

    #[test]
    fn a_delivery_never_settled_is_in_flight_until_its_lease_ends() {
        let mut b = Builder::new(1);
        b.accept(number(0, 0), 0);
        b.deliver(0, number(0, 0), false);
        b.h.deliveries[0].settled_at = None;
        let at = b.h.deliveries[0].at;
        let fault = |start: Duration| Fault {
            name: "f".into(),
            start: at + start,
            end: at + start + Duration::from_secs(1),
        };
        b.h.faults = vec![fault(Duration::from_secs(3))];
        assert_eq!(check(&b.h).in_flight_at_faults, 1);
        b.h.faults = vec![fault(Duration::from_secs(30))];
        assert_eq!(check(&b.h).in_flight_at_faults, 0);
        assert_eq!(check(&b.h).groups[0].unsettled, 1);
    }

    #[test]
    fn phantoms_and_second_copies_fail() {
        let mut b = Builder::new(1);
        b.accept(number(0, 0), 0);
        b.deliver(0, number(0, 0), false);
        let mut copy = b.h.deliveries[0].clone();
        copy.message_id = "another".into();
        b.h.deliveries.push(copy);
        let mut stray = b.h.deliveries[0].clone();
        stray.number = number(3, 3);
        b.h.deliveries.push(stray);
        let mut moved = b.h.deliveries[0].clone();
        moved.partition = 9;
        b.h.deliveries.push(moved);
        let r = check(&b.h);
        assert_eq!(r.groups[0].stored_twice, 1);
        assert_eq!(r.groups[0].phantom, 2);
        assert_eq!(r.failures().len(), 3, "{:?}", r.failures());
    }
}
