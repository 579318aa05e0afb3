//! Reads of stored messages for the administration, each taking the caller's client.

use tokio_postgres::GenericClient;
use uuid::Uuid;

use crate::db::DbError;

/// Whether the partition holds a message with this transaction id (an index probe).
pub(crate) async fn message_exists(
    client: &impl GenericClient,
    partition: Uuid,
    transaction: &str,
) -> Result<bool, DbError> {
    Ok(client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM comb.messages m
                            WHERE m.transaction_id = $2 AND m.partition_id = $1) AS known",
            &[&partition, &transaction],
        )
        .await?
        .get("known"))
}

// Messages, for the administration.

/// A stored message as the administration shows it.
#[derive(Debug, Clone)]
pub(crate) struct MessageRow {
    pub message_id: Uuid,
    pub transaction_id: String,
    pub partition_id: Uuid,
    pub trace_id: Option<String>,
    pub producer_sub: Option<String>,
    /// The payload as stored (sealed when its queue encrypts).
    pub payload: Vec<u8>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub pos: i64,
}

impl MessageRow {
    pub(crate) fn read(r: &tokio_postgres::Row) -> MessageRow {
        MessageRow {
            message_id: r.get("message_id"),
            transaction_id: r.get("transaction_id"),
            partition_id: r.get("partition_id"),
            trace_id: r.get("trace_id"),
            producer_sub: r.get("producer_sub"),
            payload: r.get("payload"),
            created_at: r.get("created_at"),
            pos: r.get("pos"),
        }
    }
}

/// The newest message of a partition with this transaction id (an index probe).
pub(crate) async fn message_by_transaction(
    client: &impl GenericClient,
    partition: Uuid,
    transaction: &str,
) -> Result<Option<MessageRow>, DbError> {
    Ok(client
        .query_opt(
            "SELECT m.message_id, m.transaction_id, m.partition_id, m.trace_id, m.producer_sub,
                    m.payload, m.created_at, m.pos
             FROM comb.messages m
             WHERE m.transaction_id = $2 AND m.partition_id = $1
             ORDER BY m.pos DESC LIMIT 1",
            &[&partition, &transaction],
        )
        .await?
        .as_ref()
        .map(MessageRow::read))
}
