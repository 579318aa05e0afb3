//! Transactions sent as one pipeline: `BEGIN`, statements and `COMMIT` written to the
//! connection back to back and answered together, one round trip instead of one per
//! statement.
//!
//! Their rule: every statement in the pipeline is prepared before the pipeline starts.
//! Given SQL text, tokio-postgres first prepares it (sends Parse, then waits for the
//! answer) and only then sends the statement itself; a `COMMIT` already sent behind it
//! would run first, so the statement would run after the transaction, on its own,
//! outside the locks and the atomicity the transaction was for. The types here make the
//! rule a property of the code: [`Pipelined`] and [`Prepared`] accept only a
//! [`Statement`], so text cannot be sent inside a pipeline.

use std::future::Future;

use bytes::Bytes;
use tokio_postgres::types::ToSql;
use tokio_postgres::{CopyInSink, Error, Row, Statement};

/// Runs statements already prepared, and nothing else: what code that sends statements
/// inside a [`Pipelined`] transaction takes (it also runs them in a caller's transaction,
/// where the rule does no harm).
pub(crate) trait Prepared: Sync {
    /// Runs a prepared statement and returns its rows.
    fn query<'a>(
        &'a self,
        statement: &'a Statement,
        params: &'a [&'a (dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send + 'a;

    /// Runs a prepared statement and returns how many rows it changed.
    fn execute<'a>(
        &'a self,
        statement: &'a Statement,
        params: &'a [&'a (dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<u64, Error>> + Send + 'a;
}

/// A caller's transaction runs the same code. (A pooled connection outside a transaction
/// does not: there a statement is sent in a [`Pipelined`] transaction or alone.)
impl Prepared for deadpool_postgres::Transaction<'_> {
    fn query<'a>(
        &'a self,
        statement: &'a Statement,
        params: &'a [&'a (dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send + 'a {
        let pg: &tokio_postgres::Transaction<'_> = self;
        pg.query(statement, params)
    }

    fn execute<'a>(
        &'a self,
        statement: &'a Statement,
        params: &'a [&'a (dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<u64, Error>> + Send + 'a {
        let pg: &tokio_postgres::Transaction<'_> = self;
        pg.execute(statement, params)
    }
}

/// A transaction pipelined on one connection: [`begin`](Pipelined::begin), statements,
/// [`commit`](Pipelined::commit), each future started in that order (`tokio::join!` polls
/// them in order, and each sends its messages when first polled). Statements go through
/// [`Prepared`] or [`copy_in`](Pipelined::copy_in), so each is prepared beforehand. When a
/// statement fails, the ones after it fail too and the pipelined `COMMIT` rolls back; a
/// pipeline that fails before its `COMMIT` is sent ends with [`roll_back`](Pipelined::roll_back).
#[derive(Clone, Copy)]
pub(crate) struct Pipelined<'a> {
    pg: &'a tokio_postgres::Client,
}

impl<'a> Pipelined<'a> {
    /// A pipeline on `pg`, which must be outside any transaction.
    pub(crate) fn on(pg: &'a tokio_postgres::Client) -> Self {
        Pipelined { pg }
    }

    /// Sends `BEGIN`.
    pub(crate) async fn begin(&self) -> Result<(), Error> {
        self.pg.batch_execute("BEGIN").await
    }

    /// Sends a `BEGIN` with settings for the transaction (`BEGIN; SET LOCAL …`): text sent
    /// as one simple query, which nothing prepares.
    pub(crate) async fn begin_with(&self, begin: &'static str) -> Result<(), Error> {
        debug_assert!(begin.starts_with("BEGIN"), "{begin}");
        self.pg.batch_execute(begin).await
    }

    /// Starts a `COPY … FROM STDIN` of binary rows.
    pub(crate) async fn copy_in(&self, statement: &Statement) -> Result<CopyInSink<Bytes>, Error> {
        self.pg.copy_in(statement).await
    }

    /// Sends `COMMIT`.
    pub(crate) async fn commit(&self) -> Result<(), Error> {
        self.pg.batch_execute("COMMIT").await
    }

    /// Ends a transaction that failed before its `COMMIT` was sent (see [`super::roll_back`]).
    pub(crate) async fn roll_back(&self) {
        super::roll_back(self.pg).await
    }
}

impl Prepared for Pipelined<'_> {
    fn query<'a>(
        &'a self,
        statement: &'a Statement,
        params: &'a [&'a (dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send + 'a {
        self.pg.query(statement, params)
    }

    fn execute<'a>(
        &'a self,
        statement: &'a Statement,
        params: &'a [&'a (dyn ToSql + Sync)],
    ) -> impl Future<Output = Result<u64, Error>> + Send + 'a {
        self.pg.execute(statement, params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn connect() -> tokio_postgres::Client {
        let url = tokio::task::spawn_blocking(|| {
            comb_harness::Postgres::shared()
                .create_database("pipeline")
                .unwrap()
        })
        .await
        .unwrap();
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        client
            .batch_execute("CREATE TABLE t (v int)")
            .await
            .unwrap();
        client
    }

    async fn count(pg: &tokio_postgres::Client) -> i64 {
        pg.query_one("SELECT count(*) FROM t", &[])
            .await
            .unwrap()
            .get("count")
    }

    /// The reason for the rule: SQL text sent between `BEGIN` and `ROLLBACK` in one pipeline
    /// is prepared first, so it runs after the transaction ended and stays; a prepared
    /// statement runs inside it and is rolled back with it.
    #[tokio::test]
    async fn only_prepared_statements_run_inside_the_pipeline() {
        let pg = connect().await;
        let (b, inserted, r) = tokio::join!(
            pg.batch_execute("BEGIN"),
            pg.execute("INSERT INTO t VALUES (1)", &[]),
            pg.batch_execute("ROLLBACK"),
        );
        b.unwrap();
        inserted.unwrap();
        r.unwrap();
        assert_eq!(count(&pg).await, 1, "text ran outside the transaction");

        let insert = pg.prepare("INSERT INTO t VALUES (2)").await.unwrap();
        let p = Pipelined::on(&pg);
        let (b, inserted, r) = tokio::join!(
            p.begin(),
            p.execute(&insert, &[]),
            pg.batch_execute("ROLLBACK"),
        );
        b.unwrap();
        inserted.unwrap();
        r.unwrap();
        assert_eq!(count(&pg).await, 1, "the prepared insert was rolled back");
    }

    /// A statement that fails makes the pipelined `COMMIT` roll back what came before it.
    #[tokio::test]
    async fn a_failed_statement_rolls_the_pipeline_back() {
        let pg = connect().await;
        let insert = pg.prepare("INSERT INTO t VALUES (1)").await.unwrap();
        let fail = pg.prepare("SELECT 1 / 0").await.unwrap();
        let p = Pipelined::on(&pg);
        let (b, inserted, failed, c) = tokio::join!(
            p.begin(),
            p.execute(&insert, &[]),
            p.query(&fail, &[]),
            p.commit(),
        );
        b.unwrap();
        inserted.unwrap();
        assert!(failed.is_err());
        // PostgreSQL answers a COMMIT of a failed transaction with ROLLBACK, not an error:
        // callers look at their statements' results.
        c.unwrap();
        assert_eq!(count(&pg).await, 0);
        let (b, inserted, c) = tokio::join!(p.begin(), p.execute(&insert, &[]), p.commit());
        b.unwrap();
        inserted.unwrap();
        c.unwrap();
        assert_eq!(count(&pg).await, 1);
    }
}
