//! Queues: what a valid name is, and the options that shape how a queue is consumed.
//!
//! Names are parsed once, at the edge, into [`QueueName`], [`PartitionName`] and
//! [`GroupName`]: each is made only by its validating parser, so a use case that takes one
//! never checks it again and can never be handed text nobody checked. They borrow the text
//! they were parsed from when they can (a push's names stay slices of its body).

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::code::Code;

/// Partition used when a producer names none.
pub(crate) const DEFAULT_PARTITION: &str = "Default";

/// The consumer group shared by consumers that name none: classic competing consumers.
pub(crate) const QUEUE_MODE_GROUP: &str = "__QUEUE_MODE__";

/// Longest queue, partition or group name.
pub(crate) const MAX_NAME_LEN: usize = 255;

/// A queue name is 1–255 characters of `[A-Za-z0-9._:-]`, so it is safe in URLs, logs and metrics.
fn validate_queue_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(format!(
            "queue name must be 1-{MAX_NAME_LEN} characters, got {}",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')))
    {
        return Err(format!(
            "queue name may only contain A-Z a-z 0-9 . _ : - (found {c:?})"
        ));
    }
    Ok(())
}

/// A partition is named by the producer after its own keys (customer, chat, device), so any
/// printable text of 1–255 bytes is accepted; control characters are refused.
fn validate_partition_name(name: &str) -> Result<(), String> {
    validate_free_name("partition", name)
}

/// Consumer group names follow the partition rule, which admits the reserved `__QUEUE_MODE__`.
fn validate_group_name(name: &str) -> Result<(), String> {
    validate_free_name("consumer group", name)
}

fn validate_free_name(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(format!(
            "{what} name must be 1-{MAX_NAME_LEN} bytes, got {}",
            name.len()
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(format!("{what} name must not contain control characters"));
    }
    Ok(())
}

/// Why a name was refused: its code and a sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NameInvalid {
    pub(crate) code: Code,
    pub(crate) message: String,
}

/// Declares a name type: text its validator accepted, borrowed or owned.
macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident, $validate:path, $code:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub(crate) struct $name<'a>(Cow<'a, str>);

        impl<'a> $name<'a> {
            /// The name `text` holds, or why it holds none.
            pub(crate) fn parse(text: impl Into<Cow<'a, str>>) -> Result<Self, NameInvalid> {
                let text = text.into();
                match $validate(&text) {
                    Ok(()) => Ok($name(text)),
                    Err(message) => Err(NameInvalid {
                        code: $code,
                        message,
                    }),
                }
            }

            /// The name as text.
            pub(crate) fn as_str(&self) -> &str {
                &self.0
            }

            /// The name, no longer borrowing what it was parsed from.
            pub(crate) fn into_owned(self) -> $name<'static> {
                $name(Cow::Owned(self.0.into_owned()))
            }
        }

        impl std::ops::Deref for $name<'_> {
            type Target = str;

            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name<'_> {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name<'_> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl Serialize for $name<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        /// Bound as the text it holds, so a statement takes the name itself.
        impl tokio_postgres::types::ToSql for $name<'_> {
            fn to_sql(
                &self,
                ty: &tokio_postgres::types::Type,
                out: &mut bytes::BytesMut,
            ) -> Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>>
            {
                <&str as tokio_postgres::types::ToSql>::to_sql(&&*self.0, ty, out)
            }

            fn accepts(ty: &tokio_postgres::types::Type) -> bool {
                <&str as tokio_postgres::types::ToSql>::accepts(ty)
            }

            tokio_postgres::types::to_sql_checked!();
        }

        /// Parsed as it is read: text that is no such name is a refusal of the whole value.
        impl<'de: 'a, 'a> Deserialize<'de> for $name<'a> {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = Cow::<'a, str>::from(BorrowedText::deserialize(d)?);
                $name::parse(text).map_err(|e| serde::de::Error::custom(e.message))
            }
        }
    };
}

name_type!(
    /// A queue's name: 1–255 characters of `[A-Za-z0-9._:-]` ([`validate_queue_name`]).
    QueueName,
    validate_queue_name,
    Code::QueueNameInvalid
);

name_type!(
    /// A partition's name: 1–255 bytes of printable text ([`validate_partition_name`]).
    PartitionName,
    validate_partition_name,
    Code::PartitionNameInvalid
);

name_type!(
    /// A consumer group's name: 1–255 bytes of printable text ([`validate_group_name`]),
    /// `__QUEUE_MODE__` included.
    GroupName,
    validate_group_name,
    Code::ConsumerGroupInvalid
);

impl GroupName<'static> {
    /// The group of consumers that name none ([`QUEUE_MODE_GROUP`]).
    pub(crate) fn queue_mode() -> Self {
        GroupName(Cow::Borrowed(QUEUE_MODE_GROUP))
    }
}

/// A string read by serde: borrowed from the input when it holds no escapes, else decoded.
struct BorrowedText<'a>(Cow<'a, str>);

impl<'a> From<BorrowedText<'a>> for Cow<'a, str> {
    fn from(t: BorrowedText<'a>) -> Self {
        t.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for BorrowedText<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a str>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = BorrowedText<'a>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }

            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<BorrowedText<'a>, E> {
                Ok(BorrowedText(Cow::Borrowed(v)))
            }

            fn visit_str<E>(self, v: &str) -> Result<BorrowedText<'a>, E> {
                Ok(BorrowedText(Cow::Owned(v.to_owned())))
            }

            fn visit_string<E>(self, v: String) -> Result<BorrowedText<'a>, E> {
                Ok(BorrowedText(Cow::Owned(v)))
            }
        }
        d.deserialize_str(Visit(std::marker::PhantomData))
    }
}

/// Options a user set on a queue. Absent fields keep their current value; the server fills
/// defaults in [`QueueOptions::from_set`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct OptionsSet {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) lease_time: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) retry_limit: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) retry_delay: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) delayed_processing: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) window_buffer: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) retention_seconds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) completed_retention_seconds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_wait_time_seconds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) encryption_enabled: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) priority: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ttl: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) dead_letter_queue: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) dlq_after_max_retries: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) retention_enabled: Option<bool>,
}

/// The option names a queue accepts, as they appear in JSON.
pub(crate) const OPTION_NAMES: &[&str] = &[
    "leaseTime",
    "retryLimit",
    "retryDelay",
    "delayedProcessing",
    "windowBuffer",
    "retentionSeconds",
    "completedRetentionSeconds",
    "maxWaitTimeSeconds",
    "maxSize",
    "encryptionEnabled",
    "priority",
    "ttl",
    "deadLetterQueue",
    "dlqAfterMaxRetries",
    "retentionEnabled",
];

/// Longest lease a pop may take: one week.
pub(crate) const MAX_LEASE_SECONDS: u32 = 7 * 24 * 3600;

impl OptionsSet {
    /// Checks ranges that the types alone do not.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if let Some(t) = self.lease_time
            && !(1..=MAX_LEASE_SECONDS).contains(&t)
        {
            return Err(format!(
                "leaseTime must be between 1 and {MAX_LEASE_SECONDS} seconds"
            ));
        }
        if let Some(r) = self.retry_limit
            && r > 10_000
        {
            return Err("retryLimit must be at most 10000".into());
        }
        if let Some(d) = self.retry_delay
            && d > 7 * 24 * 3600 * 1000
        {
            return Err("retryDelay must be at most one week (in milliseconds)".into());
        }
        Ok(())
    }
}

/// How long a queue keeps its messages, in seconds, 0 for ever (an SQL expression): the
/// function `comb.retention_secs` of the queue's stored options `$options` (an SQL
/// expression), for statements that judge messages by age: the least of `retentionSeconds`
/// and `ttl`, 0 when `retentionEnabled` is false.
macro_rules! retention_secs {
    ($options:literal) => {
        concat!("comb.retention_secs(", $options, ")")
    };
}
pub(crate) use retention_secs;

/// How long a queue keeps messages every group has completed, in seconds, 0 for ever (an SQL
/// expression): the function `comb.completed_retention_secs` of the queue's stored options
/// `$options` (an SQL expression): `completedRetentionSeconds`, 0 when `retentionEnabled` is
/// false.
macro_rules! completed_retention_secs {
    ($options:literal) => {
        concat!("comb.completed_retention_secs(", $options, ")")
    };
}
pub(crate) use completed_retention_secs;

/// Effective options of a queue: what it does now, defaults filled in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct QueueOptions {
    /// Lease length for a pop, in seconds.
    pub(crate) lease_time: u32,
    /// Retries after a failed attempt, as Queen means it: a message is handed out at most
    /// `1 + retry_limit` times, then dead-lettered (see `exhausted`).
    pub(crate) retry_limit: u32,
    /// Wait before a failed message is handed out again, in milliseconds.
    pub(crate) retry_delay: u64,
    /// A message becomes visible this many seconds after its push.
    pub(crate) delayed_processing: u32,
    /// A partition is served only after it has been quiet this many seconds.
    pub(crate) window_buffer: u32,
    /// Messages older than this many seconds are reclaimed (0 keeps them).
    pub(crate) retention_seconds: u64,
    /// Messages every group has passed are reclaimed after this many seconds (0 keeps them).
    pub(crate) completed_retention_seconds: u64,
    /// Messages pending longer than this many seconds are dead-lettered (0 is off).
    pub(crate) max_wait_time_seconds: u64,
    /// Pushes beyond this many pending messages are refused (0 is off).
    pub(crate) max_size: u64,
    /// Payloads encrypted at rest.
    pub(crate) encryption_enabled: bool,
    /// Queen's queue priority: stored and echoed. Comb serves one queue per pop, so it orders
    /// nothing (a consumer of several queues would be served by it).
    pub(crate) priority: i32,
    /// A message not consumed this many seconds after its push expires, like
    /// `retentionSeconds` (0 is off; the shorter of the two applies).
    pub(crate) ttl: u64,
    /// Queen's switch for the dead-letter queue. With this or `dlqAfterMaxRetries` false, a
    /// message that exhausts `retryLimit` is skipped and counted instead of dead-lettered.
    pub(crate) dead_letter_queue: bool,
    /// See `dead_letter_queue`.
    pub(crate) dlq_after_max_retries: bool,
    /// With false, the time-based retention options (`retentionSeconds`,
    /// `completedRetentionSeconds`, `ttl`) are kept but do nothing.
    pub(crate) retention_enabled: bool,
}

impl Default for QueueOptions {
    fn default() -> Self {
        QueueOptions {
            lease_time: 300,
            retry_limit: 3,
            retry_delay: 1000,
            delayed_processing: 0,
            window_buffer: 0,
            retention_seconds: 0,
            completed_retention_seconds: 0,
            max_wait_time_seconds: 0,
            max_size: 0,
            encryption_enabled: false,
            priority: 0,
            ttl: 0,
            dead_letter_queue: true,
            dlq_after_max_retries: true,
            retention_enabled: true,
        }
    }
}

impl QueueOptions {
    /// Effective options from what the user set.
    pub(crate) fn from_set(set: &OptionsSet) -> QueueOptions {
        let d = QueueOptions::default();
        QueueOptions {
            lease_time: set.lease_time.unwrap_or(d.lease_time),
            retry_limit: set.retry_limit.unwrap_or(d.retry_limit),
            retry_delay: set.retry_delay.unwrap_or(d.retry_delay),
            delayed_processing: set.delayed_processing.unwrap_or(d.delayed_processing),
            window_buffer: set.window_buffer.unwrap_or(d.window_buffer),
            retention_seconds: set.retention_seconds.unwrap_or(d.retention_seconds),
            completed_retention_seconds: set
                .completed_retention_seconds
                .unwrap_or(d.completed_retention_seconds),
            max_wait_time_seconds: set.max_wait_time_seconds.unwrap_or(d.max_wait_time_seconds),
            max_size: set.max_size.unwrap_or(d.max_size),
            encryption_enabled: set.encryption_enabled.unwrap_or(d.encryption_enabled),
            priority: set.priority.unwrap_or(d.priority),
            ttl: set.ttl.unwrap_or(d.ttl),
            dead_letter_queue: set.dead_letter_queue.unwrap_or(d.dead_letter_queue),
            dlq_after_max_retries: set.dlq_after_max_retries.unwrap_or(d.dlq_after_max_retries),
            retention_enabled: set.retention_enabled.unwrap_or(d.retention_enabled),
        }
    }

    /// Whether a message that exhausts `retryLimit` goes to the dead-letter queue (else it is
    /// skipped and counted). An explicit `dlq` ack and `maxWaitTimeSeconds` dead-letter
    /// regardless.
    pub(crate) fn dead_letters_exhausted(&self) -> bool {
        self.dead_letter_queue && self.dlq_after_max_retries
    }

    /// Whether a message whose attempts failed this many times (failed acks and leases that
    /// ended unsettled alike) is done: its first attempt and `retryLimit` retries all failed.
    /// Queen's ack procedure retries while its count is below `retryLimit`, so `retryLimit: 1`
    /// hands a message out twice; every comparison with the limit goes through here.
    pub(crate) fn exhausted(&self, failed_attempts: i32) -> bool {
        i64::from(failed_attempts) > i64::from(self.retry_limit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Statements that read an option from a queue's stored JSON fill in its default
    /// themselves (`coalesce((options->>'name')::type, default)`); each must be Rust's.
    #[test]
    fn defaults_written_in_sql_are_the_rust_defaults() {
        let rust = serde_json::to_value(QueueOptions::default()).unwrap();
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut stack = vec![dir];
        let mut seen = 0;
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(d).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                if !path.extension().is_some_and(|e| e == "rs" || e == "sql") {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                let needle = "options->>'";
                let mut rest = text.as_str();
                while let Some(at) = rest.find(needle) {
                    rest = &rest[at + needle.len()..];
                    let name = &rest[..rest.find('\'').unwrap()];
                    // Only defaults written as literals: `)::type, 0)`.
                    let after = &rest[name.len() + 1..];
                    let Some(cast_end) = after.find(')') else {
                        continue;
                    };
                    let tail = &after[cast_end + 1..];
                    let Some(lit) = tail
                        .strip_prefix("::float8, ")
                        .or(tail.strip_prefix("::bigint, "))
                    else {
                        continue;
                    };
                    let lit = &lit[..lit.find(')').unwrap()];
                    let Ok(sql) = lit.trim().parse::<f64>() else {
                        continue;
                    };
                    let want = rust[name].as_f64().unwrap_or_else(|| {
                        panic!(
                            "{}: option {name} has no numeric Rust default",
                            path.display()
                        )
                    });
                    assert_eq!(sql, want, "{}: default of {name}", path.display());
                    seen += 1;
                }
            }
        }
        assert!(seen >= 5, "found only {seen} defaults written in SQL");
    }

    #[test]
    fn names_are_made_only_by_their_parsers() {
        let q = QueueName::parse("orders").unwrap();
        assert_eq!(&*q, "orders");
        assert_eq!(q.to_string(), "orders");
        let e = QueueName::parse("a b").unwrap_err();
        assert_eq!(e.code, Code::QueueNameInvalid);
        assert_eq!(e.message, validate_queue_name("a b").unwrap_err());
        assert_eq!(
            PartitionName::parse("a\nb").unwrap_err().code,
            Code::PartitionNameInvalid
        );
        assert_eq!(
            GroupName::parse(String::new()).unwrap_err().code,
            Code::ConsumerGroupInvalid
        );
        assert_eq!(&*GroupName::queue_mode(), QUEUE_MODE_GROUP);
    }

    #[test]
    fn names_read_by_serde_borrow_and_are_checked() {
        let plain: QueueName = serde_json::from_str(r#""orders""#).unwrap();
        assert!(matches!(plain.0, Cow::Borrowed(_)), "no escapes: borrowed");
        let escaped: QueueName = serde_json::from_str(r#""or\u0064ers""#).unwrap();
        assert!(matches!(escaped.0, Cow::Owned(_)));
        assert_eq!(&*escaped, "orders");
        assert!(serde_json::from_str::<QueueName>(r#""a b""#).is_err());
        assert_eq!(serde_json::to_string(&plain).unwrap(), r#""orders""#);
    }

    #[test]
    fn queue_names() {
        assert!(validate_queue_name("orders").is_ok());
        assert!(validate_queue_name("a.b:c-D9").is_ok());
        assert!(validate_queue_name("").is_err());
        assert!(validate_queue_name(&"x".repeat(256)).is_err());
        assert!(validate_queue_name(&"x".repeat(255)).is_ok());
        assert!(validate_queue_name("my_queue").is_ok());
        for bad in ["a b", "a/b", "a'b", "é", "a;drop"] {
            assert!(validate_queue_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn partition_and_group_names() {
        assert!(validate_partition_name("customer 42/ü").is_ok());
        assert!(validate_partition_name("a\nb").is_err());
        assert!(validate_partition_name("").is_err());
        assert!(validate_group_name(QUEUE_MODE_GROUP).is_ok());
    }

    #[test]
    fn unknown_option_is_refused() {
        let r: Result<OptionsSet, _> = serde_json::from_str(r#"{"priorty": 3}"#);
        assert!(r.is_err());
        let r: Result<OptionsSet, _> = serde_json::from_str(r#"{"priority": 3}"#);
        assert_eq!(r.unwrap().priority, Some(3));
    }

    #[test]
    fn option_names_match_fields() {
        let all = OptionsSet {
            lease_time: Some(1),
            retry_limit: Some(1),
            retry_delay: Some(1),
            delayed_processing: Some(1),
            window_buffer: Some(1),
            retention_seconds: Some(1),
            completed_retention_seconds: Some(1),
            max_wait_time_seconds: Some(1),
            max_size: Some(1),
            encryption_enabled: Some(true),
            priority: Some(1),
            ttl: Some(1),
            dead_letter_queue: Some(true),
            dlq_after_max_retries: Some(true),
            retention_enabled: Some(true),
        };
        let v = serde_json::to_value(&all).unwrap();
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        let mut names = OPTION_NAMES.to_vec();
        keys.sort();
        names.sort();
        assert_eq!(keys, names);
    }
}
