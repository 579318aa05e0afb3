//! The stable codes of refused requests: the `code` member of every `application/problem+json`
//! answer, one enum so that a code is named, spelled and explained once.
//!
//! Clients branch on these strings, so a code never changes its spelling or its meaning; a new
//! situation gets a new code. `docs/errors.md` lists every code with its sentence, generated
//! from [`Code::ALL`] and checked by this module's test.

/// Declares the codes: each with its variant, its string on the wire and a sentence saying
/// when it is answered.
macro_rules! codes {
    ($($variant:ident $wire:literal $sentence:literal,)*) => {
        /// A stable machine code of a refusal.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(crate) enum Code {
            $(#[doc = $sentence] $variant,)*
        }

        impl Code {
            /// Every code, in the order of `docs/errors.md` and of the OpenAPI document's enum.
            pub(crate) const ALL: &'static [Code] = &[$(Code::$variant,)*];

            /// The code as clients see it.
            pub(crate) fn as_str(self) -> &'static str {
                match self {
                    $(Code::$variant => $wire,)*
                }
            }

            /// When the code is answered, for people.
            pub(crate) fn sentence(self) -> &'static str {
                match self {
                    $(Code::$variant => $sentence,)*
                }
            }
        }
    };
}

codes! {
    // The request's body.
    BodyMissing "body_missing" "The route needs a JSON body and the request has none.",
    BodyTooLarge "body_too_large" "The body exceeds the server's size limit (413); nothing was read further.",
    BodyUnreadable "body_unreadable" "The body could not be read to its end (the connection failed or the encoding is wrong).",
    JsonInvalid "json_invalid" "The body is not well-formed JSON.",
    FieldInvalid "field_invalid" "A member of the body is missing, of the wrong type or out of range; the detail names it.",
    // Routes and parameters.
    RouteNotFound "route_not_found" "No route has this path.",
    MethodNotAllowed "method_not_allowed" "The route exists but does not accept this method (405).",
    ParameterInvalid "parameter_invalid" "A query parameter has a value the route does not accept; the detail names it.",
    ParameterMissing "parameter_missing" "A query parameter the route needs is absent.",
    LimitInvalid "limit_invalid" "`limit` is outside the range a listing allows.",
    OffsetInvalid "offset_invalid" "`offset` is beyond what a listing pages through.",
    RangeInvalid "range_invalid" "A time range whose `from` is not before its `to`.",
    StatusInvalid "status_invalid" "A message status filter that is not pending, processing, completed or dead_letter.",
    // Names and ids.
    QueueNameInvalid "queue_name_invalid" "A queue name that is empty, too long or holds characters names may not hold.",
    PartitionNameInvalid "partition_name_invalid" "A partition name that is empty, too long or holds characters names may not hold.",
    ConsumerGroupInvalid "consumer_group_invalid" "A consumer group name that is empty, too long or holds characters names may not hold.",
    PartitionIdInvalid "partition_id_invalid" "`partitionId` is not a UUID.",
    TransactionIdInvalid "transaction_id_invalid" "`transactionId` is not 1–255 bytes without control characters.",
    LeaseIdInvalid "lease_id_invalid" "`leaseId` is not a UUID.",
    TraceIdInvalid "trace_id_invalid" "`traceId` is longer than its limit or holds control characters.",
    IdsInvalid "ids_invalid" "`ids` holds something other than dead letter ids (UUIDs).",
    IdsTooMany "ids_too_many" "More dead letter ids than one request may name.",
    QueueRequired "queue_required" "A partition filter was given without the queue it belongs to.",
    // Pushes, acks and transactions.
    ItemsEmpty "items_empty" "A push with no message in `items`, or a transaction with no operation (or a push operation with no message).",
    BatchTooLarge "batch_too_large" "More items in one request than the server takes (413).",
    DataTooLarge "data_too_large" "A trace's `data` exceeds its size limit.",
    AckStatusInvalid "ack_status_invalid" "An acknowledgement's status is not completed, failed, retry or dlq.",
    OperationInvalid "operation_invalid" "A transaction operation whose `type` is not ack or push.",
    QueueFull "queue_full" "The push would take the queue past its `maxSize`; retry after consumers catch up (429).",
    QueueDeleted "queue_deleted" "The queue was deleted while the request was in flight; the request may be retried (409).",
    LeaseInvalid "lease_invalid" "The lease named is not the live lease of the partition: it ended, was released or never existed (409).",
    MessageNotDelivered "message_not_delivered" "The acknowledged message was never handed out to this consumer group (409).",
    // Pops and subscriptions.
    SubscriptionModeInvalid "subscription_mode_invalid" "`subscriptionMode` is longer than a name may be or holds control characters.",
    SubscriptionFromInvalid "subscription_from_invalid" "`subscriptionFrom` is neither `now` nor a timestamp.",
    SeekTargetInvalid "seek_target_invalid" "A seek names no target or more than one (end, start, a timestamp).",
    WaitingPopsExhausted "waiting_pops_exhausted" "The server holds its maximum of waiting pops; retry shortly or pop without waiting (429).",
    // Queues, options and administration.
    OptionInvalid "option_invalid" "A queue option has a value out of its range or of the wrong type.",
    OptionUnknown "option_unknown" "A queue option this server does not know.",
    EncryptionUnavailable "encryption_unavailable" "`encryptionEnabled` was asked of a server that holds no encryption key.",
    QueueNotFound "queue_not_found" "The queue named does not exist (404).",
    PartitionNotFound "partition_not_found" "The queue has no partition of that name (404).",
    ConsumerGroupNotFound "consumer_group_not_found" "The consumer group does not read that queue or partition (404).",
    MessageNotFound "message_not_found" "No message with that transaction id in the partition (404).",
    MessageNotFailed "message_not_failed" "A retry of a message that is neither dead-lettered nor failed for any group (409).",
    MessageSettled "message_settled" "The message is already settled by every group reading its partition (409).",
    MaintenanceMode "maintenance_mode" "Pushes are paused by maintenance mode; retry later (503).",
    // Tokens.
    MissingToken "missing_token" "The route needs a bearer token and the request has none (401).",
    InvalidToken "invalid_token" "The bearer token's signature, issuer, audience or lifetime does not hold (401).",
    Forbidden "forbidden" "The token carries no role this server knows, or its role may not use this route (403).",
    QueueForbidden "queue_forbidden" "The token's queue scope does not cover a queue the request touches (403).",
    // The server and its database.
    DatabaseUnavailable "database_unavailable" "The database does not answer or refuses connections; retry shortly (503).",
    DatabaseError "database_error" "The database refused a statement: a defect of the server, not of the request; the cause is in the server's log under the answer's `requestId` (500).",
    UnsupportedOnCluster "unsupported_on_cluster" "The administrative action is not available on a Citus cluster yet (`docs/scale-out.md` lists which); nothing was changed (501).",
    Internal "internal" "The server failed while handling the request: a defect of the server, not of the request; the cause is in the server's log under the answer's `requestId` (500).",
    ShuttingDown "shutting_down" "The server is stopping and takes no new work; retry on another (503).",
    // Streams (Queen's streams SDK).
    QueryIdInvalid "query_id_invalid" "A stream request's `query_id` is not a UUID.",
    StreamQueryInvalid "stream_query_invalid" "A stream query's registration lacks a valid name, source or config hash.",
    StreamQueryNotFound "stream_query_not_found" "No stream query is registered under that id (404).",
    StreamQueryReplaced "stream_query_replaced" "The stream query was registered again under a new id (a reset); register it again to continue (409).",
    StreamConfigChanged "stream_config_changed" "A running stream query was registered with another config hash without asking to reset its state (409).",
    StreamPartitionNotRead "stream_partition_not_read" "The cycle names a partition that is not in the query's source queue.",
    StreamAckMismatch "stream_ack_mismatch" "The cycle's ack names a message that is not among the first unsettled messages of its lease (409).",
    StreamStateTooLarge "stream_state_too_large" "The cycle would make a query's state on one partition larger than the server keeps; nothing was committed.",
    StreamPartitionLeased "stream_partition_leased" "A cycle without an ack would change state while the query's group holds a lease on the partition; the lease holder's cycle comes first (409).",
    StreamStateStale "stream_state_stale" "A cycle without an ack deletes keys of which some are gone already: it was computed from state read before another cycle; nothing was committed (409).",
    StateOpInvalid "state_op_invalid" "A cycle's state operation is malformed: an unknown type, or no key.",
    StateValueTooLarge "state_value_too_large" "A state value is larger than the server keeps (413); nothing was committed.",
    AckInvalid "ack_invalid" "A cycle's ack is malformed: no transaction id, partition or count.",
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::Code;

    fn errors_md() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/errors.md")
    }

    const BEGIN: &str = "<!-- codes:begin (written from crate::code; COMB_WRITE_DOCS=1 cargo test -p comb --lib code) -->";
    const END: &str = "<!-- codes:end -->";

    /// The table of codes as `docs/errors.md` shows it.
    fn table() -> String {
        let mut out = String::from("| Code | When |\n|---|---|\n");
        for c in Code::ALL {
            out.push_str(&format!("| `{}` | {} |\n", c.as_str(), c.sentence()));
        }
        out
    }

    /// `docs/errors.md`, the page that calls the codes stable, lists every code with its
    /// sentence and nothing else.
    #[test]
    fn the_document_lists_every_code() {
        let path = errors_md();
        let mut doc = std::fs::read_to_string(&path).unwrap();
        let (b, e) = (
            doc.find(BEGIN).expect("begin marker"),
            doc.find(END).expect("end marker"),
        );
        let want = format!("{}{BEGIN}\n{}{}", &doc[..b], table(), &doc[e..]);
        if std::env::var_os("COMB_WRITE_DOCS").is_some() {
            std::fs::write(&path, &want).unwrap();
            doc = want.clone();
        }
        let e = doc.find(END).unwrap();
        let missing: Vec<&str> = Code::ALL
            .iter()
            .map(|c| c.as_str())
            .filter(|c| !doc[b..e].contains(&format!("| `{c}` |")))
            .collect();
        assert!(
            missing.is_empty(),
            "codes missing from docs/errors.md: {missing:?}"
        );
        assert!(
            doc == want,
            "docs/errors.md's table is not the codes'; write it again with\n    \
             COMB_WRITE_DOCS=1 cargo test -p comb --lib code"
        );
    }

    #[test]
    fn every_code_is_spelled_once() {
        let mut seen = std::collections::BTreeSet::new();
        for c in Code::ALL {
            assert!(seen.insert(c.as_str()), "{} twice", c.as_str());
            assert!(
                c.as_str()
                    .chars()
                    .all(|ch| ch.is_ascii_lowercase() || ch == '_'),
                "{}",
                c.as_str()
            );
        }
    }
}
