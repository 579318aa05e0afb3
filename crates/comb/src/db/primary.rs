//! Which of the servers the URL names is the primary.
//!
//! The URL may name several servers (`postgres://h1,h2,h3/db`, libpq's syntax), as in front of
//! a PostgreSQL managed by Patroni. Comb writes on every route, so a connection is only kept
//! on the primary: each new connection asks its server whether it accepts writes and moves on
//! to the next server when it does not (what `target_session_attrs=read-write` asks of
//! libpq, done whatever the URL says), starting from the server that was the primary last
//! time. The pool, the wake-up relay and maintenance all connect through a [`Connector`], so
//! all of them follow a failover.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures_util::future::BoxFuture;
use tokio_postgres::tls::NoTlsStream;
use tokio_postgres::{NoTls, SimpleQueryMessage};

use super::tls::{Secured, Tls};
use super::unavailable;
use super::watch::{
    Liveness, PROBE_TIMEOUT, SILENCE, Socket, Target, Watched, in_the_clear, io_error, targets,
};

/// A connection to the primary, to be driven by its owner (the pool spawns it; the wake-up
/// relay polls it for notifications).
pub(crate) type Connection = tokio_postgres::Connection<Watched<Secured<Socket>>, NoTlsStream>;

/// One server the URL names, with what is known about whether it answers.
#[derive(Clone)]
pub(super) struct Node {
    pub(super) target: Target,
    pub(super) liveness: Arc<Liveness>,
}

/// Opens connections to whichever server the URL names is the primary now.
pub(crate) struct Connector {
    pub(super) config: tokio_postgres::Config,
    /// TLS as the URL's `sslmode` asks (read by [`Tls::from_url`], not by tokio-postgres).
    tls: Arc<Tls>,
    pub(super) nodes: Vec<Node>,
    /// The node that was the primary at the last connection: tried first.
    preferred: AtomicUsize,
    /// Statements every new connection runs before it is handed out (session settings).
    pub(super) setup: Option<String>,
}

/// What a server said when asked whether it accepts writes.
enum Role {
    Primary,
    ReadOnly,
    Failed(String),
}

impl Connector {
    /// Names its connections (`application_name`), as other sessions see them.
    pub(crate) fn named(mut self, name: &str) -> Connector {
        self.config.application_name(name);
        self
    }

    /// Parses the URL (one or several hosts).
    pub(crate) fn new(database_url: &str) -> Result<Connector, String> {
        let (database_url, tls) = Tls::from_url(database_url)?;
        let config: tokio_postgres::Config = database_url
            .parse()
            .map_err(|e| format!("invalid database URL: {e}"))?;
        let nodes: Vec<Node> = targets(&config)
            .into_iter()
            .map(|target| Node {
                target,
                liveness: Arc::new(Liveness::default()),
            })
            .collect();
        if nodes.is_empty() {
            return Err("the database URL names no host".into());
        }
        Ok(Connector {
            config,
            tls: Arc::new(tls),
            nodes,
            preferred: AtomicUsize::new(0),
            setup: None,
        })
    }

    /// The same database, user, password and TLS settings at one other server, `host:port`
    /// (a Citus worker the coordinator named): what the direct route's pools connect with.
    pub(crate) fn at(&self, host: &str, port: u16) -> Connector {
        Connector {
            config: self.config.clone(),
            tls: self.tls.clone(),
            nodes: vec![Node {
                target: Target::Tcp(host.to_string(), port),
                liveness: Arc::new(Liveness::default()),
            }],
            preferred: AtomicUsize::new(0),
            setup: self.setup.clone(),
        }
    }

    /// Connects to the first server, from the last primary on in the URL's order, that
    /// answers and accepts writes. Fails, saying why of each server, when none does.
    pub(crate) async fn connect(
        &self,
    ) -> Result<(tokio_postgres::Client, Connection), tokio_postgres::Error> {
        let start = self.preferred.load(Ordering::Relaxed);
        let mut why = Vec::new();
        for k in 0..self.nodes.len() {
            let i = (start + k) % self.nodes.len();
            let node = &self.nodes[i];
            if node.liveness.is_down() && !node.liveness.back_again(&node.target) {
                why.push(format!("{}: does not answer", node.target));
                continue;
            }
            let socket = match node.liveness.secured(&node.target, &self.tls).await {
                Ok(s) => s,
                Err(e) => {
                    why.push(format!("{}: {e}", node.target));
                    continue;
                }
            };
            let stream = Watched::new(socket, node.target.clone(), node.liveness.clone());
            let (client, mut conn) =
                match in_the_clear(&self.config).connect_raw(stream, NoTls).await {
                    Ok(c) => c,
                    // A server starting, stopping or full: the next one may be the primary.
                    Err(e) if unavailable(&e) => {
                        why.push(format!("{}: {e}", node.target));
                        continue;
                    }
                    Err(e) => return Err(e),
                };
            match role(&client, &mut conn, self.setup.as_deref()).await {
                Role::Primary => {
                    if i != start {
                        tracing::info!(server = %node.target, "connected to the primary");
                    }
                    self.preferred.store(i, Ordering::Relaxed);
                    return Ok((client, conn));
                }
                Role::ReadOnly => why.push(format!(
                    "{}: read-only (a standby, not the primary)",
                    node.target
                )),
                Role::Failed(e) => why.push(format!("{}: {e}", node.target)),
            }
        }
        let reason = if self.nodes.len() > 1 {
            format!("no primary among the servers: {}", why.join("; "))
        } else {
            why.join("; ")
        };
        match io_error(io::Error::new(io::ErrorKind::NotConnected, reason)).await {
            Ok(e) => Err(e),
            Err(()) => unreachable!("a failing stream cannot connect"),
        }
    }
}

/// Asks a fresh connection whether its server accepts writes and, on the primary, runs
/// `setup`, driving the connection meanwhile (nobody else polls it yet).
async fn role(client: &tokio_postgres::Client, conn: &mut Connection, setup: Option<&str>) -> Role {
    let show = client.simple_query("SHOW transaction_read_only");
    let role = match answered(show, conn).await {
        Ok(rows) => {
            let read_only = rows.iter().find_map(|m| match m {
                SimpleQueryMessage::Row(r) => r.get("transaction_read_only").map(|v| v != "off"),
                _ => None,
            });
            if read_only == Some(false) {
                Role::Primary
            } else {
                Role::ReadOnly
            }
        }
        Err(e) => Role::Failed(e),
    };
    match (role, setup) {
        (Role::Primary, Some(setup)) => match answered(client.batch_execute(setup), conn).await {
            Ok(()) => Role::Primary,
            Err(e) => Role::Failed(e),
        },
        (role, _) => role,
    }
}

/// Waits for `asked`, driving the connection until it answers, within the probe's time.
async fn answered<T>(
    asked: impl std::future::Future<Output = Result<T, tokio_postgres::Error>>,
    conn: &mut Connection,
) -> Result<T, String> {
    futures_util::pin_mut!(asked);
    let driven = async {
        loop {
            tokio::select! {
                r = &mut asked => return r.map_err(|e| e.to_string()),
                m = std::future::poll_fn(|cx| conn.poll_message(cx)) => match m {
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(e.to_string()),
                    None => return Err("connection closed".into()),
                },
            }
        }
    };
    match tokio::time::timeout(SILENCE + PROBE_TIMEOUT, driven).await {
        Ok(r) => r,
        Err(_) => Err("did not answer".into()),
    }
}

/// Opens pooled connections to the primary over [`Watched`] streams.
pub(super) struct PooledConnect(pub(super) Arc<Connector>);

impl deadpool_postgres::Connect for PooledConnect {
    fn connect(
        &self,
        _: &tokio_postgres::Config,
    ) -> BoxFuture<
        '_,
        Result<(tokio_postgres::Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>,
    > {
        Box::pin(async move {
            let (client, connection) = self.0.connect().await?;
            let task = tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::warn!(error = %e, "database connection ended");
                }
            });
            Ok((client, task))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::DbError;

    #[tokio::test]
    async fn a_server_that_refuses_connections_is_skipped_and_its_reason_kept() {
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let connector = Connector::new(&format!(
            "postgres://u@127.0.0.1:{closed},127.0.0.1:{closed}/db"
        ))
        .unwrap();
        assert_eq!(connector.nodes.len(), 2);
        let Err(e) = connector.connect().await else {
            panic!("connected to nothing");
        };
        let why = DbError::from(e);
        assert!(matches!(why, DbError::Unavailable(_)), "{why}");
        assert!(
            why.to_string().contains("no primary among the servers"),
            "{why}"
        );
    }
}
