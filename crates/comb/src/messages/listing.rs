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
