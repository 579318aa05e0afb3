//! The cells of the suite: what each one loads and which Comb cell a peer is compared with.
//!
//! Peers run right after the Comb cell they are compared with, so that slow drift of a
//! shared machine affects both sides of a ratio alike.

/// What a cell does.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    /// Closed-loop pushes.
    Push {
        /// Messages per request.
        msgs: usize,
        /// Connections.
        conns: usize,
        /// Partitions the requests are spread over.
        partitions: usize,
    },
    /// Fixed-rate pushes (1 message per request) with explicit-ack consumers.
    Steady {
        /// The offered rate.
        rate: Offered,
        /// Producer connections.
        producers: usize,
        /// Consumer connections.
        consumers: usize,
        /// Pop batch size.
        batch: usize,
        /// Partitions.
        partitions: usize,
    },
    /// Fixed-rate pushes (10 messages per request) read by several consumer groups.
    Fanout {
        /// Offered rate as a fraction of the `push10` cell's rate.
        fraction: f64,
        /// A fixed offered rate instead (msgs/s): light fan-out stays light.
        fixed: Option<f64>,
        /// Consumer groups.
        groups: usize,
        /// Consumer connections per group.
        consumers_per_group: usize,
        /// Producer connections.
        producers: usize,
        /// Pop batch size.
        batch: usize,
        /// Partitions.
        partitions: usize,
    },
    /// Explicit-ack consumers draining a pre-filled queue.
    Pop {
        /// Partitions of the pre-filled queue.
        partitions: usize,
        /// Consumer connections.
        conns: usize,
        /// Pop batch size.
        batch: usize,
    },
    /// Fixed-rate pushes read by streams runners: a tumbling-window count per partition
    /// (one-second windows), each cycle committing its state, the closed windows to a sink
    /// queue and the ack of its batch through `POST /streams/v1/cycle`.
    Streams {
        /// Messages per second, fixed.
        rate: f64,
        /// Partitions.
        partitions: usize,
        /// Runner connections.
        runners: usize,
        /// Pop batch size.
        batch: usize,
    },
    /// Fixed-rate streams cycles changing a few keys of a large or small state
    /// ([`crate::stream_state`]).
    StreamState(crate::stream_state::Spec),
    /// No traffic: consumers long-poll two empty queues, one in queue mode and one read by
    /// several consumer groups, for three times the usual window. What waiting costs.
    Idle {
        /// Queue-mode consumers of the first queue.
        consumers: usize,
        /// Consumer groups of the second queue, one consumer each.
        groups: usize,
        /// The pops' long-poll `timeout`, ms.
        timeout_ms: u64,
    },
    /// Fixed-rate requests that the broker answers without the database (`GET` of a path
    /// no route serves: routing, the middleware and a problem+json answer). What an HTTP
    /// exchange alone costs the broker at that rate: the floor under every request a
    /// queue's clients make.
    Exchange {
        /// Requests per second, fixed.
        rate: f64,
        /// Connections that share the schedule.
        conns: usize,
    },
    /// Queen MQ 1.0's soak shape ([`crate::queen1`]): 200 partitions, pushes of 100 with
    /// transaction ids, pops of up to 1,000 under a lease with asynchronous acks, 256-byte
    /// payloads, 60 s retention, `commit_delay=200`; at the highest rate that keeps up.
    Queen1 {
        /// `encryptionEnabled` on the queue.
        encrypted: bool,
    },
    /// Binary `COPY` of Comb-shaped rows straight into PostgreSQL.
    Ceiling {
        /// Connections.
        conns: usize,
        /// Rows per `COPY`.
        batch: usize,
    },
    /// The SKIP LOCKED table queue.
    SkipLocked {
        /// Enqueue connections.
        enq: usize,
        /// Dequeue connections (0: enqueue alone).
        deq: usize,
        /// Enqueue at this fixed rate (msgs/s) instead of as fast as the connections go.
        rate: Option<f64>,
    },
}

/// The offered rate of a fixed-rate cell.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Offered {
    /// A fraction of the `push1` cell's rate (of this run, else of the baseline).
    OfPush1(f64),
    /// This many messages per second, whatever the machine does: light load stays light.
    Fixed(f64),
}

/// One cell.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    /// Name used in `CELLS=` and in results.
    pub name: &'static str,
    /// What it does.
    pub kind: Kind,
    /// For peers: the Comb cell whose rate is divided by this one's.
    pub compare: Option<&'static str>,
    /// One line for the table's legend and `--list`.
    pub about: &'static str,
}

impl Cell {
    /// `comb`, `ceiling` or `skiplocked`.
    pub fn system(&self) -> &'static str {
        match self.kind {
            Kind::Ceiling { .. } => "ceiling",
            Kind::SkipLocked { .. } => "skiplocked",
            _ => "comb",
        }
    }
}

/// Every cell, in the order they run.
pub fn all() -> Vec<Cell> {
    vec![
        Cell {
            name: "push1",
            kind: Kind::Push {
                msgs: 1,
                conns: 50,
                partitions: 100,
            },
            compare: None,
            about: "push, 1 msg/request, 50 connections, 100 partitions",
        },
        Cell {
            name: "sl-enq",
            kind: Kind::SkipLocked {
                enq: 50,
                deq: 0,
                rate: None,
            },
            compare: Some("push1"),
            about: "SKIP LOCKED table: INSERT 1 row/transaction, 50 connections",
        },
        Cell {
            name: "push10",
            kind: Kind::Push {
                msgs: 10,
                conns: 50,
                partitions: 100,
            },
            compare: None,
            about: "push, 10 msgs/request, 50 connections, 100 partitions",
        },
        Cell {
            name: "push100",
            kind: Kind::Push {
                msgs: 100,
                conns: 50,
                partitions: 100,
            },
            compare: None,
            about: "push, 100 msgs/request, 50 connections, 100 partitions",
        },
        Cell {
            name: "ceiling",
            kind: Kind::Ceiling {
                conns: 4,
                batch: 1_000,
            },
            compare: Some("push100"),
            about: "binary COPY of Comb's rows, 1,000 rows/COPY, 4 connections",
        },
        Cell {
            name: "part10",
            kind: Kind::Push {
                msgs: 1,
                conns: 200,
                partitions: 10,
            },
            compare: None,
            about: "push, 1 msg/request, 200 connections, 10 partitions",
        },
        Cell {
            name: "sl-enq200",
            kind: Kind::SkipLocked {
                enq: 200,
                deq: 0,
                rate: None,
            },
            compare: Some("part10"),
            about: "SKIP LOCKED table: INSERT 1 row/transaction, 200 connections",
        },
        Cell {
            name: "part10k",
            kind: Kind::Push {
                msgs: 1,
                conns: 200,
                partitions: 10_000,
            },
            compare: None,
            about: "push, 1 msg/request, 200 connections, 10,000 partitions",
        },
        Cell {
            name: "light",
            kind: light(100),
            compare: None,
            about: "push 300 msg/s, 1 msg/request, 100 partitions; 4 consumers, pop batch 50 + ack",
        },
        Cell {
            name: "sl-light",
            kind: sl_light(),
            compare: Some("light"),
            about: "SKIP LOCKED table: INSERT 300 rows/s, 4 dequeue connections",
        },
        Cell {
            name: "light-1k",
            kind: light(1_000),
            compare: None,
            about: "the same over 1,000 partitions",
        },
        Cell {
            name: "sl-light-1k",
            kind: sl_light(),
            compare: Some("light-1k"),
            about: "SKIP LOCKED table beside light-1k: INSERT 300 rows/s, 4 dequeue connections",
        },
        Cell {
            name: "light-push",
            kind: Kind::Steady {
                rate: Offered::Fixed(LIGHT_RATE),
                producers: 50,
                consumers: 0,
                batch: 50,
                partitions: 100,
            },
            compare: None,
            about: "light's producers alone, no consumers: what a pushed message costs at 300 msg/s",
        },
        Cell {
            name: "exchange",
            kind: Kind::Exchange {
                rate: LIGHT_EXCHANGES * LIGHT_RATE,
                conns: 50,
            },
            compare: None,
            about: "900 req/s (light's three per message) answered without the database: an HTTP exchange alone",
        },
        Cell {
            name: "steady",
            kind: Kind::Steady {
                rate: Offered::OfPush1(1.0),
                producers: 200,
                consumers: 20,
                batch: 50,
                partitions: 100,
            },
            compare: None,
            about: "push at push1's rate, 1 msg/request; 20 consumers, pop batch 50 + ack",
        },
        Cell {
            name: "steady-half",
            kind: Kind::Steady {
                rate: Offered::OfPush1(0.5),
                producers: 200,
                consumers: 20,
                batch: 50,
                partitions: 100,
            },
            compare: None,
            about: "push at half push1's rate; 20 consumers, pop batch 50 + ack",
        },
        Cell {
            name: "sl-mixed",
            kind: Kind::SkipLocked {
                enq: 50,
                deq: 50,
                rate: None,
            },
            compare: Some("steady"),
            about: "SKIP LOCKED table: 50 enqueue + 50 dequeue connections together",
        },
        Cell {
            name: "fanout",
            kind: Kind::Fanout {
                fraction: 0.1,
                fixed: None,
                groups: 10,
                consumers_per_group: 2,
                producers: 100,
                batch: 50,
                partitions: 100,
            },
            compare: None,
            about: "push at 10% of push10's rate (10 msgs/request); 10 groups x 2 consumers",
        },
        Cell {
            name: "fanout50",
            kind: Kind::Fanout {
                fraction: 0.02,
                fixed: None,
                groups: 50,
                consumers_per_group: 2,
                producers: 100,
                batch: 50,
                partitions: 100,
            },
            compare: None,
            about: "fanout's deliveries over 50 groups: push at 2% of push10's rate; 50 groups x 2 consumers",
        },
        Cell {
            name: "fanout-light",
            kind: Kind::Fanout {
                fraction: 0.0,
                fixed: Some(LIGHT_RATE),
                groups: 10,
                consumers_per_group: 2,
                producers: 50,
                batch: 50,
                partitions: 100,
            },
            compare: None,
            about: "push 300 msg/s (10 msgs/request); 10 groups x 2 consumers",
        },
        Cell {
            name: "idle",
            kind: Kind::Idle {
                consumers: 4,
                groups: 10,
                timeout_ms: 30_000,
            },
            compare: None,
            about: "no traffic: 4 consumers long-poll one queue, 10 groups another (30 s polls), 3x the window",
        },
        Cell {
            name: "pop",
            kind: Kind::Pop {
                partitions: 1_000,
                conns: 50,
                batch: 50,
            },
            compare: None,
            about: "drain a pre-filled queue of 1,000 partitions: 50 consumers, batch 50 + ack",
        },
        Cell {
            name: "streams",
            kind: Kind::Streams {
                rate: 2_000.0,
                partitions: 100,
                runners: 4,
                batch: 50,
            },
            compare: None,
            about: "streams: 1 s tumbling count per partition over 100 partitions at 2,000 msg/s, 4 runners; msg/s = source messages acked by cycles",
        },
        Cell {
            name: "queen1",
            kind: Kind::Queen1 { encrypted: false },
            compare: None,
            about: "Queen 1.0's soak shape: 200 partitions, push 100 with transactionIds, pop <=1000 + async ack, 256 B, 60 s retention, commit_delay=200; at the highest rate kept up",
        },
        Cell {
            name: "queen1-enc",
            kind: Kind::Queen1 { encrypted: true },
            compare: None,
            about: "queen1 with encryptionEnabled (AES-256-GCM at rest)",
        },
        Cell {
            name: crate::stream_state::SMALL,
            kind: Kind::StreamState(crate::stream_state::spec(10)),
            compare: None,
            about: "streams state: 200 cycles/s, each upserting 10 keys of a 10-key state (4 partitions); msg/s = cycles",
        },
        Cell {
            name: crate::stream_state::LARGE,
            kind: Kind::StreamState(crate::stream_state::spec(10_000)),
            compare: None,
            about: "streams state: 200 cycles/s, each upserting 10 keys of a 10,000-key state (4 partitions); msg/s = cycles",
        },
        Cell {
            name: crate::stream_state::LARGE_HOT,
            kind: Kind::StreamState(crate::stream_state::spec_hot(10_000)),
            compare: None,
            about: "streams state: 200 cycles/s, each upserting the same 10 keys of a 10,000-key state (4 partitions); msg/s = cycles",
        },
    ]
}

/// The rate of the light cells: a quiet queue, where what consumers cost while they wait
/// shows.
pub const LIGHT_RATE: f64 = 300.0;

/// HTTP exchanges per message a consumer of `light` receives: the push, the pop that
/// delivers it and the ack.
pub const LIGHT_EXCHANGES: f64 = 3.0;

/// A light cell over `partitions` partitions: [`LIGHT_RATE`] one-message pushes a second, 4
/// consumers popping with long poll (batch 50) and acking.
fn light(partitions: usize) -> Kind {
    Kind::Steady {
        rate: Offered::Fixed(LIGHT_RATE),
        producers: 50,
        consumers: 4,
        batch: 50,
        partitions,
    }
}

/// The SKIP LOCKED peer of a light cell: the same rate, as many dequeuers as the cell has
/// consumers.
fn sl_light() -> Kind {
    Kind::SkipLocked {
        enq: 50,
        deq: 4,
        rate: Some(LIGHT_RATE),
    }
}

/// Picks cells by a comma-separated list of names (empty: all), keeping the suite's order.
pub fn select(list: &str) -> Result<Vec<Cell>, String> {
    let all = all();
    let wanted: Vec<&str> = list
        .split([',', ' '])
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if wanted.is_empty() {
        return Ok(all);
    }
    if let Some(unknown) = wanted.iter().find(|w| !all.iter().any(|c| c.name == **w)) {
        let names: Vec<&str> = all.iter().map(|c| c.name).collect();
        return Err(format!(
            "unknown cell `{unknown}`; cells are: {}",
            names.join(", ")
        ));
    }
    Ok(all
        .into_iter()
        .filter(|c| wanted.contains(&c.name))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selects_subsets_in_suite_order() {
        let picked = select("push100, push1").unwrap();
        let names: Vec<&str> = picked.iter().map(|c| c.name).collect();
        assert_eq!(names, ["push1", "push100"]);
        assert_eq!(select("").unwrap().len(), all().len());
        assert_eq!(select(" , ").unwrap().len(), all().len());
        assert!(select("push1,nope").unwrap_err().contains("nope"));
    }

    #[test]
    fn light_cells_offer_a_fixed_rate_and_their_peers_the_same() {
        let all = all();
        let get = |n: &str| all.iter().find(|c| c.name == n).unwrap().clone();
        for (cell, peer, partitions) in [
            ("light", "sl-light", 100),
            ("light-1k", "sl-light-1k", 1_000),
        ] {
            assert_eq!(
                get(cell).kind,
                Kind::Steady {
                    rate: Offered::Fixed(300.0),
                    producers: 50,
                    consumers: 4,
                    batch: 50,
                    partitions,
                }
            );
            let peer = get(peer);
            assert_eq!(peer.compare, Some(cell));
            assert_eq!(
                peer.kind,
                Kind::SkipLocked {
                    enq: 50,
                    deq: 4,
                    rate: Some(300.0)
                }
            );
            // The peer runs right after its cell.
            let i = all.iter().position(|c| c.name == cell).unwrap();
            assert_eq!(all[i + 1].name, peer.name);
        }
        // Fan-out is offered a tenth of push10's rate.
        assert!(matches!(get("fanout").kind, Kind::Fanout { fraction, .. } if fraction == 0.1));
        // Over 50 groups, the same deliveries in all.
        assert!(matches!(get("fanout50").kind,
            Kind::Fanout { fraction, groups: 50, .. } if fraction * 50.0 == 0.1 * 10.0));
    }

    #[test]
    fn names_are_unique_and_peers_compare_with_earlier_comb_cells() {
        let all = all();
        for (i, c) in all.iter().enumerate() {
            assert_eq!(all.iter().filter(|d| d.name == c.name).count(), 1);
            if let Some(other) = c.compare {
                let j = all.iter().position(|d| d.name == other).unwrap();
                assert!(j < i, "{} compares with a later cell", c.name);
                assert_eq!(all[j].system(), "comb");
                assert_ne!(c.system(), "comb");
            }
        }
    }
}
