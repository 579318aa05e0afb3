//! Why the broker refused a request, said once by the use case that refused it.
//!
//! Use cases (push, pop, ack, the catalog…) answer with a [`Refusal`]: what kind of refusal it
//! is, a stable machine code and a sentence for people. The HTTP edge turns the kind into a
//! status code; nothing below the edge knows about HTTP.

use crate::code::Code;
use crate::db::DbError;

/// What kind of refusal, which the edge maps to a status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The request itself is wrong: a value out of range, a missing choice (400).
    Invalid,
    /// The thing named does not exist (404).
    NotFound,
    /// The request conflicts with current state, such as a stale lease (409).
    Conflict,
    /// The queue or the server is full for now; retry later (429).
    Full,
    /// The database or the server cannot take work now; retry shortly (503).
    Unavailable,
    /// Something broke that the client cannot fix (500).
    Internal,
    /// This deployment cannot do what is asked, such as an action not available on a
    /// Citus cluster yet (501).
    Unsupported,
}

/// A refused request: kind, stable code, and what to tell the client.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub(crate) kind: Kind,
    /// Stable, documented, machine-readable.
    pub(crate) code: Code,
    pub(crate) detail: String,
    /// Seconds after which a retry may succeed (for `Full` and `Unavailable`).
    pub(crate) retry_after: Option<u64>,
    /// What went wrong inside (a database's own error text): logged by the edge with the
    /// request's id, never sent to the client.
    pub(crate) cause: Option<String>,
}

impl Refusal {
    /// A refusal of any kind.
    pub(crate) fn new(kind: Kind, code: Code, detail: impl Into<String>) -> Refusal {
        let retry_after = matches!(kind, Kind::Full | Kind::Unavailable).then_some(1);
        Refusal {
            kind,
            code,
            detail: detail.into(),
            retry_after,
            cause: None,
        }
    }

    /// The request itself is wrong.
    pub(crate) fn invalid(code: Code, detail: impl Into<String>) -> Refusal {
        Refusal::new(Kind::Invalid, code, detail)
    }

    /// The thing named does not exist.
    pub(crate) fn not_found(code: Code, detail: impl Into<String>) -> Refusal {
        Refusal::new(Kind::NotFound, code, detail)
    }

    /// The request conflicts with current state.
    pub(crate) fn conflict(code: Code, detail: impl Into<String>) -> Refusal {
        Refusal::new(Kind::Conflict, code, detail)
    }

    /// What is asked cannot be done on this deployment (a Citus cluster, for the
    /// administrative actions `docs/scale-out.md` lists); nothing was changed.
    pub(crate) fn unsupported(code: Code, detail: impl Into<String>) -> Refusal {
        Refusal::new(Kind::Unsupported, code, detail)
    }

    /// Something inside the server failed (a fused batch panicked): a defect, not the
    /// request's fault nor an outage. `cause` goes to the log, not to the client.
    pub(crate) fn internal(cause: impl Into<String>) -> Refusal {
        Refusal {
            cause: Some(cause.into()),
            ..Refusal::new(Kind::Internal, Code::Internal, INTERNAL_DETAIL)
        }
    }

    /// The server is stopping: fused work is no longer taken.
    pub(crate) fn shutting_down() -> Refusal {
        Refusal::new(
            Kind::Unavailable,
            Code::ShuttingDown,
            "the server is shutting down",
        )
    }
}

impl From<&DbError> for Refusal {
    /// The client learns the kind of failure and a stable code; the database's own text (which
    /// names tables, constraints and functions) goes only to the server's log, with the
    /// request's id that the answer carries.
    fn from(e: &DbError) -> Refusal {
        match e {
            DbError::Unavailable(m) => Refusal {
                cause: Some(format!("database unavailable: {m}")),
                ..Refusal::new(
                    Kind::Unavailable,
                    Code::DatabaseUnavailable,
                    "the database is unavailable; retry shortly",
                )
            },
            DbError::Postgres(pg) => {
                let cause = match pg.as_db_error() {
                    Some(db) => {
                        let mut text =
                            format!("{} ({}): {}", db.severity(), db.code().code(), db.message());
                        for (what, part) in [
                            ("detail", db.detail()),
                            ("hint", db.hint()),
                            ("where", db.where_()),
                        ] {
                            if let Some(part) = part {
                                text.push_str(&format!("; {what}: {part}"));
                            }
                        }
                        text
                    }
                    None => pg.to_string(),
                };
                Refusal {
                    cause: Some(cause),
                    ..Refusal::new(Kind::Internal, Code::DatabaseError, INTERNAL_DETAIL)
                }
            }
        }
    }
}

/// What a client is told of an internal failure: nothing of its cause, which the server's
/// log holds under the request's id.
pub(crate) const INTERNAL_DETAIL: &str = "the server could not complete the request; its log holds the cause under this answer's requestId";

impl From<DbError> for Refusal {
    fn from(e: DbError) -> Refusal {
        Refusal::from(&e)
    }
}

impl From<tokio_postgres::Error> for Refusal {
    fn from(e: tokio_postgres::Error) -> Refusal {
        Refusal::from(DbError::from(e))
    }
}

impl From<deadpool_postgres::PoolError> for Refusal {
    fn from(e: deadpool_postgres::PoolError) -> Refusal {
        Refusal::from(DbError::from(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A statement the client itself refuses (a parameter of the wrong type) is a defect of
    /// the server, answered as an internal error — not an outage of the database, which
    /// would make clients retry.
    #[tokio::test]
    async fn a_parameter_the_client_cannot_encode_is_not_a_database_outage() {
        let url = tokio::task::spawn_blocking(|| {
            comb_harness::Postgres::shared()
                .create_database("encode")
                .unwrap()
        })
        .await
        .unwrap();
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        let e = client
            .query_one("SELECT $1::int4", &[&1_i64])
            .await
            .expect_err("an i64 for an int4 parameter");
        let e = DbError::from(e);
        assert!(matches!(e, DbError::Postgres(_)), "{e}");
        let r = Refusal::from(&e);
        assert_eq!((r.kind, r.code), (Kind::Internal, Code::DatabaseError));
    }

    #[test]
    fn only_refusals_worth_retrying_say_when() {
        assert_eq!(Refusal::shutting_down().retry_after, Some(1));
        assert_eq!(
            Refusal::new(Kind::Full, Code::QueueFull, "").retry_after,
            Some(1)
        );
        assert_eq!(
            Refusal::not_found(Code::QueueNotFound, "").retry_after,
            None
        );
        assert_eq!(Refusal::conflict(Code::LeaseInvalid, "").retry_after, None);
    }
}
