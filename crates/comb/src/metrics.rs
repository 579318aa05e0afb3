//! Per-process counters and gauges, served by `GET /metrics` in the Prometheus text format.
//!
//! Each server counts only what it did itself, so summing one of these over every server that
//! shares a database gives the cluster's figure (maintenance included: only the leader's
//! counters move). Database-wide figures (queue depth, group lag) are read per scrape by the
//! handler instead, and are the same on every server. Updates are relaxed atomic adds, made once per request or per cycle, never
//! under a lock: a scrape may see one counter a request ahead of another, never a torn value.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A value that only grows (until the process restarts).
#[derive(Debug, Default)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    /// A counter at zero (usable in a `static`).
    pub(crate) const fn new() -> Counter {
        Counter(AtomicU64::new(0))
    }

    pub(crate) fn add(&self, n: u64) {
        if n > 0 {
            self.0.fetch_add(n, Ordering::Relaxed);
        }
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that is set, not added to; an `f64` kept as its bits so it needs no lock.
#[derive(Debug, Default)]
pub(crate) struct Gauge(AtomicU64);

impl Gauge {
    pub(crate) fn set(&self, v: f64) {
        self.0.store(v.to_bits(), Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

/// Upper bounds, in seconds, of the request duration buckets: from a fused push's commit
/// (about a millisecond) to a long poll's wait (up to its timeout).
pub(crate) const DURATION_BUCKETS: [f64; 15] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// How long one route's requests took, from routing to the response's head: a histogram
/// kept as one counter per bucket, so recording is two relaxed adds and never blocks.
#[derive(Debug, Default)]
pub(crate) struct Durations {
    /// Requests per bucket, not cumulative; the last counts those beyond every bound.
    buckets: [Counter; DURATION_BUCKETS.len() + 1],
    sum_us: Counter,
}

impl Durations {
    /// Requests counted so far.
    pub(crate) fn count(&self) -> u64 {
        self.buckets.iter().map(Counter::get).sum()
    }

    /// Counts one request that took `took`.
    pub(crate) fn observe(&self, took: Duration) {
        let secs = took.as_secs_f64();
        let i = DURATION_BUCKETS
            .iter()
            .position(|&le| secs <= le)
            .unwrap_or(DURATION_BUCKETS.len());
        self.buckets[i].0.fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .add(u64::try_from(took.as_micros()).unwrap_or(u64::MAX));
    }
}

/// Where the time of one kind of fused request goes: waiting for a worker, then the
/// worker's turn with the batch. A request's duration minus its wait is its batch's database
/// work plus the HTTP exchange, so these tell a queue in front of the database from a slow
/// database; their counts give the requests per batch.
#[derive(Debug, Default)]
pub(crate) struct Stage {
    /// Per request: from joining its kind's queue until a worker took it into a batch.
    pub(crate) waited: Durations,
    /// Per batch: how long its worker was busy with it. A pop lane is free again once its
    /// claims hold their cursors, so for pops this ends before the claims read and commit.
    pub(crate) ran: Durations,
}

/// The stages of the kinds of fused requests, shared with their workers.
#[derive(Debug, Default)]
pub(crate) struct Fusion {
    pub(crate) push: Arc<Stage>,
    pub(crate) pop: Arc<Stage>,
    pub(crate) ack: Arc<Stage>,
    /// Streams cycles.
    pub(crate) cycle: Arc<Stage>,
}

/// Messages through this server's edge. Counted after the database answered, from the
/// outcomes each request was given, so a refused or failed request counts nothing.
#[derive(Debug, Default)]
pub(crate) struct Messages {
    /// Newly stored by pushes (duplicates of a stored `transactionId` excluded).
    pub(crate) pushed: Counter,
    /// Pushes answered `duplicate`: already stored, nothing written.
    pub(crate) duplicates: Counter,
    /// Handed out by pops, leased or auto-acked.
    pub(crate) popped: Counter,
    /// Acks with status `completed` that were accepted.
    pub(crate) acked: Counter,
    /// Acks with status `failed` that were accepted (retried later or dead-lettered).
    pub(crate) failed: Counter,
    /// Acks with status `retry` that were accepted.
    pub(crate) retried: Counter,
    /// Accepted acks that put their message in the dead-letter queue.
    pub(crate) dead_lettered: Counter,
    /// Messages that exhausted `retryLimit` in queues keeping no dead letters for that
    /// (`deadLetterQueue` or `dlqAfterMaxRetries` false): skipped, by a failed ack or by the
    /// expiry of a lease (noticed by a pop).
    pub(crate) discarded: Counter,
    /// Messages a pop read but could not open (sealed with a key this server lacks, or not
    /// JSON): dead-lettered with `payload_unreadable` instead of handed out.
    pub(crate) unreadable: Counter,
}

impl Messages {
    /// Counts a committed push: messages stored now, and those answered `duplicate`.
    pub(crate) fn stored(&self, queued: u64, duplicates: u64) {
        self.pushed.add(queued);
        self.duplicates.add(duplicates);
    }

    /// Counts the messages a pop hands out.
    pub(crate) fn delivered(&self, n: u64) {
        self.popped.add(n);
    }

    /// Counts the accepted acks of one request.
    pub(crate) fn settled(&self, tally: &Settled) {
        self.acked.add(tally.acked);
        self.failed.add(tally.failed);
        self.retried.add(tally.retried);
        self.dead_lettered.add(tally.dead_lettered);
        self.discarded.add(tally.discarded);
    }
}

/// Accepted acks of one request by what they asked for, counted by the ack module (which
/// knows the statuses) for [`Messages::settled`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Settled {
    pub(crate) acked: u64,
    pub(crate) failed: u64,
    pub(crate) retried: u64,
    pub(crate) dead_lettered: u64,
    pub(crate) discarded: u64,
}

/// Messages this process dead-lettered when leases expired unsettled, counted by
/// `lease::expire_leases` after its transaction commits. A process-wide counter because that
/// function holds no [`Metrics`]: a claim worker calls it on its own connection.
pub(crate) static LEASE_DEAD_LETTERED: Counter = Counter::new();

/// Pops answered with messages a push leased to them in its own transaction
/// (`push::handoff`), and those messages: process-wide, as the push workers hold no
/// [`Metrics`].
pub(crate) static HANDOFFS: Counter = Counter::new();
pub(crate) static HANDED_OFF: Counter = Counter::new();
/// Hand-off leases given back because their pop went away before it was answered.
pub(crate) static HANDOFFS_RELEASED: Counter = Counter::new();
/// Push notifications sent to other servers, and those not sent because no other server's
/// relay was connected (`wake::start_broadcast`).
pub(crate) static BROADCASTS: Counter = Counter::new();
pub(crate) static BROADCASTS_UNHEARD: Counter = Counter::new();
/// Lease extensions by lease id alone that had to look the lease up over every shard on
/// Citus (a lease this server did not grant, or forgot): `lease::extend`.
pub(crate) static LEASE_LOOKUPS_ALL_SHARDS: Counter = Counter::new();

/// What this server's maintenance loop did; everything stays at zero while it is not leader.
#[derive(Debug, Default)]
pub(crate) struct Maintenance {
    pub(crate) leader: Gauge,
    pub(crate) cycles: Counter,
    pub(crate) failures: Counter,
    pub(crate) cycle_seconds: Gauge,
    pub(crate) segments_created: Counter,
    pub(crate) segments_rolled: Counter,
    pub(crate) segments_summarized: Counter,
    pub(crate) segments_dropped: Counter,
    pub(crate) drop_retries: Counter,
    pub(crate) dead_lettered: Counter,
    pub(crate) generations_created: Counter,
    pub(crate) generations_dropped: Counter,
    pub(crate) states_carried: Counter,
}

impl Maintenance {
    /// Marks whether this server holds the leader lock.
    pub(crate) fn set_leader(&self, leader: bool) {
        self.leader.set(if leader { 1.0 } else { 0.0 });
    }
}

/// What this server did per queue since its last per-minute record (`admin::status::record`
/// writes and empties it): the throughput `/status/analytics?queue=` answers with. Keyed by
/// queue name, so it holds at most the queues used within one record's interval.
#[derive(Debug, Default)]
pub(crate) struct PerQueue(std::sync::Mutex<std::collections::HashMap<Arc<str>, QueueCounts>>);

/// One queue's messages through this server, as [`Messages`] counts them for all queues.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QueueCounts {
    pub(crate) pushed: u64,
    pub(crate) popped: u64,
    pub(crate) acked: u64,
    pub(crate) failed: u64,
    pub(crate) dead_lettered: u64,
}

impl QueueCounts {
    fn add(&mut self, other: &QueueCounts) {
        self.pushed += other.pushed;
        self.popped += other.popped;
        self.acked += other.acked;
        self.failed += other.failed;
        self.dead_lettered += other.dead_lettered;
    }
}

impl PerQueue {
    /// Adds `counts` to `queue`'s.
    pub(crate) fn add(&self, queue: &str, counts: QueueCounts) {
        let mut map = self.0.lock().expect("per-queue counters poisoned");
        match map.get_mut(queue) {
            Some(c) => c.add(&counts),
            None => {
                map.insert(Arc::from(queue), counts);
            }
        }
    }

    /// Queues counted since the last record.
    pub(crate) fn len(&self) -> usize {
        self.0.lock().expect("per-queue counters poisoned").len()
    }

    /// Everything counted since the last call, leaving nothing.
    pub(crate) fn take(&self) -> Vec<(Arc<str>, QueueCounts)> {
        let mut map = self.0.lock().expect("per-queue counters poisoned");
        std::mem::take(&mut *map).into_iter().collect()
    }

    /// Puts back what [`PerQueue::take`] gave when it could not be written.
    pub(crate) fn give_back(&self, counts: Vec<(Arc<str>, QueueCounts)>) {
        for (queue, c) in counts {
            self.add(&queue, c);
        }
    }
}

/// Every metric this process keeps in memory; shared by the handlers and maintenance.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    pub(crate) messages: Messages,
    /// The same, per queue, until the next per-minute record.
    pub(crate) queues: PerQueue,
    pub(crate) maintenance: Maintenance,
    pub(crate) fusion: Fusion,
}

impl Metrics {
    /// Appends every metric family kept here to `out`.
    pub(crate) fn render(&self, out: &mut Text) {
        let m = &self.messages;
        out.counter(
            "comb_messages_pushed_total",
            "Messages newly stored by pushes answered by this server.",
            m.pushed.get(),
        );
        out.counter(
            "comb_messages_push_duplicates_total",
            "Pushed messages answered `duplicate`: their transactionId was already stored.",
            m.duplicates.get(),
        );
        out.counter(
            "comb_messages_popped_total",
            "Messages handed out by pops answered by this server.",
            m.popped.get(),
        );
        out.counter(
            "comb_messages_acked_total",
            "Accepted acks with status completed.",
            m.acked.get(),
        );
        out.counter(
            "comb_messages_failed_total",
            "Accepted acks with status failed.",
            m.failed.get(),
        );
        out.counter(
            "comb_messages_retried_total",
            "Accepted acks with status retry.",
            m.retried.get(),
        );
        out.counter(
            "comb_messages_dead_lettered_total",
            "Messages dead-lettered by this server: by acks (status dlq, or failed past retryLimit), by leases that expired unsettled past retryLimit, and by pops that could not open a payload.",
            m.dead_lettered.get() + LEASE_DEAD_LETTERED.get(),
        );
        out.counter(
            "comb_messages_unreadable_total",
            "Messages pops read but could not open (sealed with a key this server does not have, or not JSON), dead-lettered with payload_unreadable instead of handed out.",
            m.unreadable.get(),
        );
        out.counter(
            "comb_messages_discarded_total",
            "Messages that exhausted retryLimit in queues keeping no dead letters for that (deadLetterQueue or dlqAfterMaxRetries false), skipped by this server.",
            m.discarded.get(),
        );

        out.counter(
            "comb_handoffs_total",
            "Waiting pops answered with messages a push on this server leased to them in its own transaction (no claim of their own).",
            HANDOFFS.get(),
        );
        out.counter(
            "comb_handoff_messages_total",
            "Messages handed to waiting pops by pushes on this server (counted in comb_messages_popped_total too).",
            HANDED_OFF.get(),
        );
        out.counter(
            "comb_handoffs_released_total",
            "Hand-off leases given back at once because their pop went away before it was answered.",
            HANDOFFS_RELEASED.get(),
        );
        out.counter(
            "comb_push_notifications_total",
            "Notifications of pushes sent to the other servers of the database (at most one per 10 ms).",
            BROADCASTS.get(),
        );
        out.counter(
            "comb_push_notifications_unsent_total",
            "Notifications of pushes not sent because no other server's relay was connected to the database.",
            BROADCASTS_UNHEARD.get(),
        );
        out.counter(
            "comb_lease_lookups_all_shards_total",
            "Lease extensions by lease id alone that looked the lease up over every shard of a Citus cluster, because this server did not grant it (or no longer remembers it).",
            LEASE_LOOKUPS_ALL_SHARDS.get(),
        );

        let mt = &self.maintenance;
        out.gauge(
            "comb_maintenance_leader",
            "1 while this server holds the maintenance leader lock, else 0.",
            mt.leader.get(),
        );
        out.counter(
            "comb_maintenance_cycles_total",
            "Maintenance cycles this server completed as leader.",
            mt.cycles.get(),
        );
        out.counter(
            "comb_maintenance_failures_total",
            "Maintenance cycles or connections that failed and were retried.",
            mt.failures.get(),
        );
        out.gauge(
            "comb_maintenance_cycle_seconds",
            "Duration of the last maintenance cycle this server completed.",
            mt.cycle_seconds.get(),
        );
        let counters: [(&str, &str, &Counter); 9] = [
            (
                "comb_maintenance_segments_created_total",
                "Message segment tables made ahead of their use.",
                &mt.segments_created,
            ),
            (
                "comb_maintenance_segments_rolled_total",
                "Message segments closed because their period ended.",
                &mt.segments_rolled,
            ),
            (
                "comb_maintenance_segments_summarized_total",
                "Closed message segments summarised (last position of each partition).",
                &mt.segments_summarized,
            ),
            (
                "comb_maintenance_segments_dropped_total",
                "Message segment tables dropped whole.",
                &mt.segments_dropped,
            ),
            (
                "comb_maintenance_drop_retries_total",
                "Drops of segments or generations that did not get their lock in time and wait for the next cycle.",
                &mt.drop_retries,
            ),
            (
                "comb_maintenance_dead_lettered_total",
                "Messages dead-lettered for pending past maxWaitTimeSeconds.",
                &mt.dead_lettered,
            ),
            (
                "comb_maintenance_generations_created_total",
                "Cursor state generation tables made ahead of their use.",
                &mt.generations_created,
            ),
            (
                "comb_maintenance_generations_dropped_total",
                "Cursor state generation tables dropped whole.",
                &mt.generations_dropped,
            ),
            (
                "comb_maintenance_states_carried_total",
                "Cursor states copied into the newest generation from the ones dropped.",
                &mt.states_carried,
            ),
        ];
        for (name, help, c) in counters {
            out.counter(name, help, c.get());
        }

        let f = &self.fusion;
        let kinds: [(&[(&str, &str)], &Stage); 4] = [
            (&[("kind", "push")], &f.push),
            (&[("kind", "pop")], &f.pop),
            (&[("kind", "ack")], &f.ack),
            (&[("kind", "cycle")], &f.cycle),
        ];
        let waited: Vec<_> = kinds.iter().map(|(l, s)| (*l, &s.waited)).collect();
        out.histogram(
            "comb_fused_wait_seconds",
            "Time a push, pop, ack or streams cycle waited for a worker of its kind to take it into a fused batch, by kind.",
            &waited,
        );
        let ran: Vec<_> = kinds.iter().map(|(l, s)| (*l, &s.ran)).collect();
        out.histogram(
            "comb_fused_batch_seconds",
            "How long a worker was busy with one fused batch, by kind (pops: until the lane's next claim may walk). The wait's count over this count is the requests per batch.",
            &ran,
        );
    }
}

/// The exposition text being written: `# HELP` and `# TYPE` before each family's samples.
#[derive(Debug, Default)]
pub(crate) struct Text(String);

/// The `Content-Type` of the text format, version 0.0.4.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

impl Text {
    pub(crate) fn counter(&mut self, name: &str, help: &str, value: u64) {
        self.family(name, help, "counter");
        let _ = writeln!(self.0, "{name} {value}");
    }

    pub(crate) fn gauge(&mut self, name: &str, help: &str, value: f64) {
        self.family(name, help, "gauge");
        self.sample(name, &[], value);
    }

    /// A gauge with one sample per label set, such as connections by state.
    pub(crate) fn gauge_labelled(
        &mut self,
        name: &str,
        help: &str,
        samples: &[(&[(&str, &str)], f64)],
    ) {
        self.family(name, help, "gauge");
        for (labels, value) in samples {
            self.sample(name, labels, *value);
        }
    }

    /// A histogram with one series per label set (cumulative buckets, `+Inf`, sum, count).
    pub(crate) fn histogram(
        &mut self,
        name: &str,
        help: &str,
        series: &[(&[(&str, &str)], &Durations)],
    ) {
        self.family(name, help, "histogram");
        let bucket = format!("{name}_bucket");
        for (labels, d) in series {
            let mut cumulative = 0;
            for (i, b) in d.buckets.iter().enumerate() {
                cumulative += b.get();
                let le = DURATION_BUCKETS
                    .get(i)
                    .map_or_else(|| "+Inf".to_string(), f64::to_string);
                let mut with_le = labels.to_vec();
                with_le.push(("le", &le));
                self.sample(&bucket, &with_le, cumulative as f64);
            }
            self.sample(&format!("{name}_sum"), labels, d.sum_us.get() as f64 / 1e6);
            self.sample(&format!("{name}_count"), labels, cumulative as f64);
        }
    }

    pub(crate) fn finish(self) -> String {
        self.0
    }

    fn family(&mut self, name: &str, help: &str, kind: &str) {
        debug_assert!(valid_name(name), "{name}");
        let help = help.replace('\\', r"\\").replace('\n', r"\n");
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let v = v
                    .replace('\\', r"\\")
                    .replace('"', "\\\"")
                    .replace('\n', r"\n");
                let _ = write!(self.0, "{k}=\"{v}\"");
            }
            self.0.push('}');
        }
        self.0.push(' ');
        if value.is_nan() {
            self.0.push_str("NaN");
        } else if value.is_infinite() {
            self.0.push_str(if value > 0.0 { "+Inf" } else { "-Inf" });
        } else {
            let _ = write!(self.0, "{value}");
        }
        self.0.push('\n');
    }
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_families_with_help_and_type_before_samples() {
        let m = Metrics::default();
        m.messages.pushed.add(3);
        m.maintenance.set_leader(true);
        m.maintenance.segments_dropped.add(2);
        m.maintenance.states_carried.add(7);
        m.maintenance.cycles.add(1);
        m.maintenance.cycle_seconds.set(0.25);
        let mut t = Text::default();
        m.render(&mut t);
        t.gauge_labelled(
            "comb_db_pool_connections",
            "Pool connections by state.",
            &[(&[("state", "idle")], 2.0), (&[("state", "in_use")], 1.0)],
        );
        let text = t.finish();
        assert!(text.contains(
            "# HELP comb_messages_pushed_total Messages newly stored by pushes answered by this server.\n\
             # TYPE comb_messages_pushed_total counter\ncomb_messages_pushed_total 3\n"
        ));
        assert!(text.contains("\ncomb_maintenance_leader 1\n"));
        assert!(text.contains("\ncomb_maintenance_cycles_total 1\n"));
        assert!(text.contains("\ncomb_maintenance_cycle_seconds 0.25\n"));
        assert!(text.contains("\ncomb_maintenance_segments_dropped_total 2\n"));
        assert!(text.contains("\ncomb_maintenance_states_carried_total 7\n"));
        assert!(text.contains("\ncomb_db_pool_connections{state=\"in_use\"} 1\n"));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(valid_name(name) && name.starts_with("comb_"), "{line}");
        }
    }

    #[test]
    fn label_values_and_odd_numbers_are_escaped() {
        let mut t = Text::default();
        t.gauge_labelled(
            "comb_x",
            "a\nb",
            &[
                (&[("q", "a\"b\\c")], f64::INFINITY),
                (&[("q", "n")], f64::NAN),
            ],
        );
        assert_eq!(
            t.finish(),
            "# HELP comb_x a\\nb\n# TYPE comb_x gauge\ncomb_x{q=\"a\\\"b\\\\c\"} +Inf\ncomb_x{q=\"n\"} NaN\n"
        );
    }

    #[test]
    fn histograms_are_cumulative_with_inf_sum_and_count() {
        let d = Durations::default();
        d.observe(Duration::from_micros(300));
        d.observe(Duration::from_millis(3));
        d.observe(Duration::from_millis(4));
        d.observe(Duration::from_secs(60));
        let mut t = Text::default();
        t.histogram("comb_h_seconds", "h.", &[(&[("route", "/r")], &d)]);
        let text = t.finish();
        assert!(text.starts_with("# HELP comb_h_seconds h.\n# TYPE comb_h_seconds histogram\n"));
        for (le, n) in [
            ("0.0005", 1),
            ("0.0025", 1),
            ("0.005", 3),
            ("30", 3),
            ("+Inf", 4),
        ] {
            assert!(
                text.contains(&format!(
                    "comb_h_seconds_bucket{{route=\"/r\",le=\"{le}\"}} {n}\n"
                )),
                "{le}: {text}"
            );
        }
        assert!(
            text.contains("comb_h_seconds_sum{route=\"/r\"} 60.0073\n"),
            "{text}"
        );
        assert!(
            text.contains("comb_h_seconds_count{route=\"/r\"} 4\n"),
            "{text}"
        );
    }
}
