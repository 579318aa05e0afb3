//! Values that have broken servers before: strings, numbers at the edges of integer types,
//! and JSON values of the wrong shape, size or depth.

use serde_json::{Value, json};

use crate::rng::Rng;

/// Strings that have broken servers before.
pub const HOSTILE_STRINGS: &[&str] = &[
    "",
    " ",
    "'",
    "\"",
    "q'uote",
    "dq\"uote",
    "slash/es",
    "../../etc/passwd",
    "back\\slash",
    "'; DROP TABLE comb.messages; --",
    "\" OR 1=1 --",
    "x'); DELETE FROM comb.queues; --",
    "%00",
    "%FF",
    "\u{0}",
    "nul\u{0}inside",
    "line\nbreak",
    "tab\there",
    "\u{7f}",
    "é",
    "😀",
    "\u{202e}rtl",
    "${jndi:ldap://127.0.0.1/x}",
    "NaN",
    "null",
    "true",
    "-1",
    "1e309",
    "00000000-0000-0000-0000-000000000000",
    "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF",
    "not-a-uuid",
    "__QUEUE_MODE__",
    "2026-13-45T99:99:99Z",
    "now",
    "*",
    "\\x00",
];

/// Numbers at and past the edges of every integer type a server might parse into.
pub const HOSTILE_NUMBERS: &[&str] = &[
    "0",
    "-1",
    "1",
    "1.5",
    "-0",
    "1e308",
    "-1e308",
    "1e-320",
    "2147483647",
    "2147483648",
    "-2147483649",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "123456789012345678901234567890",
];

/// One entry of `list`, chosen by `rng`.
pub fn pick_str(rng: &mut Rng, list: &[&'static str]) -> &'static str {
    list[rng.below(list.len() as u64) as usize]
}

/// A JSON value of any type that a server might not expect where it is put.
pub fn hostile_value(rng: &mut Rng) -> Value {
    match rng.below(9) {
        0 => Value::Null,
        1 => Value::Bool(rng.chance(0.5)),
        2 | 3 => Value::String(pick_str(rng, HOSTILE_STRINGS).to_string()),
        4 => serde_json::from_str(pick_str(rng, HOSTILE_NUMBERS)).unwrap_or(Value::Null),
        5 => json!([]),
        6 => json!({}),
        7 => Value::String("x".repeat(1 + rng.below(70_000) as usize)),
        _ => {
            let mut v = json!(1);
            for _ in 0..(1 + rng.below(100)) {
                v = json!([v]);
            }
            v
        }
    }
}
