//! Moving consumer group cursors: clearing a queue, seeking a group, editing one partition's
//! cursors. The statements are the cursor's own (`cursor::move_in`, `cursor::edit_in`): a
//! move is a new cursor state version written under the cursor's row lock.

pub use crate::cursor::{Moved, Selection, Target};

use super::Refusal;

/// Moves the selected cursors to `target`, inside the caller's transaction.
pub async fn move_in(
    tx: &deadpool_postgres::Transaction<'_>,
    selection: Selection<'_>,
    target: Target,
) -> Result<Moved, Refusal> {
    Ok(crate::cursor::move_in(tx, selection, target).await?)
}

/// Edits the cursors of one partition (one group, or every group) inside the caller's
/// transaction: `edit` changes a cursor as the ack rules see it and says whether it did.
/// Returns the groups whose cursor changed.
pub async fn edit_in(
    tx: &deadpool_postgres::Transaction<'_>,
    partition: uuid::Uuid,
    group: Option<&str>,
    reset_rest: bool,
    edit: impl FnMut(&str, &mut crate::cursor::Cursor) -> bool,
) -> Result<Vec<String>, Refusal> {
    Ok(crate::cursor::edit_in(tx, partition, group, reset_rest, edit).await?)
}
