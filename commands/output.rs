//! Output pieces every command shares, so tables and times read the same
//! in each command's human and JSON output.

use std::borrow::Cow;

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{ContentArrangement, Table};
use saguin_format::f21::time::format_unix_nanos;
use serde_json::{json, Value};

/// An empty table in the style every human summary uses.
pub fn table() -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Disabled);
    t
}

/// A Unix-nanosecond time as RFC 3339, `-` when unset (0).
pub fn time_text(nanos: i64) -> String {
    if nanos == 0 {
        "-".into()
    } else {
        format_unix_nanos(nanos)
    }
}

/// A Unix-nanosecond time as an RFC 3339 string, `null` when unset (0).
pub fn time_json(nanos: i64) -> Value {
    if nanos == 0 {
        Value::Null
    } else {
        json!(format_unix_nanos(nanos))
    }
}

/// Text from a client or a file (a client id, topic, filter, user property,
/// principal) made safe to print on a terminal: every control character -
/// C0 (ESC, a line break), DEL and C1 - as a Rust escape (`\u{1b}`, `\n`),
/// and the backslash itself doubled so an escape cannot be forged. An ESC
/// sequence in a topic would otherwise clear or rewrite the operator's
/// screen. Human output only: JSON output carries the text exactly
/// (serde_json escapes control characters itself).
pub fn escaped(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| c.is_control() || c == '\\') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// [`escaped`], owned, for a table cell.
pub fn cell(text: &str) -> String {
    escaped(text).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_plain_text_is_borrowed() {
        assert!(matches!(escaped("sensors/17/temp"), Cow::Borrowed(_)));
        assert_eq!(escaped("a\u{1b}[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(escaped("line\nbreak\ttab"), "line\\nbreak\\ttab");
        assert_eq!(escaped("c1\u{9b}x\u{7f}"), "c1\\u{9b}x\\u{7f}");
        assert_eq!(escaped("back\\slash"), "back\\\\slash");
        assert_eq!(escaped("température/°C"), "température/°C");
    }
}
